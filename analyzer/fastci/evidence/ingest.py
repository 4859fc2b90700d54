"""Merge trace files into the evidence store.

Traces come from a pytest trace directory or from ``bazel-testlogs`` (loose
files under ``test.outputs/`` or inside ``test.outputs/outputs.zip``). The
traces of one run (same test id and run id: the main process and its
children) merge into one :class:`~fastci.evidence.store.RunEvidence`, with
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

import hashlib
import itertools
import json
import logging
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from fastci.errors import TraceError
from fastci.evidence import trace
from fastci.evidence.store import EvidenceStore, RunEvidence
from fastci.integrations.git.repository import cache_dir
from fastci.types import ContextSig
from fastci.units.index import FileUnits, UnitCache, index_source

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

    outcome: str  # passed | failed | error
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
    #: never listed): what :func:`fastci.evidence.trace.remove_ingested` may delete.
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
        for p in sorted(root.rglob("*")):
            if p.name.endswith(trace.SUFFIX) and not p.name.startswith(".tmp-") or \
                    p.name == "outputs.zip":
                yield from _from_file(p, label_from_testlogs(p, root))


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
    """

    def __init__(self, root: Path | None, cache: UnitCache | None = None) -> None:
        self.root = root
        self.cache = cache
        self._memo: dict[tuple[str, str], dict[str, str]] = {}

    def of(self, path: str, digest: str) -> dict[str, str]:
        """Qualname -> checksum for ``path`` as recorded (empty if unknown)."""
        key = (path, digest)
        if key not in self._memo:
            self._memo[key] = self._compute(path, digest)
        return self._memo[key]

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
        result = self.cache.get(path, digest) if self.cache else None
        if result is None:
            result = index_source(path, data)
            if self.cache:
                self.cache.put(path, digest, result)
        if not isinstance(result, FileUnits):
            return {}
        return {u.qualname: u.checksum for u in result.units}


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


def _add_files(units: dict[str, tuple[str, set[ContextSig]]], files: dict[str, str],
               sources: dict[str, str], t: trace.TraceMsg, file_traces: Iterable[Any],
               reads: Iterable[Any], checksums: Checksums | None) -> None:
    for ft in file_traces:
        if ft.digest:
            # Two processes of one run that saw different bytes of a file: the
            # evidence describes neither version alone, so the baseline is unknown.
            sources[ft.path] = ft.digest if sources.get(ft.path, ft.digest) == ft.digest else ""
        known = checksums.of(ft.path, ft.digest) if checksums else {}
        for u in ft.units:
            uid = f"{ft.path}::{u.qualname}"
            checksum, sigs = units.get(uid, ("", set()))
            sigs.update(t.contexts[i] for i in u.contexts if i < len(t.contexts))
            units[uid] = (checksum or u.checksum or known.get(u.qualname, ""), sigs)
    for fr in reads:
        files[fr.path] = fr.digest


def merge_run(traces: list[trace.TraceMsg], *, source: str, commit: str | None,
              result: TestResult | None = None, checksums: Checksums | None = None,
              segments: Segments | None = None) -> RunEvidence:
    """Merge the traces of one run (main process + children) and the segments they
    name (``shared``, with what those include; see :func:`segment_closure`) into one record.
    """
    main = next((t for t in traces if t.role == "main"), None)
    first = main or traces[0]
    units: dict[str, tuple[str, set[ContextSig]]] = {}
    files: dict[str, str] = {}
    sources: dict[str, str] = {}
    distributions: dict[str, str] = {}
    for t in traces:
        _add_files(units, files, sources, t, t.files, t.reads, checksums)
        # Trace field 22 (older traces lack it: no distribution is known, so none is
        # narrowed to; dependency changes then reach these tests through other rules).
        for d in getattr(t, "distributions", ()):
            distributions[d.name] = d.version
    found, missing = segment_closure((k for t in traces for k in t.shared), segments or {})
    for key in found:
        for t, seg in (segments or {})[key]:
            _add_files(units, files, sources, t, seg.files, seg.reads, checksums)
    if missing:
        LOG.warning("%s: %d shared evidence segment(s) not found (e.g. %s): recorded as "
                    "incomplete", first.test_id, len(missing), missing[0])
    complete = main is not None and all(t.complete for t in traces) and not missing
    outcome = main.outcome if main is not None and main.complete else "error"
    duration = main.duration_s if main is not None else 0.0
    if result is not None:
        outcome, duration = result.outcome, result.duration_s or duration
    env = first.environment
    return RunEvidence(
        test=first.test_id, run_key=f"{first.test_id}@{first.run_id}", outcome=outcome,
        complete=complete, duration_s=duration, gpus=first.gpus,
        workload=json.loads(first.workload_json or "{}"),
        overrides=json.loads(first.overrides_json) if first.overrides_json else None,
        recorded_at=min(t.started_at for t in traces), env_fingerprint=env.fingerprint,
        environment={"python": env.python, "platform": env.platform,
                     "packages": env.packages_digest, "torch": env.torch, "cuda": env.cuda,
                     "gpu": env.gpu_model, "base_fingerprint": env.base_fingerprint,
                     # Stored once per fingerprint (the store's env_listing), not per run.
                     "packages_list": env.packages_list},
        commit=commit, source=source,
        units={u: (c, frozenset(s)) for u, (c, s) in units.items()}, files=files,
        sources=sources, distributions=distributions)


