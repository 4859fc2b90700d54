"""Merge trace files into the evidence store.

Traces come from a pytest trace directory or from ``bazel-testlogs`` (loose
files under ``test.outputs/`` or inside ``test.outputs/outputs.zip``). The
traces of one run (same test id and run id: the main process and its
children) merge into one :class:`~fastci.evidence.store.db.RunEvidence`, with
the *segments* its traces name in ``shared`` (evidence shared by several
tests of a pytest session: collection, fixtures above function scope) and
every segment those include (:mod:`fastci.evidence.store.merge`); runs are merged
here or, for a large batch, in forked workers. The newest run of a test wins in the store; a run ingested before is skipped, so
ingesting the same traces twice changes nothing. A corrupt or truncated trace
is reported with its path and skipped; its test, when known, gets an
incomplete run (so selection always runs it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from fastci.errors import TraceError
from fastci.evidence.record import trace
from fastci.evidence.store.columns import MirrorTable, UnitColumns
from fastci.evidence.store.db import EvidenceStore, RunEvidence
from fastci.evidence.store.merge import (Checksums, TestResult, TraceUnits, index_segments,
                                         merge_run, segment_closure)
from fastci.integrations.git.repository import cache_dir

LOG = logging.getLogger(__name__)
#: What callers import from here; the merge of one run lives in merge.py.
__all__ = ["Checksums", "IngestReport", "TestResult", "TraceBlob", "TraceUnits", "find_traces",
           "index_segments", "ingest", "label_from_testlogs", "merge_run", "results_from_bep",
           "segment_closure", "worker_count"]


@dataclass(frozen=True)
class TraceBlob:
    """The bytes of one trace file and where they came from."""

    origin: str  # path, or "archive.zip!member"
    data: bytes
    test_hint: str | None = None  # test id known from the location (bazel-testlogs)


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
