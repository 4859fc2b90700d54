"""Merging the traces of one test run into one :class:`~fastci.evidence.store.db.RunEvidence`.

A run's traces (its main process and the children it started) merge into one run
(:func:`merge_run`): units with the checksums :class:`Checksums` computes from the
source tree the traces name by sha256, their context sets as columns
(:class:`TraceUnits`), files read and run, distributions, and the *segments* the
traces name in ``shared`` with every segment those include (:func:`segment_closure`);
a named segment found in no trace makes the run incomplete (so selection runs the
test). :mod:`fastci.evidence.store.ingest` groups traces into runs and stores them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from fastci.evidence.record import trace
from fastci.evidence.record.traced import TRACED_BY_DYNAMO, TRACED_FRAMES_KEY
from fastci.evidence.store.columns import Rows, UnitTable, small_set_keys
from fastci.evidence.store.db import INCOMPLETE_KEY, RunEvidence
from fastci.types import Outcome, is_failure
from fastci.units.index import ChecksumCache, FileUnits, UnitCache, index_source

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class TestResult:
    """A test's result from the runner (Bazel's build event file): it beats the trace's."""

    outcome: str  # passed | failed | error (Bazel's verdict on the target)
    duration_s: float


class Checksums:
    """Unit checksums of the files traces name, computed from the source tree at ingest.

    A file is indexed only if its current sha256 equals the one recorded in the
    trace; otherwise (the file changed since recording) its units get the empty
    checksum, which never equals a real one, so selection treats them as changed.
    With ``caches`` (:func:`~fastci.integrations.git.repository.cache_dir`: git's own
    directory, where no commit can put a forged cache) known contents come from its
    ``checksums.cache``, and the larger ``units.cache`` (whole indexes) is loaded only
    when a file is missing from it.
    """

    def __init__(self, root: Path | None, *, caches: Path | None = None) -> None:
        self.root = root
        self._caches = caches
        self._cache: UnitCache | None = None  # loaded at the first file sums lack
        self.sums = ChecksumCache(caches / "checksums.cache") if caches else None
        self._memo: dict[tuple[str, str], dict[str, str]] = {}

    def _unit_cache(self) -> UnitCache | None:
        if self._cache is None and self._caches is not None:
            self._cache = UnitCache(self._caches / "units.cache")
        return self._cache

    def of(self, path: str, digest: str) -> dict[str, str]:
        """Qualname -> checksum for ``path`` as recorded (empty if unknown)."""
        key = (path, digest)
        if key not in self._memo:
            self._memo[key] = self._compute(path, digest)
        return self._memo[key]

    def save(self) -> None:
        """Write what the caches learnt (never raises)."""
        if self.sums is not None:
            self.sums.save()
        if self._cache is not None:
            self._cache.save()

    def _compute(self, path: str, digest: str) -> dict[str, str]:
        if self.root is None or not digest:
            return {}
        try:
            data = (self.root / path).read_bytes()
        except OSError:
            return {}
        if hashlib.sha256(data).hexdigest() != digest:
            LOG.info("%s changed since it was recorded: its units get no checksum", path)
            return {}
        known = self.sums.get(path, digest) if self.sums is not None else None
        if known is not None:
            return known
        cache = self._unit_cache()
        result = cache.get(path, digest) if cache else None
        if result is None:
            result = index_source(path, data)
            if cache:
                cache.put(path, digest, result)
        if not isinstance(result, FileUnits):
            return {}
        sums = {u.qualname: u.checksum for u in result.units}
        if self.sums is not None:
            self.sums.put(path, digest, sums)
        return sums


#: Segment key -> the segments of that key and the traces that hold them.
Segments = Mapping[str, list[tuple[trace.TraceMsg, Any]]]


def index_segments(traces: Iterable[trace.TraceMsg]) -> dict[str, list[tuple[trace.TraceMsg, Any]]]:
    """Every segment the traces define, by key."""
    out: dict[str, list[tuple[trace.TraceMsg, Any]]] = {}
    for t in traces:
        for seg in t.segments:
            out.setdefault(seg.key, []).append((t, seg))
    return out


def segment_closure(keys: Iterable[str], segments: Segments) -> tuple[list[str], list[str]]:
    """The segments ``keys`` name and those they include (transitively): (found, missing)."""
    found: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    todo = sorted(set(keys))
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        defs = segments.get(key)
        if not defs:
            missing.append(key)
            continue
        found.append(key)
        for _t, seg in defs:
            todo.extend(k for k in seg.includes if k not in seen)
    return sorted(found), sorted(missing)


