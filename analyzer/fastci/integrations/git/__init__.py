"""The adapter to git: ``repository`` runs the git command line (changed files between
revisions or against the working tree, file contents at a revision, whether a
revision exists) and turns every failure into a ``GitError``; ``tree`` gives the
content digest of a working tree, which a plan names (so runners can refuse a plan
made for other code) and which stamps evidence recorded from a modified tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastci import lazy_exports

if TYPE_CHECKING:
    from fastci.integrations.git.repository import (
        Git as Git,
        FileChange as FileChange,
        WORKTREE as WORKTREE,
        repo_root as repo_root,
    )
    from fastci.integrations.git.tree import (
        TreeState as TreeState,
        tree_state as tree_state,
        worktree_tree as worktree_tree,
        plan_tree as plan_tree,
        evidence_commit as evidence_commit,
        current_tree as current_tree,
        UNKNOWN_TREE as UNKNOWN_TREE,
    )

__all__ = [
    "Git",
    "FileChange",
    "WORKTREE",
    "repo_root",
    "TreeState",
    "tree_state",
    "worktree_tree",
    "plan_tree",
    "evidence_commit",
    "current_tree",
    "UNKNOWN_TREE",
]

__getattr__ = lazy_exports(__name__, {
    "Git": "fastci.integrations.git.repository",
    "FileChange": "fastci.integrations.git.repository",
    "WORKTREE": "fastci.integrations.git.repository",
    "repo_root": "fastci.integrations.git.repository",
    "TreeState": "fastci.integrations.git.tree",
    "tree_state": "fastci.integrations.git.tree",
    "worktree_tree": "fastci.integrations.git.tree",
    "plan_tree": "fastci.integrations.git.tree",
    "evidence_commit": "fastci.integrations.git.tree",
    "current_tree": "fastci.integrations.git.tree",
    "UNKNOWN_TREE": "fastci.integrations.git.tree",
})
