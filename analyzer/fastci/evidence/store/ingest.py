"""Merge trace files into the evidence store.

Traces come from a pytest trace directory or from ``bazel-testlogs`` (loose
files under ``test.outputs/`` or inside ``test.outputs/outputs.zip``). The
traces of one run (same test id and run id: the main process and its
children) merge into one :class:`~fastci.evidence.store.db.RunEvidence`, with
the *segments* its traces name in ``shared`` (evidence shared by several
tests of a pytest session: collection, fixtures above function scope) and
every segment those include; a named segment found in no trace makes the run
incomplete (so selection runs the test). The
newest run of a test wins in the store; a run ingested before is skipped, so
ingesting the same traces twice changes nothing. A corrupt or truncated trace
is reported with its path and skipped; its test, when known, gets an
incomplete run (so selection always runs it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from fastci.errors import TraceError
from fastci.evidence.record import trace
from fastci.evidence.store.columns import MirrorTable, Rows, UnitColumns, UnitTable, small_set_keys
from fastci.evidence.store.db import INCOMPLETE_KEY, EvidenceStore, RunEvidence
from fastci.evidence.record.traced import TRACED_BY_DYNAMO, TRACED_FRAMES_KEY
from fastci.integrations.git.repository import cache_dir
from fastci.types import Outcome, is_failure
from fastci.units.index import ChecksumCache, FileUnits, UnitCache, index_source

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceBlob:
    """The bytes of one trace file and where they came from."""

    origin: str  # path, or "archive.zip!member"
    data: bytes
    test_hint: str | None = None  # test id known from the location (bazel-testlogs)


@dataclass(frozen=True)
class TestResult:
    """A test's result from the runner (Bazel's build event file): it beats the trace's."""

    outcome: str  # passed | failed | error (Bazel's verdict on the target)
    duration_s: float


_BAZEL_ERRORS = frozenset({"NO_STATUS", "FAILED_TO_BUILD", "TOOL_HALTED_BEFORE_TESTING",
                           "INCOMPLETE", "REMOTE_FAILURE"})


def results_from_bep(path: Path) -> dict[str, TestResult]:
    """Outcomes and durations per label from a build event JSON file (fastci.integrations.bazel.bep)."""
    from fastci.integrations.bazel.bep import parse_bep

    report = parse_bep(path)
    out = {}
    for label, o in report.outcomes.items():
        outcome = "passed" if o.passed else "error" if o.status in _BAZEL_ERRORS else "failed"
        out[label] = TestResult(outcome, o.duration_s)
    return out


@dataclass
class IngestReport:
    """What an ingest did, for the command's summary."""

    traces: int = 0
    runs_added: int = 0
    runs_skipped: int = 0
    corrupt: list[str] = field(default_factory=list)
    incomplete_tests: set[str] = field(default_factory=set)
    tests: set[str] = field(default_factory=set)
    #: Origins of the traces that decoded and are now in the store (a corrupt one is
    #: never listed): what :func:`fastci.evidence.record.trace.remove_ingested` may delete.
    ingested: list[str] = field(default_factory=list)


def label_from_testlogs(path: Path, testlogs: Path) -> str | None:
    """``bazel-testlogs/pkg/name[/shard_1_of_2]/test.outputs/...`` -> ``//pkg:name``."""
    try:
        parts = path.relative_to(testlogs).parts
    except ValueError:
        return None
    if "test.outputs" not in parts:
        return None
    head = list(parts[: parts.index("test.outputs")])
    while head and (head[-1].startswith(("shard_", "run_", "attempt_"))):
        head.pop()
    if not head:
        return None
    return f"//{'/'.join(head[:-1])}:{head[-1]}"


def find_traces(paths: Iterable[Path]) -> Iterator[TraceBlob]:
    """Yield every trace under ``paths`` (files, directories, ``outputs.zip`` archives)."""
    for root in paths:
        root = Path(root)
        if root.is_file():
            yield from _from_file(root, None)
            continue
        for p in sorted(root.rglob("*"), key=_parts):  # (Path's own < is slow)
            if p.name.endswith(trace.SUFFIX) and not p.name.startswith(".tmp-") or \
                    p.name == "outputs.zip":
                yield from _from_file(p, label_from_testlogs(p, root))