class TraceUnits:
    """Reads the units of traces into rows of one :class:`~fastci.evidence.store.columns.UnitTable`
    (one per ingest): a file's rows and each trace's context sets are worked out with a
    few calls per file, not per unit (trace format 2 holds units as columns)."""

    def __init__(self, checksums: Checksums | None = None) -> None:
        self.checksums = checksums
        self.table = UnitTable()
        # (path, digest) -> qualname -> row: the checksums come from the file as
        # recorded, so a unit of the same bytes has the same row in every trace.
        self._files: dict[tuple[str, str], dict[str, int]] = {}
        # id(trace) -> (the trace, the rows of its context sets), for traces with
        # segments (read for every run that names them; a plain trace is read once and
        # not kept).
        self._sets: dict[int, tuple[trace.TraceMsg, npt.NDArray[np.int64]]] = {}

    def _known(self, path: str, digest: str) -> Mapping[str, str]:
        return self.checksums.of(path, digest) if self.checksums else {}

    def set_rows(self, t: trace.TraceMsg) -> npt.NDArray[np.int64]:
        """The table rows of ``t``'s context sets (``Trace.set_sizes``), in its order."""
        got = self._sets.get(id(t))
        if got is not None and got[0] is t:
            return got[1]
        sizes = trace.u32_column(t.set_sizes).astype(np.int64)
        rows = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes):
            numbers = self.table.sig_numbers(list(t.contexts))
            flat = numbers[trace.u32_column(t.set_contexts)]
            starts = np.cumsum(sizes) - sizes
            small = sizes <= 2  # most sets: one integer key each, looked up all at once
            rows[small] = self.table.small_sets(
                small_set_keys(sizes[small], starts[small], flat.astype(np.uint64)))
            for k in np.unique(sizes[~small]).tolist():
                which = np.flatnonzero(sizes == k)
                # each set's numbers, ascending, as one bytes key: all sets of k at once
                block = flat[starts[which][:, None] + np.arange(k)].astype("<u4")
                block.sort(axis=1)
                keys = block.view(np.dtype((np.void, 4 * k))).ravel().tolist()
                rows[which] = self.table.keyed_sets(keys)
        if len(t.segments):
            self._sets[id(t)] = (t, rows)
        return rows

    def file_rows(self, t: trace.TraceMsg, files: Sequence[Any]) -> tuple[Rows, Rows]:
        """Rows and context-set rows of the units of ``files``, files of trace ``t``."""
        table = self.table
        rows: list[int] = []
        used: list[bytes] = []
        old: list[Any] = []  # format 1's units, one message each
        for ft in files:
            path, digest = ft.path, ft.digest
            quals = trace.names(ft.qualnames)
            used.append(ft.unit_sets)
            if ft.checksums:
                known = self._known(path, digest)
                rows += [table.row(f"{path}::{q}", c or known.get(q, ""))
                         for q, c in zip(quals, trace.names(ft.checksums))]
            else:  # what the recorder writes: ingest computes the checksums
                rows_of = self._files.get((path, digest))
                if rows_of is None:
                    rows_of = self._files[(path, digest)] = {}
                got = list(map(rows_of.get, quals))
                if None in got:
                    known = self._known(path, digest)
                    for i, (q, row) in enumerate(zip(quals, got)):
                        if row is None:
                            got[i] = rows_of[q] = table.row(f"{path}::{q}", known.get(q, ""))
                rows += got  # type: ignore[arg-type]
            if len(ft.units):
                old.append(ft)
        sets = self.set_rows(t)[trace.u32_column(b"".join(used))]
        if old:
            contexts = list(t.contexts)
            extra: list[int] = []
            for ft in old:
                known = self._known(ft.path, ft.digest)
                rows += [table.row(f"{ft.path}::{u.qualname}",
                                   u.checksum or known.get(u.qualname, "")) for u in ft.units]
                extra += [table.set_row(frozenset(contexts[i] for i in u.contexts
                                                  if i < len(contexts))) for u in ft.units]
            sets = np.concatenate([sets, np.array(extra, dtype=np.int64)])
        return np.array(rows, dtype=np.uint32), sets.astype(np.uint32)


