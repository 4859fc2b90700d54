"""Find what changed: git revisions and the evidence's baselines, to a ChangeSet.

Two views are kept:

1. the diff between ``base`` and ``head`` (a revision or the working tree): what
   the developer changed, for the plan's summary and for evidence whose baseline
   is not known;
2. every test's own baseline: for each commit the held evidence was recorded at,
   the files that differ between that commit and ``head`` (``since``), and a
   :class:`~fastci.changes.versions.Versions` reader that diffs any recorded
   version of a file against ``head``. Selection compares each test with the
   version of each file *its* recording saw, so a test re-recorded after a change
   is not selected for it again, and one recorded before it never loses it.
   Evidence recorded from a modified tree, at no known commit, or at a commit the
   repository lacks has no such baseline: selection compares it file by file.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from fastci.changes.semantic_diff import FileDiff, UnitChange, diff_sources
from fastci.changes.versions import Versions
from fastci.integrations.git.repository import WORKTREE, FileChange, Git
from fastci.changes.static_reach import HeadTree, Reach, compile_context, static_reach
from fastci.integrations.git.tree import DIRTY_PREFIX
from fastci.types import RelPath

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeSet:
    """Everything that changed, as values: Python files diffed, other paths listed.

    ``files``/``others`` are the ``base``..``head`` diff. ``since`` maps each commit
    the evidence was recorded at (and that the repository holds) to the files that
    differ between it and ``head``; evidence at a commit not in ``since`` has an
    unknown baseline. ``reach`` holds the static connections
    (:mod:`fastci.changes.static_reach`) from changes that evidence cannot see to the
    modules and units they affect, over both views (``Reach.path`` says which change).
    ``tree`` reads the head side and ``versions`` diffs recorded versions against it;
    both None when not scanned from git.
    """

    base: str
    head: str
    files: tuple[FileDiff, ...] = ()
    others: tuple[FileChange, ...] = ()
    notes: tuple[str, ...] = ()
    reach: tuple[Reach, ...] = ()
    tree: HeadTree | None = field(default=None, compare=False, repr=False)
    since: Mapping[str, tuple[FileChange, ...]] = field(default_factory=dict, compare=False,
                                                        repr=False)
    versions: Versions | None = field(default=None, compare=False, repr=False)
    #: Each static connection -> the views it arises in: the commits of ``since`` (and
    #: ``base``) whose diff to ``head`` makes it (a file new since one evidence commit
    #: is a modified file for evidence recorded after it existed). Absent: every view.
    reach_views: Mapping[Reach, frozenset[str]] = field(default_factory=dict, compare=False,
                                                        repr=False)

    @property
    def unit_changes(self) -> list[UnitChange]:
        """All unit changes of all Python files."""
        return [u for f in self.files for u in f.units]

    @property
    def paths(self) -> list[RelPath]:
        """Every changed path (old paths of renames included)."""
        out = set()
        for f in self.files:
            out.add(f.path)
            if f.old_path:
                out.add(f.old_path)
        for o in self.others:
            out.add(o.path)
            if o.old_path:
                out.add(o.old_path)
        return sorted(out)

    def summary(self) -> str:
        """A short sentence about the ``base``..``head`` diff: ``3 units changed in 2
        files``; ``0 units changed in 0 of 2 changed files (2 Python files: comments,
        docstrings or formatting only)`` when some changed files change no unit."""
        n_units = len(self.unit_changes)
        n_files = len({f.path for f in self.files if f.units or f.failure}) + len(self.others)
        quiet = len({f.path for f in self.files if not (f.units or f.failure)})
        text = f"{n_units} unit{'s' * (n_units != 1)} changed in {n_files}"
        if not quiet:
            return f"{text} file{'s' * (n_files != 1)}"
        return (f"{text} of {n_files + quiet} changed files ({quiet} Python "
                f"file{'s' * (quiet != 1)}: comments, docstrings or formatting only)")


def is_python(path: RelPath) -> bool:
    """Whether change analysis treats ``path`` as Python source."""
    return path.endswith(".py")


def _diff_file(git: Git, change: FileChange, old_rev: str, head: str) -> FileDiff:
    old = None if change.status == "A" else git.read(old_rev, change.base_path)
    new = None if change.status == "D" else git.read(head, change.path)
    return diff_sources(change.path, old, new, status=change.status,
                        old_path=change.old_path)


def scan(git: Git, base: str, head: str = WORKTREE, *,
         evidence_commits: Iterable[str | None] = ()) -> ChangeSet:
    """Diff ``base`` against ``head``, and list what changed since each evidence commit.

    Raises:
        GitError: when ``base`` or ``head`` does not exist (the caller widens).
    """
    base_id = git.resolve(base)
    head_id = head if head == WORKTREE else git.resolve(head)
    notes: list[str] = []
    base_changes = tuple(git.changed_files(base_id, head_id))
    since: dict[str, tuple[FileChange, ...]] = {}
    commits = set(evidence_commits)
    if None in commits or "" in commits:
        notes.append("some evidence has no recorded commit: compared file by file with what "
                     "it recorded")
    for commit in sorted(c for c in commits if c):
        if commit == base_id:
            since[commit] = base_changes
        elif commit.startswith(DIRTY_PREFIX):
            notes.append(f"some evidence was recorded from a modified tree ({commit[:18]}): "
                         "compared file by file with what it recorded")
        elif not git.has_revision(commit):
            notes.append(f"evidence commit {commit[:12]} is not in this repository: "
                         "compared file by file with what it recorded")
        else:
            since[commit] = tuple(git.changed_files(commit, head_id))
    files: dict[RelPath, FileDiff] = {}
    others: list[FileChange] = []
    versions = Versions(git, head_id)
    tree = HeadTree(git, head_id)
    versions.compiles = functools.lru_cache(maxsize=256)(functools.partial(compile_context, tree))
    in_place: list[RelPath] = []  # Python files changed where they are
    for ch in base_changes:
        if not (is_python(ch.path) or (ch.old_path and is_python(ch.old_path))):
            others.append(ch)
        elif ch.old_path and ch.old_path != ch.path:
            files[ch.path] = _diff_file(git, ch, base_id, head_id)  # a rename: units move
        else:
            in_place.append(ch.path)
    versions.prefetch(base_id, in_place)  # their old versions: one git call
    for path in in_place:
        files[path] = versions.diff(path, versions.at(base_id, path))
    diffs = tuple(files[p] for p in sorted(files))
    reach = _reach(tree, versions, diffs, base_id, since)
    return ChangeSet(base_id, head_id, diffs, tuple(sorted(others, key=lambda o: o.path)),
                     tuple(notes), tuple(reach), tree, since, versions,
                     {r: frozenset(v) for r, v in reach.items()})


def _reach(tree: HeadTree, versions: Versions, diffs: tuple[FileDiff, ...], base: str,
           since: Mapping[str, tuple[FileChange, ...]]) -> dict[Reach, set[str]]:
    """Static reach of the base diff and of every file changed since an evidence commit
    (one diff per distinct old version of a file), each with the views it arises in."""
    seen: dict[int, FileDiff] = {id(fd): fd for fd in diffs}  # one diff per old version
    views: dict[int, set[str]] = {id(fd): {base} for fd in diffs}
    for commit, changes in sorted(since.items()):
        versions.prefetch(commit, sorted({p for ch in changes for p in (ch.path, ch.base_path)
                                          if is_python(p)}))
        for ch in changes:
            for path in sorted({ch.path, ch.base_path}):
                if is_python(path):
                    fd = versions.diff(path, versions.at(commit, path))
                    seen.setdefault(id(fd), fd)
                    views.setdefault(id(fd), set()).add(commit)
    out: dict[Reach, set[str]] = {}
    for key, fd in seen.items():  # each file's connections are its own (static_reach)
        for r in static_reach(tree, [fd]):
            out.setdefault(r, set()).update(views[key])
    return out
