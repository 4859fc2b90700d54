"""``fastci calibrate``: run each test at each rung of its ladder.

For every test that declares a reducible workload (a ``gpu_test``'s floors, or a
pytest ``fastci_workload`` marker; valid by
:func:`fastci.plan.workload.reduction_problems`) and every rung of
:func:`fastci.plan.workload.ladder` (full workload first), a run under the recorder
in line mode. Bazel runs the rungs in rounds, one ``bazel test`` per round with the
rungs' overrides in a one-off plan repository (:func:`calibrate_bazel`); pytest
runs one process per rung, the test alone, in the repository root::

    FASTCI_WORKLOAD=<the rung's overrides, JSON> FASTCI_RECORD_LINES=1 \
        python -m pytest NODEID -p fastci.pytest.plugin \
        --fastci-record --fastci-trace-dir TMP

Its traces give the outcome (the main trace's), completeness (every trace stopped
cleanly, every shared segment it names found, none corrupt, the rung's overrides
applied), the measured duration and GPUs, the executed lines and arcs per file
(line mode: :data:`fastci.evidence.record.recorder.LINES_ENV`; lines via
:func:`fastci.evidence.record.trace.delta_decode`), each executed unit's checksum and
contexts and each executed file's digest (merged as ``fastci ingest`` merges a run:
:func:`fastci.evidence.store.ingest.merge_run`).

Each rung goes into the :class:`~fastci.evidence.store.calibrations.CalibrationStore`,
never the evidence store (a run at a reduced workload is no evidence of the test).
Calibrating is resumable: a rung already stored complete, at the same commit stamp
and under the same declaration digest, is not run again. One progress line per
rung (and, given a :class:`fastci.progress.Progress`, the count of rungs run with an
ETA on stderr); the report's :meth:`CalibrationReport.summary` gives the calibration's cost
against one full run of the same tests. docs/CALIBRATION.md has the user's side.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
import os
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence,
                    TypeAlias)

from fastci.config import DEFAULTS
from fastci.integrations import procs
from fastci.errors import BazelError, FastCIError, TraceError
from fastci.evidence.record import trace
from fastci.evidence.store.calibrations import (CalibrationStore, Rung, declaration_digest,
                                                declaration_spec)
from fastci.evidence.store.ingest import (Checksums, TestResult, find_traces, index_segments, merge_run,
                                          results_from_bep, segment_closure)
from fastci.evidence.record.recorder import LINES_ENV
from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
from fastci.integrations.bazel.runner import Bazel
from fastci.integrations.bazel.testlogs import test_dir
from fastci.plan.reduce import no_cheaper_floor, superseding_rung
from fastci.plan.workload import ReductionDecl, ladder, reducible_dims, reduction_problems
from fastci.types import RelPath, TestId

if TYPE_CHECKING:
    from fastci.progress import Progress

__all__ = ["PLUGIN", "CalibrationError", "CalibrationReport", "Pending", "Recorded", "RunRungs",
           "calibrate", "calibrate_bazel", "calibrate_with", "decode_run", "node_arg", "run_rung",
           "scrub_traces"]

#: The pytest plugin the recorded run loads (``-p``).
PLUGIN = "fastci.pytest.plugin"
#: The ladder's rung at the declared workload (:func:`fastci.plan.workload.ladder`).
FULL = "full"
#: A reduced rung may take this many times its full rung's time, and at least
#: :data:`RUNG_TIMEOUT_FLOOR_S` (process start and imports do not shrink with the workload).
RUNG_TIMEOUT_FACTOR = 3.0
RUNG_TIMEOUT_FLOOR_S = 120.0
#: A test's declaration as the caller found it: the declaration, None (the test has no
#: ``fastci_workload`` marker) or why its marker could not be read (a string).
Declared: TypeAlias = "ReductionDecl | str | None"


class CalibrationError(FastCIError):
    """Calibration cannot start (tests that cannot be collected, an unknown test...)."""


@dataclass
class CalibrationReport:
    """What one ``calibrate`` call did.

    Attributes:
        tests: the tests calibrated (each with at least one rung now stored).
        ran: rungs run by this call.
        resumed: rungs already stored (same commit and declaration) and not run again.
        skipped: (test, why) for each test not calibrated.
        not_needed: (test, rung, the measured rung that decided it) for each rung left
            out: a smaller rung reaches all the full run does
            (:func:`fastci.plan.reduce.superseding_rung`), or the midpoint's floor cost as much
            as the full rung (:func:`fastci.plan.reduce.no_cheaper_floor`).
        failed: (test, rung, what happened) for each rung run now that did not pass
            completely (stored all the same; a plan never chooses it).
        cost_gpu_s: the measured cost of every current rung of ``tests``.
        full_gpu_s: the cost of one full-workload run of ``tests`` (their ``full`` rungs).
        wall_s: how long this call took.
    """

    tests: list[TestId] = field(default_factory=list)
    ran: int = 0
    resumed: int = 0
    skipped: list[tuple[TestId, str]] = field(default_factory=list)
    not_needed: list[tuple[TestId, str, str]] = field(default_factory=list)
    failed: list[tuple[TestId, str, str]] = field(default_factory=list)
    cost_gpu_s: float = 0.0
    full_gpu_s: float = 0.0
    wall_s: float = 0.0

    def summary(self) -> str:
        """One line: tests and rungs, what was resumed, and the cost against one full run."""
        if not self.tests:
            return (f"calibrated no test ({len(self.skipped)} skipped); "
                    f"{self.wall_s:.1f} s")
        ratio = (f" = {self.cost_gpu_s / self.full_gpu_s:.1f}x one full run of them "
                 f"({self.full_gpu_s:.2f} GPU-s)" if self.full_gpu_s > 0 else "")
        spared = (f"{len(self.not_needed)} not needed (a smaller rung reached all the full "
                  "run did, or a floor did not cut the cost), " if self.not_needed else "")
        return (f"calibrated {len(self.tests)} test(s): {self.ran} rung(s) run, "
                f"{self.resumed} resumed, {spared}{len(self.skipped)} test(s) skipped, "
                f"{len(self.failed)} rung(s) did not pass; calibration cost "
                f"{self.cost_gpu_s:.2f} GPU-s{ratio}; this call took {self.wall_s:.1f} s")


def node_arg(root: Path, test: TestId) -> str:
    """The pytest argument that runs ``test`` (a repo-relative node id) from anywhere:
    its file made absolute; an id whose file is not under ``root`` as it is."""
    path, sep, rest = test.partition("::")
    local = root / path
    return f"{local}{sep}{rest}" if sep and local.is_file() else test


def calibrate(root: Path, tests: Sequence[TestId], declarations: Mapping[TestId, Declared],
              store_path: Path, *, python: str, pytest_args: Sequence[str] = (),
              commit: str | None, echo: Callable[[str], None] = print,
              resume: bool = True, progress: Progress | None = None, every_rung: bool = False,
              learned: Mapping[TestId, Mapping[str, Any]] | None = None,
              rung_timeout_s: float = DEFAULTS.rung_timeout_s) -> CalibrationReport:
    """Run each of ``tests`` at each rung of its ladder; store the rungs at ``store_path``.

    Args:
        root: the repository root (tests run there; their ids are relative to it).
        tests: pytest test ids (node ids with repo-relative paths), in order.
        declarations: each test's declaration (:data:`Declared`); a test missing here
            declares nothing.
        store_path: the calibration store (created when absent).
        python: the interpreter the tests run with.
        pytest_args: extra pytest arguments for every run.
        commit: the stamp of the tree the tests run from (``HEAD``, ``dirty:<tree>``,
            None outside git): stored with each rung, and what resuming compares.
        echo: prints one progress line per rung (and one per skipped test).
        resume: skip rungs already stored complete at ``commit`` under the same
            declaration.
        progress: counts the rungs run (see :func:`calibrate_with`).
        every_rung: run rungs a smaller one makes useless too (see :func:`calibrate_with`).
        learned: floors learned from escapes, by test (see :func:`calibrate_with`).
        rung_timeout_s: the most a rung may run (config ``rung_timeout_s``); see
            :func:`rung_timeout` for what each rung gets.

    Raises:
        StoreError: the store cannot be opened or written (nothing is run then, or
            nothing more).
    """
    def one_by_one(items: Sequence[Pending],
                   wanted: Callable[[Pending], bool]) -> Iterator[tuple[Pending, Rung, str]]:
        checksums = Checksums(root)
        full_s: dict[TestId, float] = {}  # each test's full rung, as measured in this call
        for item in items:
            if not wanted(item):
                continue
            timeout = rung_timeout(full_s.get(item.test) if item.name != FULL else None,
                                   rung_timeout_s)
            rung, note = run_rung(root, item.test, item.name, item.overrides, item.declaration,
                                  python=python, pytest_args=pytest_args, commit=commit,
                                  checksums=checksums, timeout=timeout)
            if item.name == FULL and rung.outcome == "passed":
                full_s[item.test] = rung.duration_s
            yield item, rung, note

    return calibrate_with(tests, declarations, store_path, one_by_one, commit=commit,
                          echo=echo, resume=resume, progress=progress, every_rung=every_rung,
                          learned=learned)


@dataclass(frozen=True)
class Pending:
    """One rung to run: the test, the rung's name and overrides, the declaration's digest."""

    test: TestId
    name: str
    overrides: Mapping[str, Any]
    declaration: str


#: Runs rungs (each test at most once per call... or several: the runner decides how to
#: batch them) and yields each with its measured rung and a note ("" when nothing went
#: wrong), as each finishes, so progress shows and a killed calibration keeps them. The
#: second argument says whether a rung is still wanted: a runner asks it right before it
#: runs the rung (after every earlier rung of the same test was yielded) and leaves the
#: rung out when it says no (:func:`fastci.plan.reduce.superseding_rung`: a smaller rung already
#: reaches all the full run does).
RunRungs: TypeAlias = Callable[[Sequence[Pending], Callable[[Pending], bool]],
                               Iterable[tuple[Pending, Rung, str]]]


def calibrate_with(tests: Sequence[TestId], declarations: Mapping[TestId, Declared],
                   store_path: Path, run_rungs: RunRungs, *, commit: str | None,
                   echo: Callable[[str], None] = print,
                   resume: bool = True, progress: Progress | None = None,
                   every_rung: bool = False,
                   learned: Mapping[TestId, Mapping[str, Any]] | None = None) -> CalibrationReport:
    """The runner-independent part of :func:`calibrate`: ladders, resuming, storing, the
    report. ``run_rungs`` runs what is left to run (pytest: one process per rung,
    :func:`calibrate`; Bazel: one ``bazel test`` per round, :func:`calibrate_bazel`).

    A rung is not run when a smaller rung of the same test, measured at this commit and
    declaration, already passed and reached every line, arc and context the full run
    did (:func:`fastci.plan.reduce.superseding_rung`): no plan could prefer it; nor a midpoint
    whose dimension's floor passed and cost no less than the full rung
    (:func:`fastci.plan.reduce.no_cheaper_floor`): no plan is expected to take it. It is
    counted in ``report.not_needed`` with the rung that decided it; ``every_rung`` runs
    it all the same.
    ``learned`` holds each test's floors learned from escapes (dimension -> the value a
    rung must exceed): a rung below them supersedes nothing.

    ``progress`` counts the rungs this call runs (resumed ones are not: they would make
    the ETA a guess), ticks while a rung runs and is closed once the last one is stored;
    the per-rung lines still go to ``echo`` (pass ``progress.echo`` so a bar does not
    tear them)."""
    started = time.perf_counter()
    report = CalibrationReport()
    ladders = _ladders(tests, declarations, report, echo)
    session = _Session(ladders, report, commit, echo, progress, every_rung, learned or {})
    with CalibrationStore.open(store_path, create=True) as store:
        todo = session.pending(store, resume)
        session.run(store, todo, run_rungs)
        session.tally(store)
    report.wall_s = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _Ladder:
    """One test to calibrate: its ladder (:func:`fastci.plan.workload.ladder`), its
    declaration as stored with each rung, and that declaration's digest."""

    test: TestId
    rungs: list[tuple[str, dict[str, Any]]]
    spec: dict[str, Any]
    digest: str


