"""A recording's measured lines and calls as the trace's file entries.

:func:`read_lines` takes executed lines (and arcs) per repository file from
coverage.py's data, the test's and each segment's; :func:`fill_files` writes each
file with its sha256, the units that ran (by line ownership, or by the qualnames of
the call events the contexts plug-in saw) and their context sets. Digests and line
indexes are kept per process, so recording test after test re-reads and re-parses
only the files that changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

from fastci.evidence.record import trace
from fastci.evidence.record.files import PathMapper
from fastci.units import lines as units_mod

# In-process cache: (path, sha256) -> line index, so per-test recording re-parses nothing.
_INDEX_CACHE: dict[tuple[str, str], units_mod.LineIndex | None] = {}
# File digests by path with their stat stamp.
_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}


def read_lines(data: Any, mapper: PathMapper, lines: dict[str, list[int]],
               seg_lines: dict[str, dict[str, list[int]]],
               arcs: dict[str, list[tuple[int, int]]] | None = None) -> None:
    """Executed lines by repo path from coverage ``data``: the test's, and each segment's.

    With ``arcs`` and branch data, the executed arcs too (all of the file's, the
    segments' included: coverage.py keeps arcs per context, which is not read here).
    """
    has_arcs = arcs is not None and data.has_arcs()
    for fname in data.measured_files():
        rel = mapper.rel(fname)
        if rel is None:
            continue
        if has_arcs and arcs is not None:
            got_arcs = data.arcs(fname) or []
            if got_arcs:
                arcs.setdefault(rel, []).extend(got_arcs)
        if not seg_lines:
            got = data.lines(fname) or []
            # A reused engine names every file a plug-in traced since it was built (its
            # tracer table outlives erase()): one with no lines now is not this test's.
            if got or not data.file_tracer(fname):
                lines.setdefault(rel, []).extend(got)
            continue
        for line, labels in data.contexts_by_lineno(fname).items():
            for label in labels:
                target = seg_lines[label] if label in seg_lines else lines
                target.setdefault(rel, []).append(line)


def _digest(local: Path) -> tuple[str, bytes | None]:
    """sha256 of a file, and its bytes when they were read; ``("", None)`` if unreadable.

    The digest is kept per file with its (mtime_ns, size, inode) stamp, like git's
    index: a file the tests did not touch is not read and hashed again at every stop.
    """
    try:
        st = os.stat(local)
    except OSError:
        return "", None
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    hit = _DIGESTS.get(str(local))
    if hit is not None and hit[0] == stamp:
        return hit[1], None
    try:
        data = local.read_bytes()
    except OSError:
        return "", None
    digest = hashlib.sha256(data).hexdigest()
    _DIGESTS[str(local)] = (stamp, digest)
    return digest, data


def _is_unit_qualname(qualname: str) -> bool:
    """Whether a code object's qualname names a unit (a def or class, or the module).

    The call events of lambdas, comprehensions and generator expressions
    (``f.<locals>.<lambda>``) are not units of their own: the unit around them ran
    too. The same answer as membership in :func:`~fastci.units.lines.line_index`'s
    qualnames for code compiled from the file, without parsing it.
    """
    last = qualname.rsplit(".", 1)[-1]
    return qualname == units_mod.MODULE_QUALNAME or not last.startswith("<")


def _cached_index(mapper: PathMapper, rel: str) -> tuple[units_mod.LineIndex | None, str]:
    """The file's digest, and its line index only if this process has it already."""
    local = mapper.local_path(rel)
    if local is None:
        return None, ""
    digest, _ = _digest(local)
    return (_INDEX_CACHE.get((rel, digest)) if digest else None), digest


def unit_index(mapper: PathMapper, rel: str) -> tuple[units_mod.LineIndex | None, str]:
    """The file's line index (which unit owns each line; None: unparsable) and digest,
    parsed once per (path, sha256) in this process; ``(None, "")`` if unreadable."""
    local = mapper.local_path(rel)
    if local is None:
        return None, ""
    digest, data = _digest(local)
    if not digest:
        return None, ""
    key = (rel, digest)
    if key not in _INDEX_CACHE:
        if data is None:
            try:
                data = local.read_bytes()
            except OSError:
                return None, ""
            if hashlib.sha256(data).hexdigest() != digest:  # changed since it was stamped
                _DIGESTS.pop(str(local), None)
                return unit_index(mapper, rel)
        result = units_mod.line_index(rel, data)
        _INDEX_CACHE[key] = result if isinstance(result, units_mod.LineIndex) else None
    return _INDEX_CACHE[key], digest


def fill_files(mapper: PathMapper, files: Any,
               lines: Mapping[str, list[int]],
               ctx: Mapping[tuple[str, str], tuple[set[str], int]],
               table: trace.ContextTable,
               arcs: Mapping[str, list[tuple[int, int]]] | None = None) -> None:
    """Add executed files, their units (by line ownership) and contexts to ``files``.

    ``files`` is ``msg.files`` or a segment's; context signatures and sets of them
    are interned in ``table`` (the trace's, shared by the calls; the caller closes
    it). Units are written as columns (trace format 2). Checksums are left out:
    ``fastci ingest`` computes them from the file whose sha256 the trace names
    (libcst is too slow for every test process).
    """
    by_file: dict[str, dict[str, tuple[set[str], int]]] = {}
    for (rel, qual), (sigs, calls) in ctx.items():
        by_file.setdefault(rel, {})[qual] = (sigs, calls)
    for rel in sorted(set(lines) | set(by_file)):
        if lines.get(rel):
            index, digest = unit_index(mapper, rel)
        else:  # units from call events only: no line ownership needed, no parse
            index, digest = _cached_index(mapper, rel)
        file_ctx = by_file.get(rel, {})
        owned: set[str] = set()
        if index is not None:
            known = set(index.qualnames)
            owned.update(index.qualname_for_line(n) for n in lines.get(rel, []))
            owned.update(q for q in file_ctx if q in known)
        elif digest and not lines.get(rel):
            owned.update(q for q in file_ctx if _is_unit_qualname(q))
        else:  # unparsable or unreadable: keep what ran, as the module
            owned.add(units_mod.MODULE_QUALNAME)
        ft = trace.write_file(files, rel, digest, (
            (q, table.set_of(file_ctx.get(q, (set(), 0))[0])) for q in sorted(owned)))
        ft.line_deltas.extend(trace.delta_encode(lines.get(rel, [])))
        for a, b in sorted(set(arcs.get(rel, ()))) if arcs else ():
            ft.arcs.extend((a, b))
