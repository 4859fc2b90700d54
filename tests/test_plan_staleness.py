"""A plan is obeyed only on the tree it was made for (issue 9 item 6).

The pytest plugin (a real pytest subprocess on a temporary git repository),
``rules/bazelw``'s shell digest (with a stand-in for the real bazel), and the
digest itself against git's racy-clean trap. The Bazel rules are tested in
tests/test_bazel_stale_plan.py, ``fastci run`` in tests/test_run.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.integrations.git.tree import head_tree, worktree_tree
from selection_support import Repo

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
def test_a():
    print("RAN a")


def test_b():
    print("RAN b")


def test_c():
    print("RAN c")
'''
# The plan is not committed (`git add -A` in Repo.commit would); ignoring it is not what
# keeps it out of the tree digest: .fastci/ never is part of it.
IGNORE = "/.fastci/plan.json\n__pycache__/\n"


def _repo(root: Path) -> Repo:
    repo = Repo(root)
    repo.commit({".gitignore": IGNORE, "test_suite.py": SUITE, "README.md": "suite\n"})
    return repo


def _plan(tree: str | None) -> Plan:
    return Plan(mode="selective", reason="b only", tree=tree,
                tests=(PlannedTest("test_suite.py::test_b"),),
                skipped=(SkippedTest("test_suite.py::test_a", "not affected"),
                         SkippedTest("test_suite.py::test_c", "not affected")))


def _pytest(root: Path) -> tuple[list[str], str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v",
                          "--fastci-plan", ".fastci/plan.json", "test_suite.py"],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return re.findall(r"RAN (\w)", res.stdout), res.stdout + res.stderr


def test_pytest_plugin_obeys_a_plan_only_on_its_tree(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    clean = worktree_tree(tmp_path)
    dump_plan(_plan(clean), tmp_path / ".fastci/plan.json")
    ran, out = _pytest(tmp_path)
    assert ran == ["b"] and "2 deselected" in out and "this tree is" not in out

    # A tracked file edited after planning: the plan describes another tree.
    repo.write({"README.md": "suite, edited after the plan was made\n"})
    edited = worktree_tree(tmp_path)
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"] and "deselected" not in out
    assert f"plan made for tree {clean}, this tree is {edited}: running every test at full workload" in out

    # Committing changes no content: a plan for the edited tree is obeyed after the commit.
    dump_plan(_plan(edited), tmp_path / ".fastci/plan.json")
    repo.commit(msg="commit the edit")
    assert head_tree(tmp_path) == edited
    ran, out = _pytest(tmp_path)
    assert ran == ["b"] and "this tree is" not in out

    # Back to the first content (and an empty commit on top): the first plan applies again.
    repo.commit({"README.md": "suite\n"}, msg="revert")
    repo.commit(msg="nothing")
    dump_plan(_plan(clean), tmp_path / ".fastci/plan.json")
    ran, _ = _pytest(tmp_path)
    assert ran == ["b"]


def test_pytest_plugin_obeys_a_hand_written_plan_and_says_it_is_not_tied_to_a_tree(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    dump_plan(_plan(None), tmp_path / ".fastci/plan.json")
    repo.write({"README.md": "anything\n"})
    ran, out = _pytest(tmp_path)
    assert ran == ["b"]
    assert "the plan names no `tree`: it is not tied to a tree and is obeyed as written" in out


def test_pytest_plugin_outside_git_does_not_obey_a_plan_for_a_tree(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    dump_plan(_plan("0" * 40), tmp_path / ".fastci/plan.json")
    ran, out = _pytest(tmp_path)
    assert ran == ["a", "b", "c"]
    assert f"plan made for tree {'0' * 40}, this tree is unknown" in out


# --- rules/bazelw computes the same digest in shell ----------------------------------------------

FAKE_BAZEL = "#!/bin/sh\nprintf '%s\\n' \"$@\"\n"


def _bazelw(ws: Path, tmp: Path, *args: str) -> list[str]:
    fake = tmp / "fake-bazel"
    fake.write_text(FAKE_BAZEL)
    fake.chmod(0o755)
    res = subprocess.run([str(REPO / "rules/bazelw"), *args], cwd=ws, capture_output=True, text=True,
                         env=dict(os.environ, BAZEL_REAL=str(fake)), timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def _tree_flag(lines: list[str]) -> str:
    flags = [line for line in lines if line.startswith("--repo_env=FASTCI_TREE_DIGEST=")]
    assert len(flags) == 1, lines
    return flags[0].split("=", 2)[2]


def test_bazelw_passes_the_same_tree_digest_as_fastci(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    repo = _repo(ws)
    repo.commit({"WORKSPACE": "", ".fastci/BUILD.bazel": "# the plan's package\n"})
    (ws / "pkg").mkdir()
    assert _tree_flag(_bazelw(ws / "pkg", tmp_path, "test", "//...")) == worktree_tree(ws)
    # FastCI's own outputs are no content; the .fastci BUILD file is.
    repo.write({".fastci/plan.json": "{}", ".fastci/runs/bep.json": "{}"})
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == worktree_tree(ws) == head_tree(ws)
    repo.write({"README.md": "edited\n", "pkg/new.py": "x = 1\n", ".fastci/BUILD.bazel": "# edited\n"})
    before = subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    lines = _bazelw(ws, tmp_path, "--output_base=/x", "build", "//...")
    assert lines[:2] == ["--output_base=/x", "build"] and lines[-1] == "//..."
    assert _tree_flag(lines) == worktree_tree(ws) != head_tree(ws)
    # The user's index is untouched (pkg/new.py is still untracked, README.md unstaged).
    assert subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout == before
    # Deleted files, odd names, and a .fastci/ folder that is itself git-ignored.
    repo.write({"test_suite.py": None, "pkg/a b ü.py": "y = 2\n", ".gitignore": IGNORE + "/.fastci/\n"})
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == worktree_tree(ws) != head_tree(ws)
    # Commands that load no repository get no digest (it is not computed at all).
    assert not any("FASTCI_TREE_DIGEST" in line for line in _bazelw(ws, tmp_path, "info"))


def test_bazelw_never_fails_over_the_digest(tmp_path: Path) -> None:
    ws = tmp_path / "nogit"
    ws.mkdir()
    (ws / "WORKSPACE").write_text("")
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == "unknown"
    repo = _repo(tmp_path / "broken")
    (repo.root / "WORKSPACE").write_text("")
    (repo.root / ".git" / "HEAD").write_text("garbage\n")  # git no longer sees a repository
    assert _tree_flag(_bazelw(repo.root, tmp_path, "query", "//...")) == "unknown"


# --- The digest sees a same-size edit made in the second the index was written -----------------


def _true_tree(root: Path, tmp: Path) -> str:
    """The tree of the working tree's content from a fresh index (no stat cache at all)."""
    env = dict(os.environ, GIT_INDEX_FILE=str(tmp / "fresh-index"))
    subprocess.run(["git", "-C", str(root), "add", "-A", "."], env=env, check=True)
    return subprocess.run(["git", "-C", str(root), "write-tree"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _racy_edit(root: Path) -> Repo:
    """Commit a file and rewrite it with the same size within one second, then let a second pass.

    git stores stat times in whole seconds here: the edited file's stat matches
    its index entry, and only git's racy-clean check (entry as new as the index
    file) makes git read the content again.
    """
    for _ in range(5):
        while time.time() % 1 > 0.3:  # start early in a second: the steps take well under 0.7 s
            time.sleep(0.05)
        second = int(time.time())
        repo = Repo(root)
        repo.commit({"m.py": "y = x * 2\n"})
        (root / "m.py").write_text("y = x * 3\n")
        st = (root / "m.py").stat()
        if int(st.st_mtime) == int(st.st_ctime) == int((root / ".git/index").stat().st_mtime) == second:
            time.sleep(1.2)
            return repo
        subprocess.run(["rm", "-rf", str(root)], check=True)
    pytest.fail("could not make a same-second edit")


def test_bazelw_digest_sees_a_same_second_same_size_edit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _racy_edit(ws)
    (ws / "WORKSPACE").write_text("")
    truth = _true_tree(ws, tmp_path)
    assert truth != head_tree(ws)
    assert _tree_flag(_bazelw(ws, tmp_path, "test", "//...")) == truth


def test_worktree_tree_sees_a_same_second_same_size_edit(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _racy_edit(ws)
    truth = _true_tree(ws, tmp_path)
    assert truth != head_tree(ws)
    assert worktree_tree(ws) == truth