def _ladders(tests: Sequence[TestId], declarations: Mapping[TestId, Declared],
             report: CalibrationReport, echo: Callable[[str], None]) -> list[_Ladder]:
    """The ladder of each test that can be calibrated; the others go to ``report.skipped``.
    A test named twice is calibrated once (its rungs are one ladder, measured once)."""
    out: list[_Ladder] = []
    for test in dict.fromkeys(tests):
        decl = declarations.get(test)
        why = _not_calibrated(decl)
        if why is not None:
            report.skipped.append((test, why))
            echo(f"calibrate: {test}: skipped: {why}")
            continue
        assert decl is not None and not isinstance(decl, str)
        out.append(_Ladder(test, ladder(decl), declaration_spec(decl), declaration_digest(decl)))
    return out


class _Session:
    """One :func:`calibrate_with` call under way: the rungs measured so far at this commit
    and declaration, by test (what :func:`fastci.plan.reduce.superseding_rung` compares
    with), the count of rungs done for the progress lines, and the report."""

    def __init__(self, ladders: list[_Ladder], report: CalibrationReport, commit: str | None,
                 echo: Callable[[str], None], progress: Progress | None, every_rung: bool,
                 learned: Mapping[TestId, Mapping[str, Any]]) -> None:
        self.ladders, self.report, self.commit = ladders, report, commit
        self.echo, self.progress, self.every_rung, self.learned = echo, progress, every_rung, learned
        self.specs = {lad.test: lad.spec for lad in ladders}
        self.measured: dict[TestId, list[Rung]] = {lad.test: [] for lad in ladders}
        self.total = sum(len(lad.rungs) for lad in ladders)
        self.done = 0

    def pending(self, store: CalibrationStore, resume: bool) -> list[Pending]:
        """The rungs still to run; with ``resume``, one stored complete at this commit and
        declaration, with the same overrides, counts as measured."""
        todo: list[Pending] = []
        for lad in self.ladders:
            stored = {r.rung: r for r in store.rungs(lad.test)} if resume else {}
            for name, overrides in lad.rungs:
                old = stored.get(name)
                if (old is not None and old.complete and old.declaration == lad.digest
                        and old.commit == self.commit and dict(old.overrides) == overrides):
                    self.done += 1
                    self.report.resumed += 1
                    self.measured[lad.test].append(old)
                    self.echo(f"calibrate [{self.done}/{self.total}] {lad.test} {name}: already "
                              f"calibrated at {_stamp(self.commit)} ({old.outcome}, "
                              f"{old.duration_s:.2f} s): resumed")
                    continue
                todo.append(Pending(lad.test, name, dict(overrides), lad.digest))
        return todo

    def wanted(self, item: Pending) -> bool:
        """Whether ``item`` is still worth running (asked right before it runs)."""
        if self.every_rung:
            return True
        measured = self.measured[item.test]
        full = next((r for r in measured if r.rung == FULL), None)
        found = None if full is None else (
            superseding_rung(item.overrides, measured, full, self.specs[item.test]["workload"],
                             self.learned.get(item.test))
            or no_cheaper_floor(item.overrides, measured, full,
                                self.specs[item.test]["floors"]))
        if found is None:
            return True
        self.done += 1
        self.report.not_needed.append((item.test, item.name, found[0].rung))
        self.echo(f"calibrate [{self.done}/{self.total}] {item.test} {item.name}: "
                  f"not run: {found[1]}")
        if self.progress is not None:
            self.progress.advance(note=f"{item.test} {item.name} (not needed)")
        return False

    def run(self, store: CalibrationStore, todo: list[Pending], run_rungs: RunRungs) -> None:
        """Run ``todo`` through ``run_rungs``, storing each rung as it finishes."""
        progress = self.progress
        if progress is not None and todo:
            progress.set_total(len(todo))
        with progress.ticking() if progress is not None else contextlib.nullcontext():
            for item, rung, note in run_rungs(todo, self.wanted):
                self._store(store, item, replace(rung, spec=self.specs[item.test]), note)
        if progress is not None:
            progress.close()

    def _store(self, store: CalibrationStore, item: Pending, rung: Rung, note: str) -> None:
        self.done += 1
        store.put(rung)
        self.measured[item.test].append(rung)
        self.report.ran += 1
        if not rung.usable:
            self.report.failed.append((item.test, item.name, note or rung.outcome))
        self.echo(f"calibrate [{self.done}/{self.total}] {item.test} {item.name}: {rung.outcome}"
                  f"{'' if rung.complete else ' (incomplete)'} "
                  f"{rung.duration_s:.2f} s, {sum(len(v) for v in rung.lines.values())} "
                  f"line(s) in {len(rung.lines)} file(s), {len(rung.units)} unit(s)"
                  + (f": {note}" if note else ""))
        if self.progress is not None:
            self.progress.advance(note=f"{item.test} {item.name}")

    def tally(self, store: CalibrationStore) -> None:
        """The calibrated tests and the cost of their current rungs, into the report."""
        for lad in self.ladders:
            current = [r for r in store.rungs(lad.test)
                       if r.declaration == lad.digest and r.commit == self.commit]
            if current:
                self.report.tests.append(lad.test)
                self.report.cost_gpu_s += sum(r.gpu_s for r in current)
                self.report.full_gpu_s += sum(r.gpu_s for r in current if r.rung == FULL)


