"""Reading a trace's units back, for tests (ingest reads the columns whole)."""

from __future__ import annotations

from typing import Any

from fastci.evidence.record import trace as t


def file_units(trace: Any, ft: Any) -> list[tuple[str, str, list[str]]]:
    """The units of ``ft`` (a file of ``trace`` or of one of its segments), either
    format, as (qualname, recorded checksum, context signatures): for people and
    tests (ingest reads the columns whole, :class:`fastci.evidence.store.ingest.TraceUnits`)."""
    contexts = list(trace.contexts)
    flat = t.u32_column(trace.set_contexts).tolist()
    starts = [0]
    for n in t.u32_column(trace.set_sizes).tolist():
        starts.append(starts[-1] + n)
    sets = [[contexts[i] for i in flat[a:b]] for a, b in zip(starts, starts[1:])]
    quals = t.names(ft.qualnames)
    checksums = t.names(ft.checksums) or [""] * len(quals)
    out = [(q, c, sets[i]) for q, c, i in zip(quals, checksums, t.u32_column(ft.unit_sets).tolist())]
    out += [(u.qualname, u.checksum, [contexts[i] for i in u.contexts if i < len(contexts)])
            for u in ft.units]
    return out
