"""``fastci eval --workdir`` never writes the user's store, calibration, plan or worktrees.

Each case was a real loss: ``--workdir .fastci`` deleted the store and calibration it
was about to copy (the copy unlinked its own source), and a ``--workdir`` whose
``tree`` was one of the user's own worktrees had its edits and untracked files wiped
and its branch detached. Both happened before the change was even applied. The
evaluation must refuse, in one line, before it writes anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fastci import cli
from fastci.eval.workspace import MARK, Worktree, WorkspaceError, check_workdir
from selection_support import Repo


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    Repo(root).commit({"lib.py": "def f():\n    return 1\n",
                       "test_lib.py": "import lib\n\n\ndef test_f():\n    assert lib.f() == 1\n",
                       ".gitignore": ".fastci/\n__pycache__/\n"}, msg="base")
    fastci = root / ".fastci"
    fastci.mkdir()
    # The bytes stand for the user's data: the evaluation must never write them.
    (fastci / "evidence.db").write_bytes(b"the user's evidence")
    (fastci / "calibration.db").write_bytes(b"the user's calibration")
    return root


def _eval(repo: Path, workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
          ) -> tuple[int, str]:
    rc = cli.main(["eval", "HEAD", "--root", str(repo), "--out", str(tmp_path / "out"),
                   "--workdir", str(workdir)])
    return rc, capsys.readouterr().err


def test_a_workdir_in_the_checkouts_fastci_folder_is_refused_and_nothing_is_lost(
        repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _eval(repo, repo / ".fastci", tmp_path, capsys)
    assert rc != 0
    assert "inside the checkout" in err and len(err.strip().splitlines()) == 1
    assert (repo / ".fastci" / "evidence.db").read_bytes() == b"the user's evidence"
    assert (repo / ".fastci" / "calibration.db").read_bytes() == b"the user's calibration"
    assert not (repo / ".fastci" / "tree").exists()


def test_a_workdir_that_holds_the_configured_store_is_refused(
        repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "evidence.db").write_bytes(b"shared store")
    (repo / "fastci.yaml").write_text(f"store: {data / 'evidence.db'}\n")
    rc, err = _eval(repo, data, tmp_path, capsys)
    assert rc != 0 and "would overwrite" in err
    assert (data / "evidence.db").read_bytes() == b"shared store"


def test_a_users_own_worktree_is_refused_and_keeps_its_work(
        repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    _git(repo, "worktree", "add", "-q", "-b", "feature", str(work / "tree"))
    (work / "tree" / "lib.py").write_text("def f():\n    return 2  # my edit\n")
    (work / "tree" / "notes.txt").write_text("untracked work\n")
    rc, err = _eval(repo, work, tmp_path, capsys)
    assert rc != 0 and "did not make" in err
    assert "my edit" in (work / "tree" / "lib.py").read_text()
    assert (work / "tree" / "notes.txt").read_text() == "untracked work\n"
    assert _git(work / "tree", "rev-parse", "--abbrev-ref", "HEAD") == "feature"


def test_a_worktree_fastci_made_is_marked_and_reused(repo: Path, tmp_path: Path) -> None:
    work = check_workdir(repo, tmp_path / "w", [repo / ".fastci" / "evidence.db"])
    first = Worktree.open(repo, work / "tree")
    assert (work / MARK).read_text().strip() == str(first.path)
    again = Worktree.open(repo, work / "tree")
    assert again.path == first.path


def test_an_unmarked_worktree_is_adopted_only_when_asked(repo: Path, tmp_path: Path) -> None:
    tree = tmp_path / "cache" / "tree"
    _git(repo, "worktree", "add", "-q", "--detach", str(tree))
    with pytest.raises(WorkspaceError, match="did not make"):
        Worktree.open(repo, tree)
    assert Worktree.open(repo, tree, adopt=True).path == tree.resolve()
    assert (tree.parent / MARK).is_file()