def calibrate_bazel(workspace: Path, tests: Sequence[TestId],
                    declarations: Mapping[TestId, Declared], store_path: Path, *,
                    bazel: Bazel, flags: Sequence[str] = (), commit: str | None,
                    echo: Callable[[str], None] = print,
                    resume: bool = True, progress: Progress | None = None,
                    every_rung: bool = False,
                    learned: Mapping[TestId, Mapping[str, Any]] | None = None) -> CalibrationReport:
    """:func:`calibrate` for gpu_tests: the rungs run in rounds, one ``bazel test`` each.

    Round *k* holds the next rung still wanted of every test (rungs a smaller measured
    one makes useless are left out as each round is put together:
    :func:`calibrate_with`), so a test appears at most once per command and the tests
    of a round run as Bazel schedules them (in parallel where the machine allows;
    durations are each test's own, from the build event file). Each round runs::

        bazel test --config=fastci --config=fastci_record --test_env=FASTCI_RECORD_LINES=1 \
            --override_repository=fastci_plan=<a plan of the round's overrides> LABEL...

    The overrides reach the tests through a one-off ``@fastci_plan``
    (:mod:`fastci.integrations.bazel.plan_repo`); ``.fastci/plan.json`` is never
    written, so a killed calibration leaves no plan behind. The traces are read from
    ``bazel-testlogs`` and then deleted there, so a later ``fastci ingest`` of the
    test logs cannot take a rung run for evidence of the test.
    """

    def by_rounds(items: Sequence[Pending],
                  wanted: Callable[[Pending], bool]) -> Iterator[tuple[Pending, Rung, str]]:
        if not items:
            return
        checksums = Checksums(workspace)
        testlogs = Path(bazel.info("bazel-testlogs"))
        queues: dict[TestId, deque[Pending]] = {}
        for item in items:
            queues.setdefault(item.test, deque()).append(item)
        number = 0
        while chosen := _next_round(queues, wanted):
            number += 1
            results, problem, wall = _run_round(bazel, chosen, number, flags)
            for item in chosen:
                yield item, *_rung_of_round(item, testlogs, results, problem, wall, commit,
                                            checksums)

    return calibrate_with(tests, declarations, store_path, by_rounds, commit=commit,
                          echo=echo, resume=resume, progress=progress, every_rung=every_rung,
                          learned=learned)


