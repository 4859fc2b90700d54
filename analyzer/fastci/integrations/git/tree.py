"""What tree a plan or a recording describes: a content digest of the working tree.

A plan is made for one tree and is only valid for that tree; evidence recorded
from a tree with uncommitted edits must never pass for the clean commit. Both
need the same fact, computed the same way everywhere (``fastci plan``, ``fastci
run``, the pytest plugin, ``rules/bazelw`` in shell, ``fastci record/ingest``):

* ``tree`` — the git tree id of the working tree's content: tracked files as
  they are on disk plus untracked files that git does not ignore. It is what
  ``git write-tree`` gives after ``git add -A`` into a *private copy* of the
  index, so the user's index is never touched; for a clean checkout it equals
  ``HEAD^{tree}``. Ignored files (``.venv``, ``bazel-*``...) are not part of
  it, and neither is FastCI's own folder ``.fastci/`` (plan, store, caches, run
  logs — written while a plan is made and run), except its BUILD files, which are
  Bazel's view of the plan. A tracked file there keeps its committed content.
  Nor are the caches and install metadata a test run or an install writes
  (:func:`fastci.types.is_tool_artifact`: ``__pycache__``, ``.pytest_cache``,
  ``.coverage``, ``*.egg-info``...) in a repository that does not ignore them: a
  recorded child compiling a module, or pytest saving its last-failed list, would
  otherwise make the plan made before the run describe another tree at run time.
* ``dirty`` — whether that tree differs from ``HEAD``'s.
* :func:`evidence_commit` — the commit to stamp on evidence: ``HEAD``'s id for a
  clean tree, else ``dirty:<tree>``, which names no commit, so change analysis
  treats such evidence as recorded at an unknown revision and compares every
  recorded file (the safe side).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastci.errors import GitError
from fastci.types import is_tool_artifact

#: FastCI's own folder: what it writes there is never part of the tree (BUILD files are).
OWN_DIR = ".fastci"

#: The tree id runners use when they cannot compute one: it matches no plan.
UNKNOWN_TREE = "unknown"

#: Prefix of the commit stamp of evidence recorded from a modified tree.
DIRTY_PREFIX = "dirty:"


@dataclass(frozen=True)
class TreeState:
    """The working tree of a repository as content: ``tree`` id, ``HEAD`` and whether they differ."""

    tree: str
    head: str | None
    dirty: bool


def _counts(path: str) -> bool:
    """Whether a path is part of the tree: anything but FastCI's own outputs and the
    caches of test runners (``rules/bazelw``'s ``ARTIFACTS`` is the same test in shell)."""
    if not path.startswith(OWN_DIR + "/"):
        return not is_tool_artifact(path)
    return path[len(OWN_DIR) + 1:] in ("BUILD", "BUILD.bazel")


def _git(root: Path, args: list[str], env: dict[str, str] | None = None, *,
         strip: bool = True, stdin: str | None = None) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, env=env,
                              check=False, input=stdin.encode(errors="surrogateescape") if stdin is not None else None)
    except OSError as exc:
        raise GitError(f"cannot run git: {exc.strerror}") from exc
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:2])}: {msg[0] if msg else 'failed'}")
    out = proc.stdout.decode(errors="surrogateescape")
    return out.strip() if strip else out


def worktree_tree(root: Path) -> str:
    """The git tree id of the working tree's content (tracked + untracked-not-ignored).

    Raises:
        GitError: ``root`` is not in a git repository, or git failed.
    """
    root = Path(root)
    index = Path(_git(root, ["rev-parse", "--path-format=absolute", "--git-path", "index"]))
    with tempfile.TemporaryDirectory(prefix="fastci-tree-") as tmp:
        private = Path(tmp) / "index"
        if index.is_file():
            # A copy keeps git's stat cache, so unchanged files are not re-hashed; copy2 keeps
            # the index's mtime too, which git needs to notice a file edited in the same second
            # as the index was written ("racily clean" entries).
            shutil.copy2(index, private)
        env = dict(os.environ, GIT_INDEX_FILE=str(private))
        # Modified, deleted and untracked-not-ignored paths; FastCI's own outputs stay out.
        # (A pathspec exclude fails when the folder is itself git-ignored, so filter here.)
        listed = _git(root, ["ls-files", "-z", "--modified", "--others", "--exclude-standard"],
                      env=env, strip=False)
        paths = sorted({p for p in listed.split("\0") if p and _counts(p)})
        if paths:
            _git(root, ["update-index", "--add", "--remove", "-z", "--stdin"], env=env,
                 stdin="\0".join(paths) + "\0")
        return _git(root, ["write-tree"], env=env)


def head_tree(root: Path, rev: str = "HEAD") -> str | None:
    """The tree id of ``rev`` (None when the repository has no such commit)."""
    try:
        return _git(Path(root), ["rev-parse", "--verify", "--quiet", f"{rev}^{{tree}}"])
    except GitError:
        return None


def tree_state(root: Path) -> TreeState:
    """The working tree's :class:`TreeState`.

    Raises:
        GitError: ``root`` is not in a git repository, or git failed.
    """
    tree = worktree_tree(root)
    try:
        head: str | None = _git(Path(root), ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
    except GitError:
        head = None
    return TreeState(tree, head, head is None or head_tree(root) != tree)


def plan_tree(root: Path, head: str | None = None) -> str:
    """The tree id a plan for ``head`` describes: ``head^{tree}``, or the working tree's content.

    Computed at the repository's top level, as every runner computes it.

    Raises:
        GitError: not a git repository, git failed, or ``head`` names no commit.
    """
    top = Path(_git(Path(root), ["rev-parse", "--show-toplevel"]))
    if head is None:
        return worktree_tree(top)
    tree = head_tree(top, head)
    if tree is None:
        raise GitError(f"{head}: no such revision (cannot name the tree the plan is for)")
    return tree


def current_tree(root: Path) -> str | None:
    """The tree id of the working tree of the git repository containing ``root`` (None if unknown).

    Always the repository's top level, so every runner digests the same files
    whichever directory it starts from (``rules/bazelw`` does the same).
    """
    try:
        return plan_tree(root)
    except GitError:
        return None


def committed_plan_problem(path: Path) -> str | None:
    """Why the plan file ``path`` must not be obeyed because git tracks it, or None.

    A plan file git tracks was committed (by the change under test, or before it): it
    was made for no tree this change can have, and a change must never choose its own
    plan (invariant 10). Outside a git repository, or when git cannot tell, None: the
    plan's ``tree`` then decides (it never matches an unknown tree).
    """
    path = Path(os.path.abspath(path))
    try:
        _git(path.parent, ["ls-files", "--error-unmatch", "--", path.name])
    except GitError:
        return None
    return (f"the plan file {path.name} ({path}) is tracked by git: a committed plan is "
            "never obeyed (untrack it with `git rm --cached` and git-ignore it)")


def evidence_commit(root: Path) -> str | None:
    """The commit stamp for evidence recorded now: ``HEAD``, or ``dirty:<tree>`` if modified.

    None outside a git repository (evidence of an unknown revision).
    """
    try:
        state = tree_state(root)
    except GitError:
        return None
    if state.dirty or state.head is None:
        return DIRTY_PREFIX + state.tree
    return state.head


def main(argv: list[str] | None = None) -> int:
    """``python -m fastci.integrations.git.tree [ROOT]``: print the working tree's tree id."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        print(worktree_tree(Path(args[0] if args else ".")))
    except GitError as exc:
        print(f"fastci: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
