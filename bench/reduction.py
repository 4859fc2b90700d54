"""Workload-reduction benchmark (issue 13 item 5): reduced plans vs full workload, really run.

In the scratch workspace of ``make demo`` (evidence recorded on its base commit):

1. **Calibrate** the gpu_tests with ``fastci calibrate``'s Bazel path
   (:func:`fastci.run.calibration_runs.calibrate_bazel`; every rung a real recorded run). The
   calibration is cached next to the demo's evidence cache under the same key (the
   example, the rules and FastCI's sources), so it runs once per version of them; its
   cost is reported against one full-workload run of the calibrated tests.
2. **Run everything once at full workload** on the base (the run-all baseline).
3. For each change in ``bench/changes/`` (the selection benchmark's): apply it, ``fastci
   plan`` it with the calibration (selection + reduction), then run the plan's tests
   twice through Bazel: every one at **full workload** and every one at the plan's
   **reduced workload**. Both arms, and the baseline, run the same way (``--config=fastci
   --config=fastci_record`` in line mode, overrides through a stand-in ``@fastci_plan``),
   so their costs compare, and both give the executed lines.

Per change: GPU-seconds of each arm (wall seconds on this host x max(GPUs, 1), from
the build event file: a cost proxy on a CPU-only machine), modified-code coverage
retention (per test, the changed lines the reduced run executed / those the full run
executed, summed), and **escapes** (a test that fails at full workload but passes
reduced). Totals: reduced vs full arm, reduced plans vs running every test at full
workload, retention, escapes, and after how many changes calibration pays for itself.
Exits 1 on an escape. (Whether the plans miss a failing test is the selection
benchmark's question: it runs everything per change.)
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bench.selection import CHANGES, patch_header
from fastci.config import Config
from fastci.eval.workspace import parse_changed_lines
from fastci.evidence.store.calibrations import CalibrationStore
from fastci.evidence.store.ingest import Checksums, results_from_bep
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
from fastci.integrations.bazel.query import list_gpu_tests
from fastci.integrations.git.repository import Git
from fastci.integrations.bazel.testlogs import test_dir
from fastci.plan.planner import analyze
from fastci.plan.inputs import declared_test
from fastci.plan.prioritize import strategy_orders
from fastci.plan.inputs import Given
from fastci.run.calibration_runs import CalibrationReport, calibrate_bazel, decode_run, scrub_traces
from fastci.select.priority import STRATEGIES, apfdc

#: Flags of every arm: recorded in line mode (lines for retention), results never cached.
ARM_FLAGS = ("--config=fastci", "--config=fastci_record", "--test_env=FASTCI_RECORD_LINES=1",
             "--keep_going")
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class TestRun:
    """One test in one arm."""

    passed: bool
    gpu_s: float
    lines: Mapping[str, frozenset[int]]


@dataclass
class Row:
    """One change: its plan and both arms."""

    name: str
    kind: str
    planned: int = 0
    reduced: int = 0
    mode: str = ""
    full_gpu_s: float = 0.0
    reduced_gpu_s: float = 0.0
    changed_full: int = 0  # (test, changed line) pairs the full arm executed
    changed_kept: int = 0  # of those, executed by the reduced arm as well
    failing_full: tuple[str, ...] = ()
    escapes: tuple[str, ...] = ()  # fail at full, pass reduced
    reduced_only: tuple[str, ...] = ()  # pass at full, fail reduced (a false alarm)
    plan_s: float = 0.0
    # What safe equivalent-context pruning would skip on top (not applied to the arms):
    pruned: tuple[str, ...] = ()
    pruned_gpu_s: float = 0.0  # their cost in the reduced arm
    pruned_failing: tuple[str, ...] = ()  # of them, failing at full workload
    # APFDc of the full arm in each prioritization strategy's order (buggy changes).
    apfdc: dict[str, float] = field(default_factory=dict)
    # The same with the change as one fault, found by its first failing test.
    apfdc_change: dict[str, float] = field(default_factory=dict)
    # granularity: line (selection + line rule, no pruning): the tests it skips.
    line_skipped: tuple[str, ...] = ()
    # The ablation (issue 14 item 5): per stage, the tests it runs, in plan order.
    stages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    whys: list[str] = field(default_factory=list)
    note: str = ""

    costs_full: dict[str, float] = field(default_factory=dict)  # measured, per test
    costs_reduced: dict[str, float] = field(default_factory=dict)

    @property
    def retention(self) -> float:
        return self.changed_kept / self.changed_full if self.changed_full else 1.0


def changed_lines(ws: Path) -> dict[str, set[int]]:
    """Head-side lines of the working tree's changes to tracked ``.py`` files
    (``git diff -U0``; :func:`fastci.eval.workspace.parse_changed_lines`)."""
    out = subprocess.run(["git", "-C", str(ws), "diff", "-U0", "--no-color", "--", "*.py"],
                         capture_output=True, text=True, check=True).stdout
    return parse_changed_lines(out)


def run_arm(sc, tests: Mapping[str, Mapping[str, object]], gpus: Mapping[str, int], *,  # type: ignore[no-untyped-def]
            tag: str) -> dict[str, TestRun]:
    """Run ``tests`` (label -> overrides) once through Bazel, recorded in line mode."""
    if not tests:
        return {}
    testlogs = Path(sc.bazel.info("bazel-testlogs"))
    checksums = Checksums(sc.ws)
    with tempfile.TemporaryDirectory(prefix=f"fastci-bench-{tag}-") as tmp:
        repo = write_plan_repo(Path(tmp) / "plan", tests, status=f"bench reduction {tag}")
        bep = Path(tmp) / "bep.json"
        sc.bazel.test(list(tests), flags=[*ARM_FLAGS, override_flag(repo)], bep_path=bep)
        results = results_from_bep(bep) if bep.is_file() else {}
    out: dict[str, TestRun] = {}
    for label in tests:
        result = results.get(label)
        outputs = test_dir(testlogs, label) / "test.outputs"
        got = None
        if result is not None and outputs.is_dir():
            got = decode_run(label, outputs, None, checksums, source="bazel", result=result)
            scrub_traces(outputs)
        passed = result is not None and result.outcome == "passed"
        duration = result.duration_s if result is not None else 0.0
        out[label] = TestRun(passed, duration * max(gpus.get(label, 1), 1),
                             {p: frozenset(v) for p, v in (got.lines if got else {}).items()})
    return out


#: FastCI code that only runs when planning, never inside a test process (the launcher,
#: recorder, constraint evaluator and pytest plugin do): editing it cannot change what a
#: calibration measured, so the calibration cache ignores it.
PLAN_TIME = ("analyzer/fastci/select/**", "analyzer/fastci/changes/**",
             "analyzer/fastci/cli/**", "analyzer/fastci/plan/planner.py",
             "analyzer/fastci/plan/reduce.py", "analyzer/fastci/plan/model.py")


def calibration_digest(root: Path) -> str:
    """The calibration cache key: :data:`bench.demo.EVIDENCE_INPUTS` but :data:`PLAN_TIME`."""
    import hashlib

    from bench.demo import EVIDENCE_INPUTS, source_files
    from fastci.config import first_match

    digest = hashlib.sha256()
    for rel in sorted(source_files(root)):
        if first_match(rel, EVIDENCE_INPUTS) and not first_match(rel, PLAN_TIME):
            digest.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


def calibrated(sc, decls, echo: Callable[[str], None]) -> tuple[Path, CalibrationReport | None, float]:  # type: ignore[no-untyped-def]
    """The calibration of every gpu_test in the scratch workspace: from the cache when
    one was made for the same sources, else run (and cached). Returns its path, the
    report of a calibration run now (None: cached) and its cost in GPU-seconds."""
    from bench.demo import scratch_dir
    from fastci.evidence.record.environment import current_fingerprint

    path = sc.config.path(sc.ws, "calibration")
    digest = calibration_digest(sc.ws)
    cache = scratch_dir() / "evidence-cache" / (
        f"calibration-{digest}-{current_fingerprint()}-v{CALIBRATION_VERSION}.db")
    report: CalibrationReport | None = None
    if cache.exists():
        # Keyed by everything a calibration run executes or is shaped by
        # (calibration_digest): it describes this snapshot too (re-stamped).
        shutil.copyfile(cache, path)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE rung SET commit_sha = ?", (sc.commit,))
        echo(f"== calibration: reusing the one cached for these sources ({cache.name})")
    else:
        echo(f"== calibrating {len(decls)} gpu_test(s) with Bazel (cached for the next run)")
        declared = {d.id: declared_test(d) for d in decls}
        report = calibrate_bazel(sc.ws, [d.id for d in decls], declared, path, bazel=sc.bazel,
                                 commit=sc.commit, echo=lambda line: echo("   " + line))
        echo("   " + report.summary())
        shutil.copyfile(path, cache)
    with CalibrationStore.open(path) as store:
        cost = sum(r.gpu_s for t in store.tests() for r in store.rungs(t)
                   if r.commit == sc.commit)
    return path, report, cost


def bench_change(sc, patch: Path, cfg: Config, declared, gpus: Mapping[str, int]) -> Row:  # type: ignore[no-untyped-def]
    """Apply ``patch``, plan it with the calibration, run both arms, undo it."""
    subject, kind = patch_header(patch)
    row = Row(patch.stem, kind)
    applied = subprocess.run(["git", "-C", str(sc.ws), "apply", "--recount", str(patch)],
                             capture_output=True, text=True)
    if applied.returncode != 0:
        row.note = "patch does not apply: " + (applied.stderr.strip().splitlines() or ["?"])[0]
        return row
    try:
        changed = changed_lines(sc.ws)
        with EvidenceStore.open(sc.store_path) as store:
            t0 = time.perf_counter()
            # Reduction alone; a risk-based priority so the analysis reads the line facts
            # every strategy is then ordered with (strategy_orders).
            analysis = analyze(sc.ws, dataclasses.replace(cfg, priority="risk"), base=sc.commit,
                               declared=Given(declared), store=store, prune="off")
            row.plan_s = time.perf_counter() - t0
            with_pruning = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store,
                                   prune="safe")
            by_lines = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store,
                               prune="off", granularity="line")
            lines_pruned = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store,
                                   prune="safe", granularity="line")
            orders = strategy_orders(analysis, store, Git(sc.ws), declared)
        plan = analysis.plan
        row.pruned = tuple(sorted(d.test for d in with_pruning.selection.decisions if d.pruned))
        row.line_skipped = tuple(sorted(d.test for d in by_lines.selection.decisions
                                        if d.set_aside))
        unordered = sorted(t.id for t in analysis.plan.tests)
        row.stages = {"select (unit)": tuple(unordered),
                      "+ line granularity": tuple(sorted(t.id for t in by_lines.plan.tests)),
                      "+ safe pruning": tuple(sorted(t.id for t in lines_pruned.plan.tests)),
                      "+ prioritize": tuple(t.id for t in lines_pruned.plan.tests)}
        row.mode = plan.mode
        tests = {t.id: dict(t.overrides) for t in plan.tests}
        if plan.mode == "all":  # everything, at full workload
            tests = {label: {} for label in declared}
        row.planned = len(tests)
        row.reduced = sum(1 for o in tests.values() if o)
        row.whys = [f"{t.rsplit(':', 1)[-1]}: {c.why}" for t, c in sorted(analysis.choices.items())
                    if t in tests]
        full = run_arm(sc, {t: {} for t in tests}, gpus, tag=f"{patch.stem}-full")
        reduced = run_arm(sc, {t: o for t, o in tests.items() if o}, gpus,
                          tag=f"{patch.stem}-reduced")
    finally:
        subprocess.run(["git", "-C", str(sc.ws), "checkout", "-q", "--", "."], check=False)
    for label in tests:
        f = full[label]
        r = reduced.get(label, f)  # a test the plan does not reduce runs once, at full
        row.costs_full[label] = f.gpu_s
        row.costs_reduced[label] = r.gpu_s
        row.full_gpu_s += f.gpu_s
        row.reduced_gpu_s += r.gpu_s
        for path, want in changed.items():
            hit = want & f.lines.get(path, frozenset())
            row.changed_full += len(hit)
            row.changed_kept += len(hit & r.lines.get(path, frozenset()))
    row.failing_full = tuple(sorted(t for t in tests if not full[t].passed))
    row.pruned_gpu_s = sum(reduced.get(t, full[t]).gpu_s for t in row.pruned if t in full)
    measured = {t: full[t].gpu_s for t in tests}
    for name, tests_in_order in orders.items():
        ran = [t for t in tests_in_order if t in measured]
        got = apfdc(ran, measured, row.failing_full)
        if got is not None:
            row.apfdc[name] = got
        got = apfdc(ran, measured, row.failing_full, one_fault=True)
        if got is not None:
            row.apfdc_change[name] = got
    row.pruned_failing = tuple(t for t in row.pruned if t in row.failing_full)
    row.escapes = tuple(t for t in row.failing_full if t in reduced and reduced[t].passed)
    row.reduced_only = tuple(sorted(t for t in reduced if full[t].passed
                                    and not reduced[t].passed))
    return row


def report(rows: Sequence[Row], *, all_gpu_s: float, calibration_gpu_s: float,
           calibration_full_gpu_s: float, calibrated_tests: int) -> list[str]:
    """The per-change table and the totals."""
    lines = ["== workload reduction on real changes of examples/microllm (each plan's tests "
             "run at full and at the planned workload; GPU-s = wall seconds here x GPUs)",
             f"  {'change':<32} {'kind':<6} {'planned':>7} {'reduced':>7} {'full GPU-s':>10} "
             f"{'reduced GPU-s':>13} {'ratio':>6} {'retention':>9} {'fail':>4} {'escapes':>7}"]
    for r in rows:
        ratio = f"{r.reduced_gpu_s / r.full_gpu_s:.2f}" if r.full_gpu_s else "-"
        kept = f"{r.changed_kept}/{r.changed_full}" if r.changed_full else "-"
        lines.append(f"  {r.name:<32} {r.kind:<6} {r.planned:>7} {r.reduced:>7} "
                     f"{r.full_gpu_s:>10.1f} {r.reduced_gpu_s:>13.1f} {ratio:>6} {kept:>9} "
                     f"{len(r.failing_full):>4} {len(r.escapes):>7}")
        if r.escapes:
            lines.append(f"    ESCAPED: {', '.join(r.escapes)}")
        if r.reduced_only:
            lines.append(f"    fails only reduced (false alarm): {', '.join(r.reduced_only)}")
        if r.pruned:
            caught = "yes" if set(r.failing_full) - set(r.pruned) else (
                "no" if r.failing_full else "-")
            lines.append(f"    safe pruning would skip {len(r.pruned)} more ({r.pruned_gpu_s:.1f} "
                         f"GPU-s); failing among them: {list(r.pruned_failing) or 'none'}; "
                         f"the change still fails in a kept test: {caught}")
        if r.note:
            lines.append(f"    note: {r.note}")
    ran = [r for r in rows if not r.note]
    full = sum(r.full_gpu_s for r in ran)
    red = sum(r.reduced_gpu_s for r in ran)
    everything = all_gpu_s * len(ran)
    n_kept, n_seen = sum(r.changed_kept for r in ran), sum(r.changed_full for r in ran)
    buggy = [r for r in ran if r.failing_full]
    b_kept, b_seen = sum(r.changed_kept for r in buggy), sum(r.changed_full for r in buggy)
    lines.append(f"  total over {len(ran)} changes: reduced plans {red:.0f} GPU-s vs the same "
                 f"tests at full workload {full:.0f} GPU-s ({red / full if full else 0:.2f}x; "
                 "target <= 0.33x)")
    lines.append(f"  vs running every test at full workload on every change ({everything:.0f} "
                 f"GPU-s): selection alone saves {100 * (1 - full / everything) if everything else 0:.1f}%, "
                 f"selection + reduction {100 * (1 - red / everything) if everything else 0:.1f}% "
                 "(target >= 85%)")
    lines.append(f"  modified-code coverage retention: {n_kept}/{n_seen} (test, changed line) pairs "
                 f"({100 * n_kept / n_seen if n_seen else 100:.1f}%); on the {len(buggy)} buggy changes "
                 f"{b_kept}/{b_seen} ({100 * b_kept / b_seen if b_seen else 100:.1f}%)")
    lines.append(f"  escapes (fail at full, pass reduced): {sum(len(r.escapes) for r in ran)}; "
                 f"false alarms (fail only reduced): {sum(len(r.reduced_only) for r in ran)}")
    pruned = sum(r.pruned_gpu_s for r in ran)
    lost = [r.name for r in ran if r.failing_full and not set(r.failing_full) - set(r.pruned)]
    lines.append(f"  + safe pruning (measured arms, not applied): {red - pruned:.0f} GPU-s "
                 f"({100 * (1 - (red - pruned) / everything) if everything else 0:.1f}% saved vs "
                 f"everything); failing tests it would skip: "
                 f"{sum(len(r.pruned_failing) for r in ran)}; buggy changes no kept test would "
                 f"catch: {len(lost)}{' (' + ', '.join(lost) + ')' if lost else ''}")
    line_gpu = sum(r.full_gpu_s for r in ran) - sum(
        full_cost(r, t) for r in ran for t in r.line_skipped)
    line_lost = [r.name for r in ran if r.failing_full
                 and not set(r.failing_full) - set(r.line_skipped)]
    lines.append(f"  + line granularity (measured arms, not applied): skips "
                 f"{sum(len(r.line_skipped) for r in ran)} tests; full-workload GPU-s "
                 f"{line_gpu:.0f} of {full:.0f} ({line_gpu / full if full else 0:.2f}x); failing "
                 f"tests it would skip: {sum(len(set(r.line_skipped) & set(r.failing_full)) for r in ran)}"
                 f"; buggy changes no kept test would catch: {len(line_lost)}"
                 f"{' (' + ', '.join(line_lost) + ')' if line_lost else ''}")
    lines.extend(ablation(ran))
    for name in STRATEGIES:
        values = [r.apfdc_change[name] for r in ran if name in r.apfdc_change]
        per_test = [r.apfdc[name] for r in ran if name in r.apfdc]
        if values:
            lines.append(f"  APFDc of the full arm in the {name!r} order: mean {sum(values) / len(values):.3f} "
                         f"over {len(values)} buggy change(s), the change one fault (min "
                         f"{min(values):.3f}); each failing test a fault: "
                         f"{sum(per_test) / len(per_test):.3f}")
    saved = (full - red) / len(ran) if ran else 0.0
    runs = (calibration_gpu_s / calibration_full_gpu_s if calibration_full_gpu_s else 0.0)
    pays = f"{calibration_gpu_s / saved:.1f} changes" if saved > 0 else "never (nothing saved)"
    lines.append(f"  calibration of {calibrated_tests} gpu_test(s): {calibration_gpu_s:.0f} GPU-s "
                 f"= {runs:.1f} full runs of them (target <= ~10); it pays for itself after "
                 f"{pays} (reduction saves {saved:.1f} GPU-s per change here)")
    return lines


def full_cost(row: Row, test: str) -> float:
    """``test``'s measured GPU-seconds in ``row``'s full arm (0 when it did not run)."""
    return row.costs_full.get(test, 0.0)


def ablation(rows: Sequence[Row]) -> list[str]:
    """Issue 14 item 5: one line per stage over the changes, from the measured arms.

    Each stage runs a subset of the unit plan's tests (all of which ran at full and at
    the planned workload), so its cost, its misses (failing tests it drops; buggy
    changes where no test it keeps fails) and its order's APFDc and time to first
    failure (GPU-s run before the first failing test finishes, one slot) are measured,
    not estimated. ``+ reduce`` is the last stage at the planned workloads.

    From ``+ pruned run on failure`` on, the stages do what ``fastci run`` does: when a
    test the stage kept fails, the pruned tests run after it, at full workload
    (:func:`fastci.run.runner.execute`); ``+ safe pruning`` is the prune alone, never
    running them (plain ``bazel test --config=fastci``).
    """
    out = ["  ablation (real runs; misses relative to the unit plan, which the selection "
           "benchmark measures against running everything):",
           f"    {'stage':<26} {'tests':>6} {'GPU-s':>8} {'failing dropped':>15} "
           f"{'changes missed':>14} {'APFDc':>6} {'TTFF GPU-s':>10}"]
    stages = {  # name: (the stage whose tests it runs, the pruned run after a failure)
        "select (unit)": ("select (unit)", False),
        "+ line granularity": ("+ line granularity", False),
        "+ safe pruning": ("+ safe pruning", False),
        "+ pruned run on failure": ("+ safe pruning", True),
        "+ prioritize": ("+ prioritize", True),
        "+ reduce": ("+ prioritize", True),
    }
    for name, (key, after_failure) in stages.items():
        cost = 0.0
        tests = dropped = missed = 0
        apf: list[float] = []
        ttff: list[float] = []
        for r in rows:
            run = list(r.stages.get(key, ()))
            failing = set(r.failing_full)
            costs = dict(r.costs_reduced if name == "+ reduce" else r.costs_full)
            if after_failure and failing & set(run):
                pruned = [t for t in r.stages.get("+ line granularity", ()) if t not in run]
                run += pruned
                costs.update({t: r.costs_full.get(t, 0.0) for t in pruned})  # run full
            cost += sum(costs.get(t, 0.0) for t in run)
            tests += len(run)
            dropped += len(failing - set(run))
            if failing and not failing & set(run):
                missed += 1
            if failing & set(run):
                got = apfdc(run, {t: costs.get(t, 0.0) for t in run}, tuple(failing),
                            one_fault=True)
                if got is not None:
                    apf.append(got)
                spent = 0.0
                for t in run:
                    spent += costs.get(t, 0.0)
                    if t in failing:
                        break
                ttff.append(spent)
        mean = f"{sum(apf) / len(apf):.3f}" if apf else "-"
        first = f"{sum(ttff) / len(ttff):.1f}" if ttff else "-"
        out.append(f"    {name:<26} {tests:>6} {cost:>8.0f} {dropped:>15} {missed:>14} "
                   f"{mean:>6} {first:>10}")
    out.append("    (APFDc and TTFF: means over the buggy changes a stage catches; the first "
               "four stages run in test-id order)")
    return out


def run(*, only: Sequence[str] = (), fresh: bool = False,
        echo: Callable[[str], None] = print) -> tuple[list[str], list[Row]]:
    """Run the benchmark; returns the report lines and the rows."""
    from bench.demo import prepare

    changes = sorted(p for p in CHANGES.glob("*.patch") if not only or any(o in p.stem for o in only))
    sc = prepare(echo, reuse=not fresh)
    try:
        decls = list_gpu_tests(sc.bazel, sc.config.targets)
        declared = {d.id: declared_test(d) for d in decls}
        gpus = {d.id: d.gpus for d in decls}
        path, _report, cal_cost = calibrated(sc, decls, echo)
        with CalibrationStore.open(path) as store:
            full_rungs = [r for t in store.tests() for r in store.rungs(t)
                          if r.commit == sc.commit and r.rung == "full"]
        cfg = dataclasses.replace(sc.config, calibration=str(path))
        echo(f"== run-all at full workload on the base ({len(decls)} gpu_tests)")
        t0 = time.perf_counter()
        base = run_arm(sc, {d.id: {} for d in decls}, gpus, tag="run-all")
        all_gpu_s = sum(t.gpu_s for t in base.values())
        echo(f"   {sum(t.passed for t in base.values())}/{len(base)} passed, {all_gpu_s:.0f} "
             f"GPU-s ({time.perf_counter() - t0:.0f} s)")
        rows: list[Row] = []
        for patch in changes:
            echo(f"-- {patch.stem}")
            t0 = time.perf_counter()
            rows.append(bench_change(sc, patch, cfg, declared, gpus))
            r = rows[-1]
            echo(f"   planned {r.planned} ({r.mode}), reduced {r.reduced}: {r.full_gpu_s:.0f} vs "
                 f"{r.reduced_gpu_s:.0f} GPU-s, retention {r.changed_kept}/{r.changed_full}, "
                 f"failing {[t.rsplit(':', 1)[-1] for t in r.failing_full]}, escapes "
                 f"{list(r.escapes)} ({time.perf_counter() - t0:.0f} s) {r.note}")
            for why in r.whys:
                echo(f"   {why}")
        lines = report(rows, all_gpu_s=all_gpu_s, calibration_gpu_s=cal_cost,
                       calibration_full_gpu_s=sum(r.gpu_s for r in full_rungs),
                       calibrated_tests=len(full_rungs))
        return lines, rows
    finally:
        sc.bazel.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.reduction [--only NAME...] [--fresh]``; exits 1 on an escape."""
    parser = argparse.ArgumentParser(prog="python -m bench.reduction")
    parser.add_argument("--only", nargs="*", default=(), help="changes whose name contains these")
    parser.add_argument("--fresh", action="store_true",
                        help="copy the checkout into the scratch workspace again")
    args, _unknown = parser.parse_known_args(argv)
    lines, rows = run(only=args.only, fresh=args.fresh)
    print("\n".join(lines))
    escapes = [f"ESCAPED {r.name}: {', '.join(r.escapes)}" for r in rows if r.escapes]
    if escapes:
        print("\n".join(escapes))
        print(f"reduction benchmark FAILED: {len(escapes)} change(s) with an escape",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