def _next_round(queues: Mapping[TestId, deque[Pending]],
                wanted: Callable[[Pending], bool]) -> list[Pending]:
    """The next rung still wanted of every test ([]: none left). ``wanted`` is asked only
    now: every earlier rung of each test was yielded and stored."""
    chosen = []
    for queue in queues.values():
        while queue:
            item = queue.popleft()
            if wanted(item):
                chosen.append(item)
                break
    return chosen


def _run_round(bazel: Bazel, chosen: Sequence[Pending], number: int, flags: Sequence[str]
               ) -> tuple[Mapping[TestId, TestResult], str, float]:
    """One ``bazel test`` of a round's rungs under a one-off ``@fastci_plan`` of their
    overrides: the results by test, what went wrong ("" when nothing) and the wall time."""
    with tempfile.TemporaryDirectory(prefix="fastci-calibrate-") as tmp:
        repo = write_plan_repo(Path(tmp) / "plan", {p.test: p.overrides for p in chosen},
                               status=f"fastci calibrate round {number}")
        bep = Path(tmp) / "bep.json"
        began = time.perf_counter()
        try:
            res = bazel.test([p.test for p in chosen], flags=[
                "--config=fastci", "--config=fastci_record",
                f"--test_env={LINES_ENV}=1", override_flag(repo), *flags],
                bep_path=bep)
            results = results_from_bep(bep) if bep.is_file() else {}
            problem = "" if results or res.returncode == 0 else \
                f"bazel test exited {res.returncode} without test results"
        except (BazelError, FastCIError) as exc:
            results, problem = {}, str(exc).splitlines()[0]
        return results, problem, time.perf_counter() - began


