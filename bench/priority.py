"""Prioritization benchmark (issue 14 item 3): APFDc of every strategy, on real runs.

In the scratch workspace of ``make demo`` (evidence recorded on its base commit):

1. **The bench changes** (``bench/changes/*.patch``, the selection benchmark's). Each is
   applied and planned as ``fastci plan`` plans it (prune off; with the calibration the
   reduction benchmark leaves in the workspace, when it is there: the order then weighs
   each test's cost at its reduced workload, and line facts; ``make bench`` runs the
   reduction benchmark first). The report says which. The plan's
   selected tests then really run at full workload through Bazel (not recorded, results
   never cached), so each test's cost (seconds x GPUs) and outcome are measured.
2. **Held-out faults**: ``--mutants N`` seeded single-site mutants
   (:mod:`fastci.eval.faults`) of the example's units that between 2 and ``--max-tests``
   tests reach, planned and run the same way. The strategies were not chosen on them.

Every strategy (:data:`fastci.select.priority.STRATEGIES`) orders each plan's selected
tests from the same facts (:func:`fastci.plan.prioritize.strategy_orders`); its APFDc takes
the change as one fault, found by its first failing test, over the measured costs
(:func:`fastci.select.priority.apfdc`). Only plans with a failing test count. The report
gives, per set, each strategy's mean and worst, and which strategy is best. Selection is
not judged here (the selection benchmark runs everything for that): a test the plan does
not select does not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bench.selection import CHANGES
from fastci.errors import FastCIError
from fastci.evidence.store.db import EvidenceStore
from fastci.eval.faults import Mutant, generate, read_sources
from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
from fastci.integrations.bazel.query import list_gpu_tests
from fastci.integrations.git.repository import Git
from fastci.plan.planner import analyze
from fastci.plan.inputs import declared_test
from fastci.plan.prioritize import strategy_orders
from fastci.plan.inputs import Given
from fastci.select.priority import DEFAULT, STRATEGIES, apfdc
from fastci.units.index import split_unit_id

#: The example's framework code: where held-out faults are drawn.
PACKAGE = "examples/microllm/microllm/"


@dataclass
class Row:
    """One change or fault: its plan's tests, what failed, and each strategy's APFDc."""

    name: str
    held_out: bool
    tests: int = 0
    failing: tuple[str, ...] = ()
    apfdc: dict[str, float] = dataclasses.field(default_factory=dict)
    note: str = ""
    #: Per strategy, the GPU-seconds run in its order until the first failing test ends
    #: (one slot: what a developer waits for).
    ttff: dict[str, float] = dataclasses.field(default_factory=dict)


def held_out_faults(ws: Path, store: EvidenceStore, *, count: int, seed: int,
                    max_tests: int) -> list[Mutant]:
    """``count`` seeded mutants of :data:`PACKAGE` units that 2 to ``max_tests`` tests
    reach (class and module bodies left out: they run at import, in every test)."""
    reach: dict[str, set[str]] = {}
    for test, unit, _checksum in store.recorded_units():
        if split_unit_id(unit)[0].startswith(PACKAGE) and not unit.endswith("::<module>"):
            reach.setdefault(unit, set()).add(test)
    narrow = sorted(u for u, tests in reach.items() if 2 <= len(tests) <= max_tests)
    picked = sorted(random.Random(seed).sample(narrow, min(len(narrow), 2 * count)))
    return generate(read_sources(ws, picked), picked, count=count, seed=seed)


def measure(sc, name: str, apply: Callable[[], None], cfg, declared, gpus: Mapping[str, int],  # type: ignore[no-untyped-def]
            *, held_out: bool) -> Row:
    """Apply a change, plan it, run its selected tests at full workload, score the orders."""
    row = Row(name, held_out)
    try:
        try:
            apply()
        except (subprocess.CalledProcessError, FastCIError) as exc:
            row.note = f"does not apply: {exc}"
            return row
        with EvidenceStore.open(sc.store_path) as store:
            analysis = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store,
                               prune="off")
            orders = strategy_orders(analysis, store, Git(sc.ws), declared)
        selected = [t.id for t in analysis.plan.tests]
        if analysis.plan.mode != "selective" or not selected:
            row.note = f"plan {analysis.plan.mode}, {len(selected)} selected: not scored"
            return row
        with tempfile.TemporaryDirectory(prefix="fastci-bench-priority-") as tmp:
            repo = write_plan_repo(Path(tmp) / "plan", {t: {} for t in selected},
                                   status="bench priority: full workload")
            bep = Path(tmp) / "bep.json"
            sc.bazel.test(selected, flags=["--config=fastci", override_flag(repo), "--keep_going",
                                           "--nocache_test_results"], bep_path=bep)
            outcomes = parse_bep(bep).outcomes if bep.is_file() else {}
    finally:
        subprocess.run(["git", "-C", str(sc.ws), "checkout", "-q", "--", "."], check=False)
    row.tests = len(selected)
    cost = {t: o.duration_s * max(gpus.get(t, 1), 1) for t, o in outcomes.items()}
    # A selected test Bazel reported nothing for (it did not build) counts as failing.
    row.failing = tuple(sorted(t for t in selected if t not in outcomes or not outcomes[t].passed))
    for strategy, tests in orders.items():
        got = apfdc([t for t in tests if t in cost or t in row.failing], cost, row.failing,
                    one_fault=True)
        if got is not None:
            row.apfdc[strategy] = got
        first = time_to_first_failure(tests, cost, row.failing)
        if first is not None:
            row.ttff[strategy] = first
    return row


def time_to_first_failure(order: Sequence[str], cost: Mapping[str, float],
                          failing: Sequence[str]) -> float | None:
    """GPU-seconds spent running ``order`` one test at a time until the first failing test
    ends (a test without a measured cost counts 0); None when none fails."""
    spent = 0.0
    for test in order:
        spent += cost.get(test, 0.0)
        if test in failing:
            return spent
    return None


def report(rows: Sequence[Row]) -> list[str]:
    """Per set (bench changes, held-out faults) each strategy's mean and worst APFDc over
    the rows with a failing test, the rows themselves, and the best strategy."""
    out: list[str] = []
    names = list(STRATEGIES)
    for held_out, title in ((False, "bench changes"), (True, "held-out faults")):
        rows_in = [r for r in rows if r.held_out is held_out]
        if not rows_in:
            continue
        scored = [r for r in rows_in if r.apfdc]
        out.append(f"  {title}: {len(rows_in)} planned and run, {len(scored)} with a failing test")
        out.append("    " + f"{'change':<48} {'tests':>5} {'fail':>4} "
                   + " ".join(f"{n:>13}" for n in names))
        for r in rows_in:
            cells = " ".join(f"{r.apfdc[n]:>13.3f}" if n in r.apfdc else f"{'-':>13}"
                             for n in names)
            out.append(f"    {r.name[:48]:<48} {r.tests:>5} {len(r.failing):>4} {cells}"
                       + (f"  ({r.note})" if r.note else ""))
        if not scored:
            continue
        means = {n: sum(r.apfdc.get(n, 0.0) for r in scored) / len(scored) for n in names}
        worst = {n: min(r.apfdc.get(n, 0.0) for r in scored) for n in names}
        out.append("    " + f"{'mean':<48} {'':>5} {'':>4} "
                   + " ".join(f"{means[n]:>13.3f}" for n in names))
        out.append("    " + f"{'worst':<48} {'':>5} {'':>4} "
                   + " ".join(f"{worst[n]:>13.3f}" for n in names))
        timed = [r for r in scored if r.ttff]
        if timed:
            out.append("    " + f"{'mean TTFF GPU-s':<48} {'':>5} {'':>4} "
                       + " ".join(f"{sum(r.ttff.get(n, 0.0) for r in timed) / len(timed):>13.1f}"
                                  for n in names))
        best = max(names, key=lambda n: (means[n], worst[n]))
        # No gate on one APFDc number: an order becomes the default only if it wins on
        # held-out faults it was not chosen on (docs/SELECTION.md, "Order").
        out.append(f"    best mean APFDc on the {title}: {best} {means[best]:.3f} "
                   f"(default {DEFAULT}: {means[DEFAULT]:.3f})")
    return out


def run(*, mutants: int, seed: int, max_tests: int, only: Sequence[str] = (),
        echo: Callable[[str], None] = print) -> tuple[list[str], list[Row]]:
    """Run the benchmark; returns the report lines and the rows."""
    from bench.demo import prepare

    sc = prepare(echo, reuse=True)
    try:
        decls = list_gpu_tests(sc.bazel, sc.config.targets)
        declared = {d.id: declared_test(d) for d in decls}
        gpus = {d.id: d.gpus for d in decls}
        cfg = sc.config
        calibration = sc.config.path(sc.ws, "calibration")
        if calibration.is_file():
            cfg = dataclasses.replace(cfg, calibration=str(calibration))
        echo("== plans " + (f"with the calibration in the workspace ({calibration.name}: the "
                            "reduction benchmark's; reduced costs and line facts)"
                            if calibration.is_file() else
                            "without a calibration (python -m bench.reduction leaves one): "
                            "recorded costs, no line facts"))
        rows: list[Row] = []
        for patch in sorted(p for p in CHANGES.glob("*.patch")
                            if not only or any(o in p.stem for o in only)):
            t0 = time.perf_counter()
            rows.append(measure(sc, patch.stem, functools.partial(_apply, sc.ws, patch), cfg,
                                declared, gpus, held_out=False))
            echo(f"-- {patch.stem}: {rows[-1].tests} tests, {len(rows[-1].failing)} failing "
                 f"({time.perf_counter() - t0:.0f} s)")
        with EvidenceStore.open(sc.store_path) as store:
            faults = held_out_faults(sc.ws, store, count=mutants, seed=seed, max_tests=max_tests)
        for m in faults:
            t0 = time.perf_counter()
            rows.append(measure(sc, m.name, functools.partial(m.apply, sc.ws), cfg, declared,
                                gpus, held_out=True))
            echo(f"-- {m.name} ({m.description}): {rows[-1].tests} tests, "
                 f"{len(rows[-1].failing)} failing ({time.perf_counter() - t0:.0f} s)")
        return report(rows), rows
    finally:
        sc.bazel.shutdown()


def _apply(ws: Path, patch: Path) -> None:
    subprocess.run(["git", "-C", str(ws), "apply", "--recount", str(patch)], check=True,
                   capture_output=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.priority [--mutants N] [--seed S] [--max-tests K] [--only NAME...]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.priority")
    parser.add_argument("--mutants", type=int, default=24, metavar="N",
                        help="held-out faults (seeded mutants; default 24)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the held-out faults")
    parser.add_argument("--max-tests", type=int, default=16, metavar="K",
                        help="draw faults in units at most K tests reach (default 16)")
    parser.add_argument("--only", nargs="*", default=(), help="bench changes whose name contains these")
    args, _unknown = parser.parse_known_args(argv)
    lines, _rows = run(mutants=args.mutants, seed=args.seed, max_tests=args.max_tests,
                       only=args.only)
    print("== prioritization on real runs (APFDc, the change one fault; costs measured)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