def _parts(p: Path) -> tuple[str, ...]:
    return p.parts


def _from_file(p: Path, hint: str | None) -> Iterator[TraceBlob]:
    if p.suffix == ".zip":
        try:
            with zipfile.ZipFile(p) as zf:
                for name in sorted(zf.namelist()):
                    if name.endswith(trace.SUFFIX) and not Path(name).name.startswith(".tmp-"):
                        yield TraceBlob(f"{p}!{name}", zf.read(name), hint)
        except (zipfile.BadZipFile, OSError) as exc:
            yield TraceBlob(str(p), b"", hint)  # reported as corrupt by decode
            LOG.warning("%s: unreadable outputs archive (%s)", p, exc)
        return
    try:
        yield TraceBlob(str(p), p.read_bytes(), hint)
    except OSError as exc:
        LOG.warning("%s: cannot read (%s)", p, exc.strerror)
        yield TraceBlob(str(p), b"", hint)


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


def ingest(store: EvidenceStore, blobs: Iterable[TraceBlob], *, source: str,
           commit: str | None, results: Mapping[str, TestResult] | None = None,
           root: Path | None = None, only: set[str] | None = None,
           jobs: int | None = None) -> IngestReport:
    """Parse, group and merge trace blobs into ``store`` in one batch
    (:meth:`~fastci.evidence.store.db.EvidenceStore.ingest_many`: one transaction, each
    touched posting list written once; runs are merged one at a time as the batch reads
    them).

    Traces are grouped into runs by their headers; a trace is decoded whole when its
    run is merged (one that holds segments, at once), and one that fails then is
    handled as one that failed at first: reported, its test given an incomplete run.
    Every trace's bytes are held until the end (950 MB for 100,000 tests), the
    decoded traces are not.

    ``root`` is the source tree the traces were recorded from (checksums are
    computed there, cached in :func:`~fastci.integrations.git.repository.cache_dir`:
    git's own directory, where no commit can put a forged cache; see
    :class:`Checksums`). With ``only``, testlogs of other tests are ignored
    (``bazel-testlogs`` keeps the outputs of tests that did not run in the last
    invocation). ``jobs``: processes that merge runs while this one stores them
    (:func:`worker_count`; ``None``: one per CPU).
    """
    report = IngestReport()
    checksums = Checksums(root, caches=cache_dir(root) if root is not None else None)
    results = results or {}
    grouped = _group(blobs, report, only=only, results=results, commit=commit, source=source)
    ordered = sorted(grouped.runs.items())
    jobs = worker_count(jobs, len(ordered))
    work = (checksums, index_segments(grouped.holders), source, commit, results)
    done = _merged_in_workers(ordered, jobs, work) if jobs > 1 else \
        _merged_here(ordered, TraceUnits(checksums), work)
    failed: set[str] = set()
    merged = _stored_runs(done, report, failed, results=results, commit=commit, source=source)
    added = store.ingest_many(itertools.chain(grouped.corrupt, merged))
    _count_added(report, added, len(grouped.corrupt))
    checksums.save()  # (what workers learnt stays with them: the next ingest learns it)
    report.ingested = [o for o in grouped.origins if o not in failed]  # once every run is stored
    return report


@dataclass
class _Grouped:
    """Ingest's first pass: traces grouped into runs by their headers (``runs``), the
    decoded traces that hold segments (``holders``), every readable trace's origin, and
    the incomplete runs of traces whose header did not decode (``corrupt``)."""

    runs: dict[tuple[str, str], list[_Pending]] = field(default_factory=dict)
    holders: list[trace.TraceMsg] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    corrupt: list[RunEvidence] = field(default_factory=list)