def _rung_of_round(item: Pending, testlogs: Path, results: Mapping[TestId, TestResult],
                   problem: str, wall: float, commit: str | None, checksums: Checksums
                   ) -> tuple[Rung, str]:
    """The rung ``item`` measured in its round, from its test logs (whose traces are then
    deleted), and a note."""
    outputs = test_dir(testlogs, item.test) / "test.outputs"
    result = results.get(item.test)
    got = None
    if result is not None and outputs.is_dir():
        got = decode_run(item.test, outputs, commit, checksums, source="bazel", result=result)
        scrub_traces(outputs)
    missing = problem or ("Bazel ran no test of that label" if result is None
                          else f"no trace of the test (bazel: {result.outcome})")
    return _measured(item.test, item.name, item.overrides, item.declaration, commit, got, wall,
                     missing)


def scrub_traces(outputs: Path) -> int:
    """Delete the traces under a test's ``test.outputs`` (plain files and ``outputs.zip``
    members); other outputs stay. Returns how many traces were deleted."""
    gone = 0
    for path in sorted(outputs.rglob(f"*{trace.SUFFIX}")):
        path.unlink(missing_ok=True)
        gone += 1
    archive = outputs / "outputs.zip"
    if archive.is_file():
        with zipfile.ZipFile(archive) as zf:
            names = zf.namelist()
            keep = [n for n in names if not n.endswith(trace.SUFFIX)]
            if len(keep) != len(names):
                kept = [(zf.getinfo(n), zf.read(n)) for n in keep if not n.endswith("/")]
        if len(keep) != len(names):
            gone += len(names) - len(keep)
            archive.chmod(archive.stat().st_mode | 0o200)
            if not kept:
                archive.unlink()
            else:
                fresh = archive.with_name(".outputs.zip.tmp")
                with zipfile.ZipFile(fresh, "w") as out:
                    for info, data in kept:
                        out.writestr(info, data)
                os.replace(fresh, archive)
    return gone


