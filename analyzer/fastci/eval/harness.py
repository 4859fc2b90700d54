"""The loop of ``fastci eval``: per change, run everything, plan, run the plan, compare.

For each change (:mod:`fastci.eval.changes`), in the scratch worktree
(:mod:`fastci.eval.workspace`):

1. put the change's tree in place;
2. **plan** it as ``fastci plan`` would (:func:`fastci.plan.planner.analyze` against the
   change's base, with the evaluation's copy of the evidence store and the
   calibration), timed: that is FastCI's analysis time;
3. **run-all**: every test at full workload, recorded in line mode — or its results
   from the baseline cache when this very tree was run before (key: the tree id,
   the runner, the tests, the environment fingerprint);
4. **the plan's runs**: the tests it reduces run at their planned workload now; a
   test it runs at full workload is the very action run-all ran, so run-all's
   execution of it is the plan's (``reused`` in the results) — the way a cache
   would serve it;
5. the measures (:mod:`fastci.eval.metrics`) into one :class:`~fastci.eval.results.ChangeResult`,
   appended to ``results.jsonl`` at once (a killed evaluation keeps finished changes);
6. a commit's run-all recording is ingested as evidence (the next commit of a range
   plans with it); with ``faults``, seeded mutants of the change's units
   (:mod:`fastci.eval.faults`) are queued as changes of their own.

When the evidence store holds nothing, the first change's base is recorded first
(a main-branch recording, as a team would have before using FastCI).

The user's checkout, plan, store and calibration are never written: the worktree,
the store copy and the baseline cache live under the work directory and ``--out``.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fastci import __version__
from fastci.config import Config
from fastci.config import load as load_config
from fastci.eval import metrics
from fastci.eval.changes import Change, fault_seed, resolve
from fastci.eval.execute import Executor, TestRun, executor_for
from fastci.eval.faults import Mutant, changed_units_of, generate
from fastci.eval.results import (ChangeResult, TestOutcome, Arm, EvalResultsError, merge,
                                 read_results, write_results)
from fastci.eval.workspace import Snapshot, WorkspaceError, Worktree, check_workdir
from fastci.evidence.store.ingest import TestResult, find_traces, ingest
from fastci.errors import FastCIError
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.integrations.git.tree import evidence_commit
from fastci.plan.inputs import BY_RUNNER, Given, choose_runner, runner_python
from fastci.plan.planner import analyze
from fastci.plan.prioritize import strategy_orders
from fastci.plan.model import Plan, by_priority
from fastci.select import DeclaredTest
from fastci.types import RelPath, TestId

LOG = logging.getLogger(__name__)

#: Bump when the baseline cache's content or meaning changes.
BASELINE_VERSION = 1


@dataclass(frozen=True)
class EvalOptions:
    """What to evaluate and how (``fastci eval``'s options)."""

    changes: tuple[str, ...] = ()
    base: str = "HEAD"
    faults: int = 0
    seed: int = 0
    tests: tuple[str, ...] = ()
    gpu_slots: int = 1
    out: Path = Path(".fastci/eval")
    workdir: Path | None = None
    runner: str | None = None
    prune: str | None = None
    granularity: str | None = None


@dataclass
class Evaluation:
    """What an evaluation produced: its results (merged with the file's earlier lines)
    and the time it spent outside test runs (for the overhead line)."""

    results: list[ChangeResult] = field(default_factory=list)
    new: list[ChangeResult] = field(default_factory=list)
    setup_s: float = 0.0
    warmup_s: float = 0.0


# --------------------------------------------------------------------------- baseline cache


@dataclass(frozen=True)
class Baseline:
    """Run-all of one tree: every test's run, the wall seconds it took, its traces."""

    runs: Mapping[TestId, TestRun]
    runs_s: float
    traces: Path
    cached: bool


class BaselineCache:
    """Run-all results per tree under ``root`` (``<key>/runs.json.gz`` and ``traces/``)."""

    def __init__(self, root: Path, fingerprint: str) -> None:
        self.root = root
        self.fingerprint = fingerprint

    def key(self, tree: str, runner: str, tests: Sequence[TestId]) -> str:
        """The cache key: the tree, the runner, the tests, the environment."""
        blob = json.dumps([BASELINE_VERSION, tree, runner, sorted(tests), self.fingerprint])
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def get(self, key: str) -> Baseline | None:
        """The cached baseline (None: none, or one that cannot be read: it is re-run)."""
        path = self.root / key / "runs.json.gz"
        if not path.is_file():
            return None
        try:
            raw = json.loads(gzip.decompress(path.read_bytes()))
            runs = {t: TestRun(r["outcome"], float(r["duration_s"]),
                               {p: frozenset(int(n) for n in v) for p, v in r["lines"].items()})
                    for t, r in raw["runs"].items()}
            return Baseline(runs, float(raw["runs_s"]), self.root / key / "traces", True)
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            LOG.warning("baseline cache %s unreadable (%s): running everything again", path, exc)
            return None

    def put(self, key: str, runs: Mapping[TestId, TestRun], runs_s: float) -> None:
        """Store a run-all (its traces were written to :meth:`traces_dir` by the run)."""
        raw = {"runs": {t: {"outcome": r.outcome, "duration_s": r.duration_s,
                            "lines": {p: sorted(v) for p, v in r.lines.items()}}
                        for t, r in runs.items()}, "runs_s": runs_s}
        path = self.root / key / "runs.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.compress(json.dumps(raw).encode()))
        tmp.replace(path)

    def traces_dir(self, key: str) -> Path:
        """Where a run-all of ``key`` keeps its traces (emptied first)."""
        d = self.root / key / "traces"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d


# --------------------------------------------------------------------------- the evaluator


def matches(test: TestId, patterns: Sequence[str]) -> bool:
    """Whether ``test`` is one of ``patterns`` (exact ids, or fnmatch globs)."""
    from fnmatch import fnmatchcase

    return any(test == p or fnmatchcase(test, p) for p in patterns)


class Evaluator:
    """One evaluation: the worktree, the store copy, the executor, the baseline cache."""

    def __init__(self, repo: Path, options: EvalOptions, *,
                 echo: Callable[[str], None] = print) -> None:
        self.repo = repo
        self.options = options
        self.echo = echo
        self.out = options.out if options.out.is_absolute() else repo / options.out
        user_cfg = load_config(repo)
        # The interpreter the repository's tests run with (its venv): a worktree has none.
        self.python = runner_python(repo, user_cfg)
        users = [user_cfg.path(repo, key) for key in ("store", "calibration", "plan")]
        default = default_workdir(repo)
        workdir = check_workdir(repo, options.workdir or default, users)
        self.workdir = workdir
        self.tree = Worktree.open(repo, workdir / "tree", adopt=workdir == default.resolve())
        self.store_path = workdir / "evidence.db"
        self.calibration = workdir / "calibration.db"
        _copy_or_remove(users[0], self.store_path)
        _copy_or_remove(users[1], self.calibration)
        self.config = self._config()
        runner = options.runner or choose_runner(self.tree.path, self.config)[0]
        self.executor: Executor = executor_for(self.tree.path, self.config, runner,
                                               python=self.python)
        from fastci.evidence.record.environment import current_fingerprint

        self.cache = BaselineCache(self.out / "baseline", current_fingerprint())
        #: What the tree of each evaluated change looked like (its faults' sources).
        self.snapshots: dict[str, Snapshot] = {}
        #: Tests failing under run-all, per evaluated change (faults compare with their parent).
        self.failing: dict[str, frozenset[TestId]] = {}

    def _config(self) -> Config:
        return load_config(self.tree.path, overrides={
            "store": str(self.store_path), "calibration": str(self.calibration),
            "plan": str(self.workdir / "plan.json"), "runner": self.options.runner,
            "runner_python": self.python,
            "prune": self.options.prune, "granularity": self.options.granularity})

    @property
    def settings(self) -> dict[str, Any]:
        """What the results of this evaluation depend on besides the change."""
        return {"gpu_slots": self.options.gpu_slots, "tests": sorted(self.options.tests),
                "runner": self.executor.name, "prune": self.config.prune,
                "granularity": self.config.granularity, "priority": self.config.priority,
                "reduce": self.calibration.is_file()}

    # ----------------------------------------------------------------------- steps

    def put_in_place(self, change: Change) -> None:
        """Check out ``change``'s tree in the worktree."""
        self.tree.checkout(change.commit or change.base)
        for n, patch in enumerate(change.patches):
            self.tree.apply(patch, change.id if n == len(change.patches) - 1 else change.parent)

    def tests_now(self) -> dict[TestId, int]:
        """The suite as the tree in place declares it, limited to ``--tests``."""
        found = self.executor.universe()
        if self.options.tests:
            found = {t: g for t, g in found.items() if matches(t, self.options.tests)}
        return found

    def baseline(self, tests: Mapping[TestId, int], tree: str) -> Baseline:
        """Run-all of the tree in place, whose git tree id is ``tree`` (cached per tree)."""
        key = self.cache.key(tree, self.executor.name, list(tests))
        got = self.cache.get(key)
        if got is not None and set(got.runs) == set(tests):
            return got
        keep = self.cache.traces_dir(key)
        t0 = time.perf_counter()
        runs = self.executor.run({t: {} for t in tests}, keep=keep)
        runs_s = time.perf_counter() - t0
        self.cache.put(key, runs, runs_s)
        return Baseline(runs, runs_s, keep, False)

    def ingest(self, base: Baseline, commit: str | None) -> None:
        """Ingest a run-all's traces as evidence of the tree in place."""
        results = {t: TestResult("passed" if not r.failed else "failed", r.duration_s)
                   for t, r in base.runs.items() if r.outcome != "not run"}
        with EvidenceStore.open(self.store_path, create=True) as store:
            report = ingest(store, find_traces([base.traces]), source=self.executor.name,
                            commit=commit, results=results, root=self.tree.path,
                            only=set(results))
        LOG.info("ingested %d trace(s) of %d test(s) at %s", report.traces, len(report.tests),
                 commit)

    def store_is_empty(self) -> bool:
        if not self.store_path.is_file():
            return True
        with EvidenceStore.open(self.store_path) as store:
            return not store.test_ids()

    def plan(self, change: Change, declared: Mapping[TestId, DeclaredTest] | None = None
             ) -> tuple[Plan, float, dict[str, list[TestId]]]:
        """FastCI's plan for the tree in place against ``change.base``, its time, and the
        plan's selected tests in every prioritization strategy's order (not timed: what
        the evaluation compares strategies with; {} when the plan was not selective).

        ``declared``: the tree's declared tests, when the executor has just read them
        (:meth:`Executor.declared`); None: the planner asks the runner itself.
        """
        t0 = time.perf_counter()
        orders: dict[str, list[TestId]] = {}
        try:
            with EvidenceStore.open(self.store_path, create=True) as store:
                analysis = analyze(self.tree.path, self.config, base=change.base, head=WORKTREE,
                                   store=store,
                                   declared=BY_RUNNER if declared is None else Given(declared))
                plan, analysis_s = analysis.plan, time.perf_counter() - t0
                try:
                    orders = strategy_orders(analysis, store, Git(self.tree.path), declared)
                except Exception as exc:  # noqa: BLE001 - the comparison only, not the plan
                    LOG.warning("%s: the strategies' orders could not be computed (%s): "
                                "they are not compared on this change", change.id, exc)
        except FastCIError as exc:
            # What `fastci plan` leaves behind when it fails: a plan that runs everything.
            plan, analysis_s = Plan.run_all(f"fastci plan failed: {exc}"), time.perf_counter() - t0
        return plan, analysis_s, orders

    # ----------------------------------------------------------------------- one change

    def evaluate(self, change: Change) -> ChangeResult:
        """Evaluate one change (its tree is put in place first)."""
        started = time.perf_counter()
        self.put_in_place(change)
        stamp = evidence_commit(self.tree.path)
        snap = self.tree.snapshot(change.base)
        self.snapshots[change.id] = snap
        tests = self.tests_now()
        plan, analysis_s, orders = self.plan(change, self.executor.declared())
        base = self.baseline(tests, snap.tree)
        planned = planned_tests(plan, tests)
        reduced = {t: o for t, o in planned.items() if o}
        t0 = time.perf_counter()
        ran = self.executor.run(reduced) if reduced else {}
        runs_s = time.perf_counter() - t0 + (0.0 if base.cached else base.runs_s)
        if change.refreshes_evidence:
            self.ingest(base, stamp)
        # A fault is judged by what it breaks: tests already failing on the change it
        # sits on would "detect" any fault on top of it.
        known = self.failing.get(change.parent, frozenset()) if change.kind == "fault" \
            else frozenset()
        result = compare(change, plan, tests, base, planned, ran, snap.lines,
                         slots=self.options.gpu_slots, analysis_s=analysis_s,
                         settings=self.settings, known_failing=known, orders=orders)
        self.failing[change.id] = frozenset(t for t, r in base.runs.items() if r.failed)
        total = time.perf_counter() - started
        timing = {"runs": runs_s, "analysis": analysis_s,
                  "cached": base.runs_s if base.cached else 0.0,
                  "bookkeeping": max(total - runs_s - analysis_s, 0.0)}
        return dataclasses.replace(result, timing=timing)

    def faults_of(self, change: Change) -> list[Change]:
        """``options.faults`` seeded mutants per unit ``change`` changes (its tree in place,
        just evaluated)."""
        paths = [p for p in self.snapshots[change.id].paths if p.endswith(".py")]
        sources = {p: (self.tree.read(p, change.base), self.tree.read(p)) for p in paths}
        units = changed_units_of(sources, ignore=tuple(self.config.ignore))
        texts = {p: new.decode("utf-8", "replace") for p, (_old, new) in sources.items()
                 if new is not None}
        want = self.options.faults * len(units)
        # Drawn with spares: a mutant that undoes the change is dropped, the next one taken.
        mutants = generate(texts, units, count=2 * want,
                           seed=fault_seed(self.options.seed, change.id))
        mutants = not_reverting(mutants, {p: old for p, (old, _new) in sources.items()})[:want]
        return [Change(f"fault:{change.id}:{m.name}", "fault", f"{m.operator}: {m.description}",
                       change.base, commit=change.commit,
                       patches=(*change.patches, m.diff()), parent=change.id,
                       fault=m.to_dict())
                for m in mutants]

    def close(self) -> None:
        try:
            self.tree.reset()
        finally:
            self.executor.close()


def not_reverting(mutants: Sequence[Mutant],
                  base: Mapping[RelPath, bytes | None]) -> list[Mutant]:
    """``mutants`` but those that put their file back as it is at the base: a fault that
    undoes the change (flipping back the comparison a patch flipped) is no fault of it."""
    return [m for m in mutants
            if base.get(m.path) is None or m.mutated.encode("utf-8") != base[m.path]]


def planned_tests(plan: Plan, tests: Mapping[TestId, int]) -> dict[TestId, dict[str, Any]]:
    """The tests the plan runs, in run order, with their overrides (empty: full workload).

    A plan that is not selective runs everything at full workload; a selective plan
    runs its tests, and every test of the suite it neither runs nor skips at full
    workload (what ``--config=fastci`` does with a test a plan does not list).
    """
    if plan.mode != "selective":
        return {t: {} for t in sorted(tests)}
    out = {t.id: dict(t.overrides) for t in by_priority(plan.tests) if t.id in tests}
    skipped = {s.id for s in plan.skipped}
    out.update({t: {} for t in sorted(tests) if t not in out and t not in skipped})
    return out


def compare(change: Change, plan: Plan, tests: Mapping[TestId, int], base: Baseline,
            planned: Mapping[TestId, Mapping[str, Any]], ran: Mapping[TestId, TestRun],
            changed: Mapping[RelPath, set[int]], *, slots: int, analysis_s: float,
            settings: Mapping[str, Any],
            known_failing: frozenset[TestId] = frozenset(),
            orders: Mapping[str, Sequence[TestId]] | None = None) -> ChangeResult:
    """The measures of one change from its runs (pure).

    ``known_failing``: tests whose failure is not the change's (a fault's parent
    already fails them); they count as failures nowhere, and the note says so.
    ``orders``: the plan's selected tests in each prioritization strategy's order; each
    is scored on run-all's measured costs and failures of those tests
    (:func:`strategy_apfdc`), so every strategy is judged on the same runs.
    """
    missing = TestRun("not run", 0.0)
    all_runs = {t: base.runs.get(t, missing) for t in sorted(tests)}
    plan_runs = {t: ran.get(t, all_runs[t]) if o else all_runs[t] for t, o in planned.items()}

    def jobs(runs: Mapping[TestId, TestRun]) -> list[metrics.Job]:
        return [metrics.Job(t, tests[t], r.duration_s, r.failed and t not in known_failing)
                for t, r in runs.items()]

    all_jobs = jobs(all_runs)
    all_arm = metrics.measure_arm(all_jobs, slots)
    plan_arm = metrics.measure_arm(jobs(plan_runs), slots, lead_s=analysis_s)
    seen, kept = metrics.retention(changed, [r.lines for r in all_runs.values()],
                                   [r.lines for r in plan_runs.values()])
    whys = {t.id: t.why for t in plan.tests}
    whys.update({s.id: s.why for s in plan.skipped})
    missed = [{"test": t, "change": change.id, "why": _why_missed(t, planned, plan_runs, whys)}
              for t in metrics.misses(all_arm.failing, plan_arm.failing)]
    not_run = [t for t, r in all_runs.items() if r.outcome == "not run"]
    note = (f"run-all did not run {len(not_run)} test(s) ({not_run[0]}...): the runner "
            "failed before them" if not_run and len(not_run) == len(all_runs) else "")
    fault = dict(change.fault)
    if known_failing:
        fault["failing_on_parent"] = sorted(known_failing)
    return ChangeResult(
        change=change.id, kind=change.kind, title=change.title, base=change.base,
        head=change.commit if change.kind == "commit" and change.commit else "",
        settings=dict(settings), plan_mode=plan.mode, plan_reason=plan.reason,
        analysis_s=round(analysis_s, 3), run_all=_arm(all_arm, len(all_runs)),
        fastci=_arm(plan_arm, len(plan_runs)), changed_lines=seen, retained_lines=kept,
        missed=tuple(missed), tests=_outcomes(tests, planned, all_runs, plan_runs, whys),
        parent=change.parent, strategies=strategy_apfdc(orders or {}, all_jobs, all_arm.failing),
        fault=fault, run_all_cached=base.cached, recorded_at=time.time(),
        fastci_version=__version__, note=note)


def _why_missed(test: TestId, planned: Mapping[TestId, Mapping[str, Any]],
                plan_runs: Mapping[TestId, TestRun], whys: Mapping[TestId, str]) -> str:
    """Why the plan did not catch a failure run-all caught: not run, or run reduced."""
    if test not in planned:
        return f"not run: {whys.get(test) or 'skipped by the plan'}"
    return f"ran at {dict(planned[test])} and {plan_runs[test].outcome}"


def _outcomes(tests: Mapping[TestId, int], planned: Mapping[TestId, Mapping[str, Any]],
              all_runs: Mapping[TestId, TestRun], plan_runs: Mapping[TestId, TestRun],
              whys: Mapping[TestId, str]) -> tuple[TestOutcome, ...]:
    """One row per test, the planned ones first: its run in each arm, and why."""
    rows = []
    for t in [*planned, *(t for t in sorted(tests) if t not in planned)]:
        r = all_runs[t]
        p = plan_runs.get(t)
        rows.append(TestOutcome(
            id=t, gpus=tests[t], all_outcome=r.outcome, all_s=round(r.duration_s, 3),
            planned=p is not None, overrides=dict(planned.get(t, {})),
            plan_outcome=p.outcome if p else "", plan_s=round(p.duration_s, 3) if p else 0.0,
            reused=p is not None and not planned[t], why=whys.get(t, "")))
    return tuple(rows)


def _arm(m: metrics.ArmMeasure, n: int) -> Arm:
    return Arm(n, round(m.gpu_s, 3), round(m.latency_s, 3), m.failing,
               None if m.ttff_s is None else round(m.ttff_s, 3),
               None if m.apfdc is None else round(m.apfdc, 4))


def strategy_apfdc(orders: Mapping[str, Sequence[TestId]], jobs: Sequence[metrics.Job],
                   failing: Sequence[TestId]) -> dict[str, dict[str, float]]:
    """Per strategy, the APFDc of its order over run-all's measured slot costs
    (:func:`metrics.slot_cost`): ``change`` (the change as one fault, found by its first
    failing test: what a developer waits for) and ``tests`` (each failing test a
    fault). Strategies whose order holds no failing test are left out."""
    from fastci.select.priority import apfdc

    cost = {j.test: metrics.slot_cost(j) for j in jobs}
    out: dict[str, dict[str, float]] = {}
    for name, order in orders.items():
        ran = [t for t in order if t in cost]
        one = apfdc(ran, cost, failing, one_fault=True)
        each = apfdc(ran, cost, failing)
        if one is not None and each is not None:
            out[name] = {"change": round(one, 4), "tests": round(each, 4)}
    return out


# --------------------------------------------------------------------------- the whole run


def default_workdir(repo: Path) -> Path:
    """Where an evaluation of ``repo`` keeps its worktree and store copy by default:
    a per-repository folder under ``~/.cache/fastci/eval`` (outside the repository,
    so the worktree is not inside the user's Bazel workspace)."""
    digest = hashlib.sha256(str(repo.resolve()).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "fastci" / "eval" / f"{repo.resolve().name}-{digest}"


def _copy_or_remove(src: Path, dst: Path) -> None:
    """Make ``dst`` a copy of ``src`` (removed when ``src`` does not exist).

    Raises:
        WorkspaceError: ``dst`` is ``src`` itself (it would be deleted).
    """
    if dst.resolve() == src.resolve():
        raise WorkspaceError(f"{dst} is the file it would be a copy of: choose another --workdir")
    dst.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(dst) + suffix).unlink(missing_ok=True)
    if src.is_file():
        shutil.copyfile(src, dst)


def run_evaluation(repo: Path, options: EvalOptions, *,
                   echo: Callable[[str], None] = print) -> Evaluation:
    """Evaluate ``options.changes`` in ``repo``; results go to ``options.out``.

    Raises:
        WorkspaceError: a change cannot be resolved or put in place.
        EvalResultsError: ``results.jsonl`` in the output folder cannot be read (it is
            left as it is).
    """
    from fastci.progress import Progress

    t_setup = time.perf_counter()
    ev = Evaluation()
    evaluator = Evaluator(repo, options, echo=echo)
    results_path = evaluator.out / "results.jsonl"
    earlier = read_results(results_path) if results_path.exists() else []
    queue = resolve(repo, options.changes, base=options.base)
    ev.setup_s = time.perf_counter() - t_setup
    try:
        if evaluator.store_is_empty():
            first = queue[0]
            echo(f"fastci eval: the evidence store is empty: recording every test at the base "
                 f"{first.base[:12]} first")
            t0 = time.perf_counter()
            evaluator.tree.checkout(first.base)
            tree = evaluator.tree.snapshot(first.base).tree
            evaluator.ingest(evaluator.baseline(evaluator.tests_now(), tree),
                             evidence_commit(evaluator.tree.path))
            ev.warmup_s = time.perf_counter() - t0
            echo(f"fastci eval: base recorded in {ev.warmup_s:.0f} s")
        total = len(queue)
        with Progress(total, "eval", unit="change") as progress, progress.ticking():
            while queue:
                change = queue.pop(0)
                result = evaluator.evaluate(change)
                ev.new.append(result)
                write_results(results_path, merge(earlier, ev.new))
                progress.echo(one_line(result))
                if options.faults and change.kind != "fault":
                    faults = evaluator.faults_of(change)
                    queue[0:0] = faults
                    total += len(faults)
                    progress.set_total(total)
                progress.advance(note=change.id)
    finally:
        evaluator.close()
    ev.results = merge(earlier, ev.new)
    return ev


def one_line(r: ChangeResult) -> str:
    """A change's result in one line, for the log."""
    caught = ("-" if not r.detected_by_all else "detected" if not r.missed
              else f"MISSED {len(r.missed)}")
    return (f"{r.change}: {r.plan_mode}, {r.fastci.tests}/{r.run_all.tests} tests, "
            f"{r.fastci.gpu_s:.0f}/{r.run_all.gpu_s:.0f} GPU-s, latency "
            f"{r.fastci.latency_s:.0f}/{r.run_all.latency_s:.0f} s, retention "
            f"{r.retained_lines}/{r.changed_lines}, failing {len(r.run_all.failing)}: {caught}"
            + (f" ({r.note})" if r.note else ""))


__all__ = ["EvalOptions", "Evaluation", "Evaluator", "run_evaluation", "EvalResultsError"]