def _group(blobs: Iterable[TraceBlob], report: IngestReport, *, only: set[str] | None,
           results: Mapping[str, TestResult], commit: str | None, source: str) -> _Grouped:
    """Read each blob's header and group the traces into runs (see :class:`_Grouped`);
    a trace that holds segments, or a shared one, is decoded whole at once."""
    out = _Grouped()
    for blob in blobs:
        if only is not None and blob.test_hint is not None and blob.test_hint not in only:
            continue
        report.traces += 1
        try:
            head = trace.decode_head(blob.data, origin=blob.origin)
            msg = trace.decode(blob.data, origin=blob.origin) \
                if head.role == "shared" or len(head.segments) else None
        except TraceError as exc:
            test = blob.test_hint or trace.test_id_from_name(Path(blob.origin.split("!")[-1]).name)
            run = _corrupt_run(report, str(exc), test, blob.origin,
                               hashlib.sha256(blob.data).hexdigest()[:16], results, commit, source)
            if run is not None:
                out.corrupt.append(run)
            continue
        out.origins.append(blob.origin)
        if msg is not None:
            out.holders.append(msg)
        if head.role != "shared":  # a shared trace only holds segments for others
            out.runs.setdefault((head.test_id, head.run_id), []).append(
                _Pending(blob.origin, b"" if msg is not None else blob.data, msg))
    return out


def _stored_runs(done: Iterable[_Merged], report: IngestReport, failed: set[str], *,
                 results: Mapping[str, TestResult], commit: str | None,
                 source: str) -> Iterator[RunEvidence]:
    """The merged runs to store, in order, each trace that failed to decode when its run
    was merged reported (its origin added to ``failed``) and given an incomplete run."""
    for test, rec, broken in done:
        for origin, message, digest in broken:
            failed.add(origin)
            run = _corrupt_run(report, message, test, origin, digest, results, commit, source)
            if run is not None:
                yield run
        if rec is None:
            continue
        report.tests.add(rec.test)
        if not rec.complete:
            report.incomplete_tests.add(rec.test)
        yield rec


def _count_added(report: IngestReport, added: Sequence[bool], corrupt: int) -> None:
    """Count what the store added: the first ``corrupt`` runs are the undecodable
    traces' (added, never "already known"); each other run is added or was known."""
    report.runs_added += sum(added[:corrupt])
    for new in added[corrupt:]:
        if new:
            report.runs_added += 1
        else:
            report.runs_skipped += 1


@dataclass(frozen=True)
class _Pending:
    """One trace of a run, as ingest's first pass leaves it: its bytes, decoded when the
    run is merged, or the decoded trace (one that holds segments is decoded at once)."""

    origin: str
    data: bytes
    msg: trace.TraceMsg | None = None


def _corrupt_run(report: IngestReport, message: str, test: str | None, origin: str,
                 digest: str, results: Mapping[str, TestResult], commit: str | None,
                 source: str) -> RunEvidence | None:
    """Report a trace that does not decode; the run that makes its test (when known)
    incomplete, so selection runs it."""
    report.corrupt.append(message)
    LOG.warning("%s (skipped)", message)
    if not test:
        return None
    report.incomplete_tests.add(test)
    report.tests.add(test)
    res = results.get(test)
    return RunEvidence(
        test=test, run_key=f"{test}@corrupt-{digest}", outcome=res.outcome if res else "error",
        complete=False, duration_s=res.duration_s if res else 0.0, gpus=0, workload={},
        recorded_at=_mtime(origin), commit=commit, source=source)


#: A merged run: its test, the run (None: no trace of it decoded), and per trace that
#: did not decode, its origin, the error and a digest of its bytes.
_Merged = tuple[str, RunEvidence | None, list[tuple[str, str, str]]]


def _merged_here(ordered: list[tuple[tuple[str, str], list[_Pending]]], reader: TraceUnits,
                 work: tuple[Any, ...]) -> Iterator[_Merged]:
    """The runs of ``ordered`` merged in this process, in order."""
    for (test, _run), pending in ordered:
        yield _merge_pending(test, pending, reader, work)


def _merge_pending(test: str, pending: list[_Pending], reader: TraceUnits,
                   work: tuple[Any, ...]) -> _Merged:
    """Decode the traces of one run and merge those that decode."""
    checksums, segments, source, commit, results = work
    traces: list[trace.TraceMsg] = []
    broken: list[tuple[str, str, str]] = []
    for p in pending:
        try:
            traces.append(p.msg if p.msg is not None else trace.decode(p.data, origin=p.origin))
        except TraceError as exc:
            broken.append((p.origin, str(exc), hashlib.sha256(p.data).hexdigest()[:16]))
    rec = merge_run(traces, source=source, commit=commit, result=results.get(test),
                    checksums=checksums, segments=segments, units=reader) if traces else None
    return test, rec, broken