def _not_calibrated(decl: Declared) -> str | None:
    """Why a test with this declaration is not calibrated (None: it is)."""
    if decl is None:
        return "declares no workload (no fastci_workload marker)"
    if isinstance(decl, str):
        return f"its fastci_workload marker is malformed ({decl})"
    problems = reduction_problems(decl)
    if problems:
        return f"its declaration is invalid ({problems[0]})"
    if not reducible_dims(decl):
        return ("nothing of its workload may shrink (every dimension frozen, or a "
                "performance check): only the full workload would run")
    return None


def _stamp(commit: str | None) -> str:
    if commit is None:
        return "an unknown revision"
    return commit if commit.startswith("dirty:") else commit[:12]


def rung_timeout(full_s: float | None, cap_s: float) -> float:
    """The seconds a rung may run: the cap for the full rung (or when the full rung's time
    is unknown), else :data:`RUNG_TIMEOUT_FACTOR` times the full rung's measured time, at
    least :data:`RUNG_TIMEOUT_FLOOR_S` and at most the cap. A reduced rung does less work
    than the full one; one that runs far longer hangs."""
    if full_s is None:
        return cap_s
    return min(cap_s, max(RUNG_TIMEOUT_FLOOR_S, RUNG_TIMEOUT_FACTOR * full_s))


