"""Stage 3, changes: two revisions (or the working tree) in, a ``ChangeSet`` out.

``semantic_diff`` compares
two versions of a file unit by unit and says what kind of change each unit saw,
with ``fast_diff`` re-hashing only the units whose text changed. ``scan`` combines
the diff with the evidence's recorded checksums into the ``ChangeSet`` that
selection reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastci import lazy_exports

if TYPE_CHECKING:
    from fastci.changes.semantic_diff import (
        ChangeKind as ChangeKind,
        UnitChange as UnitChange,
        FileDiff as FileDiff,
        diff_sources as diff_sources,
    )
    from fastci.changes.scan import (
        ChangeSet as ChangeSet,
        scan as scan,
    )

__all__ = [
    "ChangeKind",
    "UnitChange",
    "FileDiff",
    "diff_sources",
    "ChangeSet",
    "scan",
]

__getattr__ = lazy_exports(__name__, {
    "ChangeKind": "fastci.changes.semantic_diff",
    "UnitChange": "fastci.changes.semantic_diff",
    "FileDiff": "fastci.changes.semantic_diff",
    "diff_sources": "fastci.changes.semantic_diff",
    "ChangeSet": "fastci.changes.scan",
    "scan": "fastci.changes.scan",
})