def _add_files(parts: list[tuple[Rows, Rows]], files: dict[str, str], sources: dict[str, str],
               t: trace.TraceMsg, file_traces: Iterable[Any], reads: Iterable[Any],
               units: TraceUnits) -> None:
    file_traces = list(file_traces)
    for ft in file_traces:
        if ft.digest:
            # Two processes of one run that saw different bytes of a file: the
            # evidence describes neither version alone, so the baseline is unknown.
            sources[ft.path] = ft.digest if sources.get(ft.path, ft.digest) == ft.digest else ""
    parts.append(units.file_rows(t, file_traces))
    for fr in reads:
        files[fr.path] = fr.digest


def merge_run(traces: list[trace.TraceMsg], *, source: str, commit: str | None,
              result: TestResult | None = None, checksums: Checksums | None = None,
              segments: Segments | None = None, units: TraceUnits | None = None) -> RunEvidence:
    """Merge the traces of one run (main process + children) and the segments they
    name (``shared``, with what those include; see :func:`segment_closure`) into one record.

    ``units``: the reader of units an ingest shares between its runs (its own
    otherwise, on ``checksums``); the record's units are columns of its table.
    """
    main = next((t for t in traces if t.role == "main"), None)
    first = main or traces[0]
    reader = units or TraceUnits(checksums)
    parts: list[tuple[Rows, Rows]] = []
    files: dict[str, str] = {}
    sources: dict[str, str] = {}
    distributions: dict[str, str] = {}
    for t in traces:
        _add_files(parts, files, sources, t, t.files, t.reads, reader)
        # Trace field 22 (older traces lack it: no distribution is known, so none is
        # narrowed to; dependency changes then reach these tests through other rules).
        for d in getattr(t, "distributions", ()):
            distributions[d.name] = d.version
    found, missing = segment_closure((k for t in traces for k in t.shared), segments or {})
    for key in found:
        for t, seg in (segments or {})[key]:
            _add_files(parts, files, sources, t, seg.files, seg.reads, reader)
    if missing:
        LOG.warning("%s: %d shared evidence segment(s) not found (e.g. %s): recorded as "
                    "incomplete", first.test_id, len(missing), missing[0])
    # Reasons a process gave for evidence it knows is partial (trace field 25: a Python
    # child that left no trace, backward passes on device threads); each once, in order.
    unseen = list(dict.fromkeys(r for t in traces for r in getattr(t, "incomplete_reasons", ())))
    complete = main is not None and all(t.complete for t in traces) and not missing \
        and not unseen
    outcome = main.outcome if main is not None and main.complete else "error"
    duration = main.duration_s if main is not None else 0.0
    if result is not None:
        # Bazel says a target passed; the pytest inside it knows the finer word
        # (xfailed, xpassed, skipped, none a failure): keep it. A failure Bazel reports wins.
        keep = result.outcome == Outcome.PASSED.value and not is_failure(outcome)
        outcome, duration = (outcome if keep else result.outcome), result.duration_s or duration
    env = first.environment
    return _traced_frames(traces, RunEvidence(
        test=first.test_id, run_key=f"{first.test_id}@{first.run_id}", outcome=outcome,
        complete=complete, duration_s=duration, gpus=first.gpus,
        workload=json.loads(first.workload_json or "{}"),
        overrides=json.loads(first.overrides_json) if first.overrides_json else None,
        recorded_at=min(t.started_at for t in traces), env_fingerprint=env.fingerprint,
        environment={"python": env.python, "platform": env.platform,
                     "packages": env.packages_digest, "torch": env.torch, "cuda": env.cuda,
                     "gpu": env.gpu_model, "base_fingerprint": env.base_fingerprint,
                     # Stored once per fingerprint (the store's env_listing), not per run.
                     "packages_list": env.packages_list,
                     **({INCOMPLETE_KEY: "; ".join(unseen)} if unseen else {})},
        commit=commit, source=source,
        units=reader.table.merge(parts), files=files,
        sources=sources, distributions=distributions))


def _traced_frames(traces: list[trace.TraceMsg], run: RunEvidence) -> RunEvidence:
    """Say in the run's environment whether every process of it recorded the frames dynamo
    traced (trace format 3): only then can a rule read its evidence as complete for
    compiled code (:mod:`fastci.select.compiled`)."""
    if traces and all(t.format_version >= trace.TRACED_FRAMES_FORMAT for t in traces):
        return dataclasses.replace(run, environment={**run.environment,
                                                     TRACED_FRAMES_KEY: TRACED_BY_DYNAMO})
    return run