def run_rung(root: Path, test: TestId, name: str, overrides: Mapping[str, Any],
             declaration: str, *, python: str, pytest_args: Sequence[str] = (),
             commit: str | None, checksums: Checksums | None = None,
             timeout: float | None = None) -> tuple[Rung, str]:
    """Run ``test`` at one rung under the recorder in line mode and measure it.

    A rung still running after ``timeout`` seconds is stopped (its process group) and
    stored as not complete, with outcome ``error``: a plan never chooses it.

    Returns the rung and a note on what went wrong ("" when nothing did).
    """
    env = dict(os.environ)
    env["FASTCI_WORKLOAD"] = json.dumps(dict(overrides), sort_keys=True)
    env[LINES_ENV] = "1"
    with tempfile.TemporaryDirectory(prefix="fastci-calibrate-") as tmp:
        traces = Path(tmp) / "traces"
        began = time.perf_counter()
        try:
            proc = procs.run(
                [python, "-m", "pytest", node_arg(root, test), "-q", "-p", "no:cacheprovider",
                 "-p", PLUGIN, "--fastci-record", "--fastci-trace-dir", str(traces),
                 *pytest_args],
                cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            wall = time.perf_counter() - began
            return _measured(test, name, overrides, declaration, commit, None, wall,
                             f"timed out after {timeout:.0f} s: stopped, never chosen")
        wall = time.perf_counter() - began
        got = decode_run(test, traces, commit, checksums or Checksums(root))
    missing = f"no trace of the test (pytest exited {proc.returncode}: {_last_line(proc.stdout)})"
    return _measured(test, name, overrides, declaration, commit, got, wall, missing)


def _measured(test: TestId, name: str, overrides: Mapping[str, Any], declaration: str,
              commit: str | None, got: Recorded | None, wall: float,
              missing: str) -> tuple[Rung, str]:
    """The rung a run measured (``got``: its traces; None: it left none, ``missing`` says
    why), and a note on what went wrong ("" when nothing did)."""
    if got is None:
        return Rung(test=test, rung=name, declaration=declaration, overrides=dict(overrides),
                    commit=commit, duration_s=wall, gpus=0, outcome="error", complete=False,
                    recorded_at=time.time()), missing
    notes = [got.note] if got.note else []
    if got.overrides != dict(overrides):
        notes.append(f"the run applied overrides {got.overrides}, not the rung's")
    if not any(got.lines.values()):
        notes.append("the traces hold no executed line (a recorder without line mode?)")
    return Rung(
        test=test, rung=name, declaration=declaration, overrides=dict(overrides), commit=commit,
        duration_s=got.duration_s if got.duration_s > 0 else wall, gpus=got.gpus,
        outcome=got.outcome, complete=got.complete and not notes, recorded_at=time.time(),
        lines={p: frozenset(v) for p, v in got.lines.items() if v},
        arcs={p: frozenset(v) for p, v in got.arcs.items() if v}, units=dict(got.units),
        digests=got.digests), "; ".join(notes)


@dataclass
class Recorded:
    """What the recorded run's traces say about the test."""

    outcome: str
    complete: bool
    duration_s: float
    gpus: int
    overrides: dict[str, Any] | None
    lines: dict[RelPath, set[int]]
    arcs: dict[RelPath, set[tuple[int, int]]]
    units: Mapping[str, tuple[str, frozenset[str]]]
    digests: dict[RelPath, str]
    note: str = ""


def decode_run(test: TestId, trace_dir: Path, commit: str | None, checksums: Checksums, *,
               source: str = "pytest", result: TestResult | None = None) -> Recorded | None:
    """Merge the recorded run's traces of ``test`` (None: the run left none); ``result``
    (Bazel's outcome and duration for the test) wins over the traces' own."""
    decoded: list[trace.TraceMsg] = []
    corrupt: list[str] = []
    for blob in find_traces([trace_dir]) if trace_dir.is_dir() else ():
        try:
            decoded.append(trace.decode(blob.data, origin=blob.origin))
        except TraceError as exc:
            corrupt.append(str(exc))
    mine = [t for t in decoded if t.role != "shared" and t.test_id == test]
    if not mine:
        return None
    runs = {t.run_id for t in mine}
    segments = index_segments(decoded)
    rec = merge_run(mine, source=source, commit=commit, checksums=checksums,
                    segments=segments, result=result)
    lines: dict[RelPath, set[int]] = {}
    arcs: dict[RelPath, set[tuple[int, int]]] = {}
    _add_lines(lines, arcs, (ft for t in mine for ft in t.files))
    found, _missing = segment_closure((k for t in mine for k in t.shared), segments)
    for key in found:
        _add_lines(lines, arcs, (ft for _t, seg in segments[key] for ft in seg.files))
    note = ""
    if corrupt:
        note = f"{len(corrupt)} corrupt trace(s): {corrupt[0]}"
    elif len(runs) > 1:
        note = f"{len(runs)} runs of the test recorded: its id names several items"
    return Recorded(outcome=rec.outcome, complete=rec.complete, duration_s=rec.duration_s,
                     gpus=rec.gpus, overrides=dict(rec.overrides) if rec.overrides is not None
                     else None, lines=lines, arcs=arcs, units=rec.units,
                     digests={p: d for p, d in rec.sources.items() if d}, note=note)


def _add_lines(lines: dict[RelPath, set[int]], arcs: dict[RelPath, set[tuple[int, int]]],
               file_traces: Iterable[Any]) -> None:
    """Add the executed lines and arcs (flattened pairs, line mode) of ``file_traces``."""
    for ft in file_traces:
        got = trace.delta_decode(list(ft.line_deltas))
        if got:
            lines.setdefault(ft.path, set()).update(got)
        flat = list(ft.arcs)
        if flat:
            arcs.setdefault(ft.path, set()).update(zip(flat[0::2], flat[1::2]))


def _last_line(output: str) -> str:
    """The last non-empty line of a run's output (pytest's summary, or its error)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1][:200]
