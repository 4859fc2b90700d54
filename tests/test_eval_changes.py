"""What ``fastci eval`` evaluates: commits, ranges, patch files; the worktree's diffs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fastci.eval.changes import fault_seed, patch_title, resolve
from fastci.eval.workspace import Worktree, WorkspaceError, parse_changed_lines
from selection_support import Repo


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "r"
    repo = Repo(root)
    for n in range(3):
        repo.commit({"a.py": "".join(f"x{i} = {i}\n" for i in range(n + 3))}, msg=f"c{n}")
    return root


def test_commits_and_ranges_each_against_their_parent(repo: Path) -> None:
    shas = _git(repo, "rev-list", "--reverse", "HEAD").split()
    got = resolve(repo, ["HEAD~2..HEAD"])
    assert [c.commit for c in got] == shas[1:]
    assert [c.base for c in got] == shas[:2]
    assert [c.title for c in got] == ["c1", "c2"] and all(c.kind == "commit" for c in got)
    assert [c.id for c in resolve(repo, [])] == [f"commit:{shas[2][:12]}"]  # default HEAD
    # The same commit named twice is evaluated once.
    assert len(resolve(repo, ["HEAD", shas[2]])) == 1


def test_bad_revisions_are_one_clear_error(repo: Path) -> None:
    with pytest.raises(WorkspaceError, match="nope: no such commit"):
        resolve(repo, ["nope"])
    with pytest.raises(WorkspaceError, match="root commit"):
        resolve(repo, ["HEAD~2"])
    with pytest.raises(WorkspaceError, match="holds no commit"):
        resolve(repo, ["HEAD..HEAD"])


def test_a_patch_file_applies_to_the_base(repo: Path, tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text("From x\nSubject: [PATCH 1/2] Fix the thing\n\n"
                     "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n-x0 = 0\n+x0 = 10\n x1 = 1\n")
    (change,) = resolve(repo, [str(patch)], base="HEAD~1")
    assert change.id == "patch:fix.patch" and change.title == "Fix the thing"
    assert change.base == _git(repo, "rev-parse", "HEAD~1") and change.commit is None
    tree = Worktree.open(repo, tmp_path / "w" / "tree")
    tree.checkout(change.base)
    tree.apply(change.patches[0], change.id)
    snap = tree.snapshot(change.base)
    assert snap.paths == ["a.py"]
    assert snap.lines == {"a.py": {1}}
    tree.reset()
    assert tree.snapshot(change.base).paths == []
    with pytest.raises(WorkspaceError, match="does not apply"):
        tree.apply("--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-nothing\n+x\n", "bad.patch")
    assert _git(repo, "status", "--porcelain") == ""  # the user's checkout is untouched


def test_a_worktree_path_that_is_something_else_is_refused(repo: Path, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    with pytest.raises(WorkspaceError, match="not a worktree"):
        Worktree.open(repo, tmp_path / "busy")


def test_changed_lines_and_titles_and_seeds() -> None:
    diff = ("+++ b/m.py\n@@ -3,0 +4,2 @@\n+a\n+b\n@@ -9,2 +10,0 @@\n-c\n-d\n"
            "+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n")
    assert parse_changed_lines(diff) == {"m.py": {4, 5, 11}}
    assert patch_title("diff --git a/x b/x\nSubject: no\n", "name") == "name"
    assert fault_seed(0, "a") == fault_seed(0, "a") != fault_seed(0, "b") != fault_seed(1, "b")


def test_a_fault_that_undoes_the_change_is_dropped() -> None:
    from fastci.eval.faults import generate
    from fastci.eval.harness import not_reverting

    base = "def f(x):\n    return x > 1\n"
    head = "def f(x):\n    return x >= 1\n"  # the change flips the comparison
    mutants = generate({"m.py": head}, ["m.py::f"], count=10, seed=0)
    back = [m for m in mutants if m.mutated == base]
    assert back, "the compare operator flips >= back to >"
    kept = not_reverting(mutants, {"m.py": base.encode()})
    assert kept and not any(m.mutated == base for m in kept)
    assert len(kept) == len(mutants) - len(back)
    assert not_reverting(mutants, {"m.py": None}) == mutants  # a new file: nothing to undo