def ingest(store: EvidenceStore, blobs: Iterable[TraceBlob], *, source: str,
           commit: str | None, results: Mapping[str, TestResult] | None = None,
           root: Path | None = None, only: set[str] | None = None) -> IngestReport:
    """Parse, group and merge trace blobs into ``store`` in one batch
    (:meth:`~fastci.evidence.store.EvidenceStore.ingest_many`: one transaction, each
    touched posting list written once; runs are merged one at a time as the batch reads
    them, so a full-suite recording is never held in memory whole).

    ``root`` is the source tree the traces were recorded from (checksums are
    computed there, cached in :func:`~fastci.integrations.git.repository.cache_dir`
    ``/units.cache``: git's own directory, where no commit can put a forged cache). With ``only``,
    testlogs of other tests are ignored (``bazel-testlogs`` keeps the outputs of
    tests that did not run in the last invocation).
    """
    report = IngestReport()
    cache = UnitCache(cache_dir(root) / "units.cache") if root is not None else None
    checksums = Checksums(root, cache)
    runs: dict[tuple[str, str], list[trace.TraceMsg]] = {}
    decoded: list[trace.TraceMsg] = []
    origins: list[str] = []
    corrupt: list[RunEvidence] = []
    results = results or {}
    for blob in blobs:
        if only is not None and blob.test_hint is not None and blob.test_hint not in only:
            continue
        report.traces += 1
        try:
            t = trace.decode(blob.data, origin=blob.origin)
        except TraceError as exc:
            report.corrupt.append(str(exc))
            LOG.warning("%s (skipped)", exc)
            test = blob.test_hint or trace.test_id_from_name(Path(blob.origin.split("!")[-1]).name)
            if test:
                report.incomplete_tests.add(test)
                report.tests.add(test)
                res = results.get(test)
                digest = hashlib.sha256(blob.data).hexdigest()[:16]
                corrupt.append(RunEvidence(
                    test=test, run_key=f"{test}@corrupt-{digest}",
                    outcome=res.outcome if res else "error", complete=False,
                    duration_s=res.duration_s if res else 0.0, gpus=0, workload={},
                    recorded_at=_mtime(blob.origin), commit=commit, source=source))
            continue
        decoded.append(t)
        origins.append(blob.origin)
        if t.role != "shared":  # a shared trace only holds segments for others
            runs.setdefault((t.test_id, t.run_id), []).append(t)
    segments = index_segments(decoded)

    def merged() -> Iterator[RunEvidence]:
        for (test, _run), traces in sorted(runs.items()):
            rec = merge_run(traces, source=source, commit=commit, result=results.get(test),
                            checksums=checksums, segments=segments)
            report.tests.add(test)
            if not rec.complete:
                report.incomplete_tests.add(test)
            yield rec

    added = store.ingest_many(itertools.chain(corrupt, merged()))
    report.runs_added += sum(added[:len(corrupt)])
    for new in added[len(corrupt):]:
        if new:
            report.runs_added += 1
        else:
            report.runs_skipped += 1
    if cache is not None:
        cache.save()
    report.ingested = origins  # only once every run is in the store
    return report


def _mtime(origin: str) -> float:
    try:
        return Path(origin.split("!")[0]).stat().st_mtime
    except OSError:
        return 0.0
