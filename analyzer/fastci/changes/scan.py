"""Find what changed: git revisions and the evidence's recorded checksums, to a ChangeSet.

Two sources of truth are combined, and their union is kept (more changes can only
select more tests):

1. the diff between ``base`` and ``head`` (a revision or the working tree);
2. robustness to stale evidence: for every commit the evidence was recorded at,
   the files that differ between that commit and ``head``, and for those files the
   store's recorded unit checksums compared with the current index. When a recorded
   commit is unknown or missing, every recorded file is re-indexed and compared.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from fastci.changes.semantic_diff import FileDiff, UnitChange, diff_sources, stale_changes
from fastci.integrations.git.repository import WORKTREE, FileChange, Git
from fastci.changes.static_reach import HeadTree, Reach, static_reach
from fastci.integrations.git.tree import DIRTY_PREFIX
from fastci.types import Checksum, RelPath, UnitId
from fastci.units.index import FileUnits, ParseFailure, index_source, split_unit_id

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeSet:
    """Everything that changed, as values: Python files diffed, other paths listed.

    ``reach`` holds the static connections (:mod:`fastci.changes.static_reach`) from changes
    that evidence cannot see to the modules and units they affect; ``tree`` reads the
    head side (for rules that compare files on disk), None when not scanned from git.
    """

    base: str
    head: str
    files: tuple[FileDiff, ...] = ()
    others: tuple[FileChange, ...] = ()
    notes: tuple[str, ...] = ()
    reach: tuple[Reach, ...] = ()
    tree: HeadTree | None = field(default=None, compare=False, repr=False)

    @property
    def unit_changes(self) -> list[UnitChange]:
        """All unit changes of all Python files."""
        return [u for f in self.files for u in f.units]

    @property
    def failures(self) -> list[FileDiff]:
        """Python files that do not parse."""
        return [f for f in self.files if f.failure]

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
        """A short sentence: ``3 units changed in 2 files``."""
        n_units = len(self.unit_changes)
        n_files = len({f.path for f in self.files if f.units or f.failure}) + len(self.others)
        return f"{n_units} unit{'s' * (n_units != 1)} changed in {n_files} file{'s' * (n_files != 1)}"


def is_python(path: RelPath) -> bool:
    """Whether change analysis treats ``path`` as Python source."""
    return path.endswith(".py")


def _diff_file(git: Git, change: FileChange, old_rev: str, head: str) -> FileDiff:
    old = None if change.status == "A" else git.read(old_rev, change.base_path)
    new = None if change.status == "D" else git.read(head, change.path)
    return diff_sources(change.path, old, new, status=change.status,
                        old_path=change.old_path)


def scan(git: Git, base: str, head: str = WORKTREE, *,
         recorded: Mapping[UnitId, Checksum] | None = None,
         evidence_commits: Iterable[str | None] = ()) -> ChangeSet:
    """Diff ``base`` against ``head`` and the evidence's recorded state against ``head``.

    Raises:
        GitError: when ``base`` or ``head`` does not exist (the caller widens).
    """
    base_id = git.resolve(base)
    head_id = head if head == WORKTREE else git.resolve(head)
    notes: list[str] = []
    todo: dict[RelPath, tuple[FileChange, str]] = {}
    for ch in git.changed_files(base_id, head_id):
        todo[ch.path] = (ch, base_id)
    full_check = False
    evidence_commits = list(evidence_commits)
    for commit in sorted({c or "" for c in evidence_commits}):
        if not commit:
            full_check = True
            notes.append("some evidence has no recorded commit: compared every recorded file")
            continue
        if commit == base_id:
            continue
        if commit.startswith(DIRTY_PREFIX):
            full_check = True
            notes.append(f"some evidence was recorded from a modified tree ({commit[:18]}): "
                         "compared every recorded file")
            continue
        if not git.has_revision(commit):
            full_check = True
            notes.append(f"evidence commit {commit[:12]} is not in this repository: "
                         "compared every recorded file")
            continue
        for ch in git.changed_files(commit, head_id):
            todo.setdefault(ch.path, (ch, commit))
    files: dict[RelPath, FileDiff] = {}
    others: list[FileChange] = []
    for path, (ch, old_rev) in sorted(todo.items()):
        if is_python(path) or (ch.old_path and is_python(ch.old_path)):
            files[path] = _diff_file(git, ch, old_rev, head_id)
        else:
            others.append(ch)
    # When all evidence was recorded at ``base``, its checksums are the base side of the
    # diff above: comparing them again would find nothing new.
    if recorded and (full_check or set(evidence_commits) != {base_id}):
        _add_stale(git, head_id, recorded, files, full_check)
    diffs = tuple(files[p] for p in sorted(files))
    tree = HeadTree(git, head_id)
    return ChangeSet(base_id, head_id, diffs, tuple(others), tuple(notes),
                     tuple(static_reach(tree, diffs)), tree)


def _add_stale(git: Git, head: str, recorded: Mapping[UnitId, Checksum],
               files: dict[RelPath, FileDiff], full_check: bool) -> None:
    """Compare recorded checksums with the current index for the files that need it."""
    by_path: dict[RelPath, dict[UnitId, Checksum]] = defaultdict(dict)
    wanted = None if full_check else set(files) | {f.old_path for f in files.values() if f.old_path}
    for uid, checksum in recorded.items():
        path = split_unit_id(uid)[0]
        if wanted is None or path in wanted:
            by_path[path][uid] = checksum
    for path, units in sorted(by_path.items()):
        fd = files.get(path)
        if fd is not None and fd.failure:
            continue  # already widened to every test touching it
        current: FileUnits | None
        if fd is not None and fd.current is None and fd.status != "D":
            idx = _index_head(git, head, path)  # the quick diff did not index the whole file
            if isinstance(idx, ParseFailure):
                files[path] = replace(fd, failure=idx.message)
                continue
            current = idx
        elif fd is not None:
            current = fd.current
        else:
            renamed = [f for f in files.values() if f.old_path == path]
            if renamed:
                fd = renamed[0]
                current = None  # the recorded path no longer exists
            else:
                idx = _index_head(git, head, path)
                if isinstance(idx, ParseFailure):
                    files[path] = FileDiff(path, "M", failure=idx.message)
                    continue
                current = idx
        base_fd = fd or FileDiff(path, "M" if current else "D", current=current)
        already = {u.unit for u in base_fd.units}
        extra = stale_changes(path, units, current, already)
        if extra:
            LOG.info("%s: %d unit(s) differ from the recorded evidence", path, len(extra))
            files[base_fd.path] = replace(base_fd, units=base_fd.units + tuple(extra))


def _index_head(git: Git, head: str, path: RelPath) -> FileUnits | ParseFailure | None:
    data = git.read(head, path)
    return index_source(path, data) if data is not None else None