# ------------------------------------------------------------------ merging in workers

#: Runs a worker merges per task (results come back in the order of the runs).
TASK_RUNS = 200
#: Fewer runs than this are merged in this process: starting workers costs more.
PARALLEL_FROM = 4000
#: What forked workers inherit: the runs in order, then (checksums, segments, source,
#: commit, results). Set only while a pool runs.
_SHARED: tuple[list[tuple[tuple[str, str], list[_Pending]]], tuple[Any, ...]] | None = None
_READER: TraceUnits | None = None  # a worker's reader (its table), made at its first task
_SENT = [0, 0]  # how many of its table's keys and sets a worker has sent


def worker_count(jobs: int | None, runs: int) -> int:
    """How many worker processes merge ``runs`` runs: ``jobs`` (``None``: one per CPU this
    process may use); 0 (merge here) below :data:`PARALLEL_FROM` runs, with one CPU, or
    where processes cannot be forked."""
    import multiprocessing

    if jobs is None:
        try:
            jobs = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            jobs = os.cpu_count() or 1
    if jobs <= 1 or runs < PARALLEL_FROM or \
            "fork" not in multiprocessing.get_all_start_methods():
        return 0
    return jobs


_Sent = tuple[str, dict[str, Any] | None, bytes, bytes, list[tuple[str, str, str]]]


def _merge_task(span: tuple[int, int]) -> tuple[int, list[_Sent], list[tuple[str, str]],
                                                 list[frozenset[str]]]:
    """In a worker: merge runs ``span`` of :data:`_SHARED`; return them with their units as
    rows of the worker's table, and the keys and sets that table gained since the last
    task (the parent mirrors it, so the rows mean the same there)."""
    global _READER
    assert _SHARED is not None
    ordered, work = _SHARED
    if _READER is None:
        _READER = TraceUnits(work[0])
    out: list[_Sent] = []
    for (test, _run), pending in ordered[span[0]:span[1]]:
        _, rec, broken = _merge_pending(test, pending, _READER, work)
        if rec is None:
            out.append((test, None, b"", b"", broken))
            continue
        cols = rec.units
        assert isinstance(cols, UnitColumns)
        fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)
                  if f.name != "units"}
        out.append((test, fields, cols.rows.tobytes(), cols.sets.tobytes(), broken))
    table = _READER.table
    keys, sets = table.keys[_SENT[0]:], table.sets[_SENT[1]:]
    _SENT[:] = [len(table.keys), len(table.sets)]
    return os.getpid(), out, keys, sets


def _merged_in_workers(ordered: list[tuple[tuple[str, str], list[_Pending]]], jobs: int,
                       work: tuple[Any, ...]) -> Iterator[_Merged]:
    """The runs of ``ordered`` merged by ``jobs`` forked workers, in order. Each worker
    interns into its own table; here a mirror of each worker's table gets the same keys
    in the same order, so the rows it sends need no translation."""
    import multiprocessing

    global _SHARED
    _SHARED = (ordered, work)
    mirrors: dict[int, MirrorTable] = {}
    spans = [(i, min(i + TASK_RUNS, len(ordered))) for i in range(0, len(ordered), TASK_RUNS)]
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            # A worker takes tasks in order and imap returns them in order, so a worker's
            # table additions arrive here in the order it made them.
            for pid, out, keys, sets in pool.imap(_merge_task, spans):
                mirror = mirrors.setdefault(pid, MirrorTable())
                mirror.extend(keys, sets)
                for test, fields, rows, set_rows, broken in out:
                    yield test, None if fields is None else RunEvidence(**fields, units=UnitColumns(
                        mirror, np.frombuffer(rows, dtype=np.uint32),
                        np.frombuffer(set_rows, dtype=np.uint32))), broken
    finally:
        _SHARED = None


def _mtime(origin: str) -> float:
    try:
        return Path(origin.split("!")[0]).stat().st_mtime
    except OSError:
        return 0.0
