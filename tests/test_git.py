"""Tests of the git adapter against real temporary repositories."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci.errors import GitError
from fastci.integrations.git.repository import WORKTREE, FileChange, Git, parse_name_status
from selection_support import Repo


def test_changed_files_between_revisions_and_worktree(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "A = 1\n", "b.txt": "b\n", "gone.py": "G = 1\n" * 20})
    repo.git("mv", "gone.py", "moved.py")
    head = repo.commit({"a.py": "A = 2\n", "b.txt": None, "c.md": "c\n"})
    git = Git(tmp_path)
    assert git.changed_files(base, head) == [
        FileChange("M", "a.py"), FileChange("D", "b.txt"), FileChange("A", "c.md"),
        FileChange("R", "moved.py", "gone.py")]
    repo.write({"a.py": "A = 3\n", "untracked.py": "U = 1\n"})
    assert git.changed_files(head, WORKTREE) == [FileChange("M", "a.py"),
                                                 FileChange("A", "untracked.py")]


def test_read_at_revision_and_worktree(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "A = 1\n"})
    repo.write({"a.py": "A = 2\n"})
    git = Git(tmp_path)
    assert git.read(base, "a.py") == b"A = 1\n"
    assert git.read(WORKTREE, "a.py") == b"A = 2\n"
    assert git.read(base, "missing.py") is None and git.read(WORKTREE, "missing.py") is None
    assert git.head() == base


def test_read_many_reads_what_read_reads(tmp_path: Path) -> None:
    """One cat-file --batch for several paths: bytes, absent paths, folders, names with
    spaces, newlines (read alone), empty and binary files, as :meth:`Git.read` gives them."""
    repo = Repo(tmp_path)
    files = {"a.py": "A = 1\n", "pkg/b.py": "B = 2\n" * 300, "with space.py": "S = 1\n",
             "x missing.py": "M = 1\n", "empty.py": "", "new\nline.py": "N = 1\n"}
    base = repo.commit(files)
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 3)
    repo.git("add", "bin.dat")
    repo.git("commit", "-qm", "bin")
    head = Git(tmp_path).head()
    assert head is not None
    repo.write({"a.py": "A = 9\n"})
    git = Git(tmp_path)
    paths = [*files, "bin.dat", "pkg", "missing.py", "pkg/missing 1.py"]
    for rev in (base, head):
        got = git.read_many(rev, paths)
        assert set(got) == set(paths)
        assert got == {p: git.read(rev, p) for p in paths}
    assert git.read_many(head, ["bin.dat"])["bin.dat"] == bytes(range(256)) * 3
    assert git.read_many(base, ["a.py", "pkg"]) == {"a.py": b"A = 1\n", "pkg": None}
    assert git.read_many(base, []) == {}


def test_grep_files_each_is_grep_files_side_by_side(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "import os\nX = getattr(os, 'sep')\n", "b.py": "Y = 1\n",
                        "c.txt": "getattr\n"})
    repo.write({"d.py": "Z = getattr\n"})
    git = Git(tmp_path)
    searches = [("getattr",), ("Y", "X"), (), ("nothing-here",), ("getattr",)]
    for rev in (base, WORKTREE):
        assert git.grep_files_each(rev, searches) == [git.grep_files(rev, w) for w in searches]
    assert git.grep_files_each(WORKTREE, searches)[0] == ["a.py", "d.py"]


def test_missing_revision_is_a_git_error(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.commit({"a.py": "A = 1\n"})
    git = Git(tmp_path)
    with pytest.raises(GitError, match="does not exist"):
        git.changed_files("no-such-branch")
    assert not git.has_revision("deadbeef" * 5)


def test_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(GitError):
        Git(tmp_path).toplevel()
    assert Git(tmp_path).head() is None


def test_parse_name_status_keeps_every_path() -> None:
    raw = b"M\0a.py\0R087\0old.py\0new.py\0T\0link\0C100\0src.py\0copy.py\0"
    assert parse_name_status(raw) == [FileChange("M", "a.py"), FileChange("R", "new.py", "old.py"),
                                      FileChange("M", "link"), FileChange("A", "copy.py")]


def test_repo_root_is_the_top_level_or_the_start(tmp_path: Path) -> None:
    from fastci.integrations.git.repository import repo_root

    outside = tmp_path / "plain"
    outside.mkdir()
    assert repo_root(outside) == outside.resolve()
    repo = Repo(tmp_path / "r")
    repo.commit({"pkg/a.py": "A = 1\n"})
    assert repo_root(tmp_path / "r" / "pkg") == (tmp_path / "r").resolve()


def test_untracked_names_that_are_not_utf8_are_kept_and_shown_escaped(tmp_path: Path) -> None:
    import os

    from fastci.integrations.git.repository import shown

    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "A = 1\n"})
    name = os.fsdecode(b"caf\xe9.bin")
    (tmp_path / name).write_bytes(b"data")
    git = Git(tmp_path)
    changes = git.changed_files(base, WORKTREE)
    assert changes == [FileChange("A", name)]
    assert git.read(WORKTREE, name) == b"data"  # the decoded name still opens the file
    assert name in git.list_files(WORKTREE)
    assert shown(name) == "caf\\xe9.bin" and shown("a.py") == "a.py"
    repo.commit()
    assert git.changed_files(base, "HEAD") == [FileChange("A", name)]
    assert git.read("HEAD", name) == b"data"


def test_caches_live_where_no_commit_can_put_one(tmp_path: Path) -> None:
    from fastci.integrations.git.repository import cache_dir

    repo = Repo(tmp_path / "r")
    repo.commit({"a.py": "A = 1\n"})
    # Inside git's own directory: a change can commit `.fastci/units.cache`, never `.git/...`.
    assert cache_dir(repo.root) == (repo.root / ".git" / "fastci").resolve()
    assert cache_dir(tmp_path / "plain") == tmp_path / "plain" / ".fastci"


def test_parents_of_history_answers_for_held_commits_only(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    c0 = repo.commit({"a.py": "A = 1\n"})
    c1 = repo.commit({"a.py": "A = 2\n"})
    c2 = repo.commit({"a.py": "A = 3\n"})
    git = Git(tmp_path)
    # One rev-list from the tips; a commit the repository does not hold, or that is not a
    # full id (nothing git could read as an option), is left out.
    graph = git.parents_of_history([c2, "f" * 40, "--all", ""], limit=100)
    assert graph == {c2: (c1,), c1: (c0,), c0: ()}
    assert git.parents_of_history(["f" * 40], limit=100) == {}
    assert set(git.parents_of_history([c2], limit=2)) == {c2, c1}  # the walk's limit
