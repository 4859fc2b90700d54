"""The tree digest a plan and a recording carry (fastci.integrations.git.tree), on real git repositories."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci.errors import GitError
from fastci.integrations.git.tree import DIRTY_PREFIX, evidence_commit, head_tree, tree_state, worktree_tree
from selection_support import Repo


def test_clean_tree_is_head_tree_and_edits_change_it(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    head = repo.commit({"a.py": "A = 1\n", ".gitignore": "ignored/\n"})
    clean = tree_state(tmp_path)
    assert clean.tree == head_tree(tmp_path) and clean.head == head and not clean.dirty
    assert evidence_commit(tmp_path) == head
    # Ignored files are not part of the tree.
    repo.write({"ignored/big.bin": "x"})
    assert worktree_tree(tmp_path) == clean.tree
    # A tracked edit, an untracked file and a deletion each give another tree.
    seen = {clean.tree}
    for files in ({"a.py": "A = 2\n"}, {"new.py": "N = 1\n"}, {"a.py": None}):
        repo.write(files)
        state = tree_state(tmp_path)
        assert state.dirty and state.tree not in seen
        assert evidence_commit(tmp_path) == DIRTY_PREFIX + state.tree
        seen.add(state.tree)


def test_the_users_index_is_untouched(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    repo.commit({"a.py": "A = 1\n"})
    repo.write({"b.py": "B = 1\n"})
    before = repo.git("status", "--porcelain")
    worktree_tree(tmp_path)
    assert repo.git("status", "--porcelain") == before == "?? b.py"


def test_not_a_repository(tmp_path: Path) -> None:
    with pytest.raises(GitError):
        worktree_tree(tmp_path)
    assert evidence_commit(tmp_path) is None


def test_fastcis_own_outputs_are_not_part_of_the_tree(tmp_path: Path) -> None:
    # No .gitignore: the store and the plan would otherwise be untracked files.
    repo = Repo(tmp_path)
    repo.commit({"a.py": "A = 1\n", ".fastci/BUILD.bazel": "# plan package\n"})
    clean = worktree_tree(tmp_path)
    repo.write({".fastci/plan.json": "{}", ".fastci/evidence.db": "x", ".fastci/runs/t.bin": "y"})
    assert worktree_tree(tmp_path) == clean
    # Its BUILD file is Bazel's view of the plan: an edit is a change.
    repo.write({".fastci/BUILD.bazel": "# edited\n"})
    assert worktree_tree(tmp_path) != clean


def test_an_ignored_fastci_folder_and_a_same_second_edit(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    head = repo.commit({"a.py": "A = 1\n", ".gitignore": ".fastci/\n"})
    repo.write({".fastci/evidence.db": "x"})
    assert evidence_commit(tmp_path) == head
    # Same size, same second as the index was written: still seen as an edit.
    repo.write({"a.py": "A = 2\n"})
    assert evidence_commit(tmp_path) == DIRTY_PREFIX + worktree_tree(tmp_path)
    assert worktree_tree(tmp_path) != head_tree(tmp_path)


def test_caches_a_test_run_writes_are_not_part_of_the_tree(tmp_path: Path) -> None:
    # Issue 36: a repository that ignores none of them. A recorded child process writes
    # __pycache__/*.pyc, pytest its last-failed list, coverage its data file: before,
    # each made another tree, so the plan made before the run no longer matched the tree
    # at run time and every runner ran everything, and evidence was stamped dirty.
    repo = Repo(tmp_path)
    head = repo.commit({"pkg/a.py": "A = 1\n", "tests/test_a.py": "def test_a(): pass\n"})
    clean = tree_state(tmp_path)
    assert not clean.dirty
    repo.write({"pkg/__pycache__/a.cpython-311.pyc": "\x00bytecode",
                ".pytest_cache/v/cache/lastfailed": '{"tests/test_a.py::test_a": true}',
                ".pytest_cache/CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55",
                ".mypy_cache/3.11/a.meta.json": "{}", ".hypothesis/examples/x": "y",
                ".coverage": "data", ".coverage.host.123": "data",
                "fastci.egg-info/PKG-INFO": "Name: fastci"})
    state = tree_state(tmp_path)
    assert state.tree == clean.tree and not state.dirty
    assert evidence_commit(tmp_path) == head
    # A real file beside them still counts.
    repo.write({"pkg/b.py": "B = 1\n"})
    assert worktree_tree(tmp_path) != clean.tree
