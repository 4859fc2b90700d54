"""Stage 1, code units: Python source in, units with semantic checksums out.

A unit is a function or method body, a class body or a module's top level, named
``path::qualname``. ``index`` parses with the stdlib ``ast`` and gives checksums that ignore
layout, comments and docstrings (and caches them by content digest); ``lines``
maps executed lines to units with the stdlib ``ast`` only, cheap enough for every
test process that records evidence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastci import lazy_exports

if TYPE_CHECKING:
    from fastci.units.index import (
        Unit as Unit,
        FileUnits as FileUnits,
        index_source as index_source,
        index_files as index_files,
        index_tree as index_tree,
        unit_id as unit_id,
        split_unit_id as split_unit_id,
        UnitCache as UnitCache,
    )
    from fastci.units.lines import (
        MODULE_QUALNAME as MODULE_QUALNAME,
        UnitKind as UnitKind,
        LineIndex as LineIndex,
        ParseFailure as ParseFailure,
        line_index as line_index,
    )

__all__ = [
    "Unit",
    "FileUnits",
    "index_source",
    "index_files",
    "index_tree",
    "unit_id",
    "split_unit_id",
    "UnitCache",
    "MODULE_QUALNAME",
    "UnitKind",
    "LineIndex",
    "ParseFailure",
    "line_index",
]

__getattr__ = lazy_exports(__name__, {
    "Unit": "fastci.units.index",
    "FileUnits": "fastci.units.index",
    "index_source": "fastci.units.index",
    "index_files": "fastci.units.index",
    "index_tree": "fastci.units.index",
    "unit_id": "fastci.units.index",
    "split_unit_id": "fastci.units.index",
    "UnitCache": "fastci.units.index",
    "MODULE_QUALNAME": "fastci.units.lines",
    "UnitKind": "fastci.units.lines",
    "LineIndex": "fastci.units.lines",
    "ParseFailure": "fastci.units.lines",
    "line_index": "fastci.units.lines",
})
