"""Versions of a file: the head side, any recorded side, and the diff between them.

Each test's evidence describes the files as they were when *that test* was
recorded (its baseline): a store filled over many commits holds several versions
of one file. :class:`Versions` finds the bytes of a recorded version (by the
sha256 digest the recorder took, looked up at the commits that may hold it),
reads the head side, and diffs the two, caching every result by content so a
version shared by many tests is read, indexed and diffed once.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from fastci.changes.semantic_diff import CompileContext, FileDiff, diff_sources
from fastci.errors import GitError
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.types import Checksum, RelPath
from fastci.units.index import FileUnits, ParseFailure, index_source


def sha256(data: bytes) -> str:
    """The digest the recorder takes of a file (hex sha256 of its bytes)."""
    return hashlib.sha256(data).hexdigest()


class Versions:
    """Read and diff versions of files against ``head`` (a revision or the working tree)."""

    #: What other head files say about compiling a file's code (set by the change scan).
    compiles: CompileContext | None = None

    def __init__(self, git: Git, head: str) -> None:
        self.git = git
        self.head = head
        self._now: dict[RelPath, bytes | None] = {}
        self._index: dict[RelPath, FileUnits | ParseFailure | None] = {}
        self._at: dict[tuple[str, RelPath], bytes | None] = {}
        self._diffs: dict[tuple[RelPath, str | None], FileDiff] = {}
        self._since: dict[str, frozenset[RelPath] | None] = {}

    def now(self, path: RelPath) -> bytes | None:
        """The head side's bytes of ``path`` (None: absent)."""
        if path not in self._now:
            self._now[path] = self.git.read(self.head, path)
        return self._now[path]

    def digest_now(self, path: RelPath) -> str | None:
        """The head side's digest of ``path`` (None: absent)."""
        data = self.now(path)
        return None if data is None else sha256(data)

    def index_now(self, path: RelPath) -> FileUnits | ParseFailure | None:
        """The head side's unit index of ``path`` (None: absent)."""
        if path not in self._index:
            data = self.now(path)
            self._index[path] = None if data is None else index_source(path, data)
        return self._index[path]

    def checksums_now(self, path: RelPath) -> dict[str, Checksum] | None:
        """Unit id -> checksum at head; None when the file does not parse."""
        idx = self.index_now(path)
        if isinstance(idx, ParseFailure):
            return None
        return {u.id: u.checksum for u in idx.units} if idx is not None else {}

    def at(self, rev: str, path: RelPath) -> bytes | None:
        """The bytes of ``path`` at the commit ``rev`` (None: absent there)."""
        key = (rev, path)
        if key not in self._at:
            self._at[key] = self.git.read(rev, path)
        return self._at[key]

    def prefetch(self, rev: str, paths: Iterable[RelPath]) -> None:
        """Read the versions of ``paths`` at the commit ``rev`` that :meth:`at` will be
        asked for (and at a head commit, :meth:`now`'s), all in one git call each."""
        paths = list(paths)
        wanted = [p for p in paths if (rev, p) not in self._at]
        if len(wanted) > 1:
            for path, data in self.git.read_many(rev, wanted).items():
                self._at[(rev, path)] = data
        if self.head != WORKTREE:  # the head side is a commit too
            wanted = [p for p in paths if p not in self._now]
            if len(wanted) > 1:
                self._now.update(self.git.read_many(self.head, wanted))

    def find(self, path: RelPath, digest: str, revs: Iterable[str]) -> bytes | None:
        """The bytes of ``path`` whose digest is ``digest``, from the first of ``revs`` that
        holds them; None when none does (the version is not in the history)."""
        for rev in revs:
            try:
                data = self.at(rev, path)
            except GitError:
                # A revision this clone does not have (a shallow checkout, a calibration
                # or store made in another repository): it holds nothing we can read.
                continue
            if data is not None and sha256(data) == digest:
                return data
        return None

    def changed_since(self, rev: str) -> frozenset[RelPath] | None:
        """The paths that differ between the commit ``rev`` and the head side (both sides
        of a rename), from one ``git diff`` per ``rev`` (cached); None when ``rev`` is no
        commit of this clone (a ``dirty:`` stamp, a shallow checkout): then nothing can be
        said without comparing the files themselves."""
        if rev not in self._since:
            try:
                changes = self.git.changed_files(rev, self.head)
            except GitError:
                self._since[rev] = None
            else:
                self._since[rev] = frozenset(p for c in changes for p in (c.path, c.old_path)
                                             if p)
        return self._since[rev]

    def diff(self, path: RelPath, old: bytes | None) -> FileDiff:
        """The semantic diff from ``old`` (None: absent) to the head side of ``path``."""
        key = (path, None if old is None else sha256(old))
        if key not in self._diffs:
            new = self.now(path)
            status = "A" if old is None else "D" if new is None else "M"
            self._diffs[key] = diff_sources(path, old, new, status=status,
                                            compiles=self.compiles)
        return self._diffs[key]
