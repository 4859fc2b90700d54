"""Selection benchmark: FastCI's plan vs run-all on real edits of the example framework.

For each patch in ``bench/changes/`` (real edits of microllm, several of them
injected bugs: a wrong all-reduce, an off-by-one in rotary positions, a broken
checkpoint RNG restore...), in the scratch workspace of ``make demo``:

1. apply the patch; ``fastci plan`` it against evidence recorded on the base;
2. run *every* gpu_test (run-all) through Bazel and read the build event file;
3. report tests selected vs all, "s x GPUs" (each test's wall seconds on this
   CPU-only host times its declared GPUs: a cost proxy, not GPU time) of the
   plan's tests vs all tests in that same run-all execution, and whether every
   test that failed under run-all is in the plan (the safety property).

Run-all executes at the tests' declared *floors* by default (a plan that
overrides every test to its floors): the full workloads take too long on a
CPU-only CI machine. ``--full`` runs the full workloads. Either way the plan's
s x GPUs are measured in the same execution as run-all's.

The mutation round (:mod:`fastci.eval.faults`) does the same for seeded single-site
mutants (slice bounds, comparison flips, off-by-one constants, dropped statements,
swapped arguments, boolean flips, wrong reductions or dtypes) of the units the
patches change: each is planned, then the whole suite really runs. A mutant no test detects under run-all is reported as such (it
may be equivalent), not as a miss. Any test failing under run-all but missing from
the plan, for a patch or a mutant, is a MISS and makes the benchmark exit 1.

The last part, :mod:`bench.selection_synthetic`, times planning at 10,000 tests x
50,000 units.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from fastci.eval.faults import Mutant, changed_units, generate, read_sources, sample_units
from fastci.plan.planner import analyze
from fastci.plan.inputs import declared_test
from fastci.plan.inputs import Given
from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.bazel.query import list_gpu_tests
from fastci.errors import FastCIError
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.git.tree import plan_tree
from fastci.plan.model import Plan, PlannedTest, dump_plan

HERE = Path(__file__).resolve().parent
CHANGES = HERE / "changes"


#: The operators the mutation round had when its length was set: slice, compare, constant,
#: drop, swap (fastci.eval.faults.OPERATORS[:5]; later ones are appended to OPERATORS).
BENCH_OPERATOR_COUNT = 5

#: Mutants in ``make bench``'s round: as many as BENCH_OPERATOR_COUNT, not len(OPERATORS). A
#: run-all at floors takes 1.5-2.5 min on the 2-core CI machine, so five plus the baseline run
#: keep the round near 12 minutes; each added operator would add a run-all. The five come from
#: a seeded draw of operators (generate's round-robin); ``--mutants N`` with N >= len(OPERATORS)
#: covers every operator.
DEFAULT_MUTANTS = BENCH_OPERATOR_COUNT


@dataclass(frozen=True)
class Outcome:
    """One change's row."""

    name: str
    kind: str
    selected: int
    total: int
    plan_gpu_s: float
    all_gpu_s: float
    failing: tuple[str, ...]
    missed: tuple[str, ...]  # failing under run-all but not in the plan
    plan_s: float
    note: str = ""


@dataclass(frozen=True)
class MutantOutcome:
    """One mutant's row: the mutant and what planning and run-all did with it."""

    mutant: Mutant
    outcome: Outcome
    base_failing: frozenset[str] = frozenset()  # tests failing in the unmutated baseline run

    @property
    def detecting(self) -> tuple[str, ...]:
        """Tests failing under run-all with the mutant that pass without it."""
        return tuple(t for t in self.outcome.failing if t not in self.base_failing)

    @property
    def detected(self) -> bool:
        """Whether the mutant made a test fail (undetected mutants may be equivalent)."""
        return bool(self.detecting)

    @property
    def caught(self) -> bool:
        """Detected, and the plan holds every test that detected it."""
        return self.detected and not self.outcome.missed


def patch_header(path: Path) -> tuple[str, str]:
    """The ``Subject:`` and ``Kind:`` lines of a change file."""
    subject, kind = path.stem, "?"
    for line in path.read_text().splitlines():
        if line.startswith("Subject:"):
            subject = line.split(":", 1)[1].strip()
        elif line.startswith("Kind:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("diff --git"):
            break
    return subject, kind


def _git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ws), *args], capture_output=True, text=True)


def run_all(sc, decls, *, full: bool, tag: str) -> tuple[dict[str, tuple[bool, float]], str]:  # type: ignore[no-untyped-def]
    """Run every gpu_test (floors unless ``full``); label -> (passed, duration_s)."""
    tests = tuple(PlannedTest(d.id, {} if full else dict(d.floors)) for d in decls)
    # Tied to the tree it runs on: the rules obey no plan tied to no tree.
    dump_plan(Plan(mode="selective", reason=f"bench run-all ({'full' if full else 'floors'})",
                   tests=tests, tree=plan_tree(sc.ws)), sc.config.path(sc.ws, "plan"))
    bep = sc.ws / ".fastci" / "runs" / f"bench-{tag}.json"
    bep.parent.mkdir(parents=True, exist_ok=True)
    res = sc.bazel.test([d.id for d in decls], flags=["--config=fastci", "--keep_going"],
                        bep_path=bep)
    report = parse_bep(bep)
    out = {label: (o.passed, o.duration_s) for label, o in report.outcomes.items()}
    for d in decls:  # a test with no result did not pass
        out.setdefault(d.id, (False, 0.0))
    return out, f"bazel exit {res.returncode}"


def bench_change(sc, patch: Path, decls, declared, *, full: bool) -> Outcome:  # type: ignore[no-untyped-def]
    """Apply one patch, plan it, run everything, compare."""
    subject, kind = patch_header(patch)
    applied = _git(sc.ws, "apply", "--recount", str(patch))
    if applied.returncode != 0:
        return Outcome(patch.stem, kind, 0, len(decls), 0.0, 0.0, (), (), 0.0,
                       note="patch does not apply: " + applied.stderr.strip().splitlines()[0])
    return _measure(sc, patch.stem, kind, decls, declared, full=full)


def bench_mutant(sc, mutant: Mutant, decls, declared, *, full: bool,  # type: ignore[no-untyped-def]
                 base_failing: frozenset[str] = frozenset()) -> MutantOutcome:
    """Apply one mutant in the scratch workspace, plan it, run everything, compare."""
    try:
        mutant.apply(sc.ws)
    except (OSError, FastCIError) as exc:
        _git(sc.ws, "checkout", "-q", "--", ".")
        return MutantOutcome(mutant, Outcome(mutant.name, mutant.operator, 0, len(decls), 0.0, 0.0,
                                             (), (), 0.0, note=f"not applied: {exc}"), base_failing)
    return MutantOutcome(mutant, _measure(sc, mutant.name, mutant.operator, decls, declared,
                                          full=full), base_failing)


def _measure(sc, name: str, kind: str, decls, declared, *, full: bool) -> Outcome:  # type: ignore[no-untyped-def]
    """Plan the edit applied in ``sc.ws``, run every test, compare; then undo the edit."""
    try:
        with EvidenceStore.open(sc.store_path) as store:
            t0 = time.perf_counter()
            analysis = analyze(sc.ws, sc.config, base=sc.commit, declared=Given(declared), store=store)
            plan_s = time.perf_counter() - t0
        planned = {t.id for t in analysis.plan.tests}
        results, note = run_all(sc, decls, full=full, tag=name)
    finally:
        _git(sc.ws, "checkout", "-q", "--", ".")
    gpus = {d.id: d.gpus for d in decls}
    gpu_s = {t: dur * max(gpus.get(t, 1), 1) for t, (_, dur) in results.items()}
    failing = tuple(sorted(t for t, (ok, _) in results.items() if not ok))
    missed = tuple(t for t in failing if t not in planned)
    mode = analysis.plan.mode
    return Outcome(name, kind, len(planned), len(decls),
                   sum(gpu_s.get(t, 0.0) for t in planned), sum(gpu_s.values()), failing, missed,
                   plan_s, note=("plan widened: " + analysis.plan.reason) if mode == "all" else note)


#: The cost column's name: wall seconds on this (CPU-only) host times the declared GPUs.
COST = "CPU-s x GPUs"


def report(rows: Sequence[Outcome], *, full: bool) -> list[str]:
    """The table and totals."""
    lines = ["== selection on real changes of examples/microllm "
             f"(run-all measured at {'full workloads' if full else 'floors'}; "
             f"{COST} = CPU wall seconds here x declared GPUs, not GPU time)",
             f"  {'change':<34} {'kind':<7} {'selected':>9} {'plan ' + COST:>14} {'all ' + COST:>13} "
             f"{'fail':>5} {'safe':>5} {'plan s':>7}"]
    for r in rows:
        safe = "yes" if not r.missed else "NO"
        lines.append(f"  {r.name:<34} {r.kind:<7} {r.selected:>4}/{r.total:<4} {r.plan_gpu_s:>14.1f} "
                     f"{r.all_gpu_s:>13.1f} {len(r.failing):>5} {safe:>5} {r.plan_s:>7.2f}")
        if r.missed:
            lines.append(f"    MISSED: {', '.join(r.missed)}")
        if r.note and not r.note.startswith("bazel exit"):
            lines.append(f"    note: {r.note}")
    ran = [r for r in rows if r.all_gpu_s > 0]
    sel, tot = sum(r.selected for r in ran), sum(r.total for r in ran)
    pg, ag = sum(r.plan_gpu_s for r in ran), sum(r.all_gpu_s for r in ran)
    fails = sum(len(r.failing) for r in ran)
    caught = fails - sum(len(r.missed) for r in ran)
    lines.append(f"  total: {len(ran)} changes, {sel}/{tot} test runs selected "
                 f"({100 * sel / max(tot, 1):.0f}%), {COST} {pg:.0f} vs {ag:.0f} "
                 f"({100 * (1 - pg / ag) if ag else 0:.0f}% saved), failing tests in the plan: "
                 f"{caught}/{fails}")
    return lines


def mutation_report(rows: Sequence[MutantOutcome], *, seed: int, full: bool,
                    baseline: Sequence[str] | None = None) -> list[str]:
    """The mutation round's table and totals (``baseline``: tests failing without a mutant)."""
    lines = [f"== mutation round: {len(rows)} seeded mutants (seed {seed}) of the units the changes "
             f"touch (run-all at {'full workloads' if full else 'floors'})",
             "  baseline run-all without a mutant: " + (
                 "not run" if baseline is None else
                 f"failing {', '.join(baseline)}" if baseline else "every test passes"),
             f"  {'mutant':<48} {'op':<8} {'selected':>9} {'fail':>5} {'missed':>6}"]
    for r in rows:
        o = r.outcome
        lines.append(f"  {o.name:<48} {o.kind:<8} {o.selected:>4}/{o.total:<4} "
                     f"{len(o.failing):>5} {len(o.missed):>6}")
        lines.append(f"    {r.mutant.unit} line {r.mutant.line}: {r.mutant.description}")
        if o.missed:
            lines.append(f"    MISSED: {', '.join(o.missed)}")
        elif r.detected:
            lines.append(f"    caught: {', '.join(t.rsplit(':', 1)[-1] for t in r.detecting)}")
        elif not o.note.startswith("not applied"):
            lines.append("    not detected by run-all (no test fails because of it: equivalent "
                         "or untested)")
        if o.note and not o.note.startswith("bazel exit"):
            lines.append(f"    note: {o.note}")
    detected = [r for r in rows if r.detected]
    missed = [r for r in rows if r.outcome.missed]
    lines.append(f"  total: {len(rows)} mutants, {len(detected)} detected by run-all, "
                 f"{sum(r.caught for r in rows)} caught by the plan, {len(missed)} misses "
                 f"({sum(len(r.outcome.missed) for r in rows)} failing tests not planned)")
    return lines


def miss_lines(patch_rows: Sequence[Outcome], mutant_rows: Sequence[MutantOutcome]) -> list[str]:
    """One ``MISSED`` line per change or mutant with a failing test the plan left out."""
    rows = list(patch_rows) + [m.outcome for m in mutant_rows]
    return [f"MISSED {r.name}: {', '.join(r.missed)}" for r in rows if r.missed]


def exit_code(patch_rows: Sequence[Outcome], mutant_rows: Sequence[MutantOutcome]) -> int:
    """1 when any test failing under run-all was not in the plan (for a change or a mutant), else 0."""
    return 1 if miss_lines(patch_rows, mutant_rows) else 0


@dataclass(frozen=True)
class Result:
    """What :func:`run` measured: the report lines and the rows behind them."""

    lines: list[str]
    patch_rows: list[Outcome]
    mutant_rows: list[MutantOutcome]


def make_mutants(root: Path, config, *, count: int, seed: int, extra_units: int = 0,  # type: ignore[no-untyped-def]
                 store_path: Path | None = None,
                 echo: Callable[[str], None] = print) -> list[Mutant]:
    """The round's mutants of the units the changes in ``bench/changes/`` touch in ``root``.

    With ``extra_units``, a seeded sample of that many other units executed by the recorded
    tests (read from ``store_path``) in the same package joins them.
    """
    problems: list[str] = []
    units = changed_units(root, sorted(CHANGES.glob("*.patch")), ignore=config.ignore,
                          problems=problems)
    for p in problems:
        echo(f"   mutation round: skipping a change: {p}")
    extra: list[str] = []
    if extra_units and store_path is not None:
        with EvidenceStore.open(store_path) as store:
            executed = {u for _, u, _ in store.recorded_units()}
            extra = sample_units(executed, units, count=extra_units, seed=seed)
    echo(f"   mutating {len(units)} changed units" + (f" + {len(extra)} sampled" if extra else "")
         + f": {', '.join(u.rsplit('/', 1)[-1] for u in units + extra)}")
    return generate(read_sources(root, units + extra), units + extra, count=count, seed=seed)


def run(workdir: Path, *, full: bool = False, only: Sequence[str] = (), fresh: bool = False,
        synthetic: bool = True, patches: bool = True, mutants: int = DEFAULT_MUTANTS,
        seed: int = 0, extra_units: int = 0, baseline: bool = True,
        echo: Callable[[str], None] = print) -> Result:
    """Run the benchmark: the changes, the mutation round, the scale part."""
    from bench.demo import prepare

    lines: list[str] = []
    changes = sorted(p for p in CHANGES.glob("*.patch") if not only or any(o in p.stem for o in only))
    if not patches:
        changes = []
    rows: list[Outcome] = []
    mrows: list[MutantOutcome] = []
    if changes or mutants > 0:
        sc = prepare(echo, reuse=not fresh)
        try:
            decls = list_gpu_tests(sc.bazel, sc.config.targets)
            declared = {d.id: declared_test(d) for d in decls}
            for patch in changes:
                echo(f"-- {patch.stem}")
                rows.append(bench_change(sc, patch, decls, declared, full=full))
                r = rows[-1]
                echo(f"   selected {r.selected}/{r.total}, failing {list(r.failing)}, missed "
                     f"{list(r.missed)} {r.note}")
            if rows:
                lines += report(rows, full=full)
            if mutants > 0:
                echo(f"-- mutation round: {mutants} mutants, seed {seed}")
                chosen = make_mutants(sc.ws, sc.config, count=mutants, seed=seed,
                                      extra_units=extra_units, store_path=sc.store_path, echo=echo)
                base: list[str] | None = None
                if baseline:
                    # Tests that fail with no mutant at all detect nothing: one run-all says which.
                    t0 = time.perf_counter()
                    results, _ = run_all(sc, decls, full=full, tag="mutation-baseline")
                    base = sorted(t for t, (ok, _) in results.items() if not ok)
                    echo(f"-- baseline: failing {base} ({time.perf_counter() - t0:.0f} s)")
                for m in chosen:
                    echo(f"-- {m.name}: {m.unit} line {m.line}: {m.description}")
                    t0 = time.perf_counter()
                    mrows.append(bench_mutant(sc, m, decls, declared, full=full,
                                              base_failing=frozenset(base or ())))
                    o = mrows[-1].outcome
                    echo(f"   selected {o.selected}/{o.total}, failing {list(o.failing)}, missed "
                         f"{list(o.missed)} {o.note} ({time.perf_counter() - t0:.0f} s)")
                lines += mutation_report(mrows, seed=seed, full=full, baseline=base)
        finally:
            sc.bazel.shutdown()
    if synthetic:
        from bench.selection_synthetic import run as run_synthetic

        lines += run_synthetic(workdir)
    return Result(lines, rows, mrows)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.selection [--full] [--only NAME...] [--mutants N] [--seed S] ...``.

    Exits 1 when any test failing under run-all was not in the plan.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.selection")
    parser.add_argument("--full", action="store_true", help="run-all at full workloads")
    parser.add_argument("--only", nargs="*", default=(), help="changes whose name contains these")
    parser.add_argument("--no-patches", action="store_true", help="skip the changes in bench/changes")
    parser.add_argument("--mutants", type=int, default=DEFAULT_MUTANTS, metavar="N",
                        help=f"mutants in the mutation round (default {DEFAULT_MUTANTS}, from as "
                             "many operators, seeded; each runs the whole suite)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutation round")
    parser.add_argument("--extra-units", type=int, default=0, metavar="K",
                        help="also mutate K other executed units of the package (seeded sample)")
    parser.add_argument("--no-mutations", action="store_true", help="skip the mutation round")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the mutation round's run-all without a mutant (then a test "
                             "failing at the base counts as detecting every mutant)")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the scale benchmark")
    parser.add_argument("--fresh", action="store_true",
                        help="re-copy the checkout (and re-record if it changed) even when "
                             "the scratch snapshot of the last demo/bench holds the same "
                             "sources (a snapshot of other sources is never reused)")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "fastci-bench")
    args = parser.parse_args(argv)
    result = run(args.workdir, full=args.full, only=args.only, fresh=args.fresh,
                 synthetic=not args.no_synthetic, patches=not args.no_patches,
                 mutants=0 if args.no_mutations else args.mutants, seed=args.seed,
                 extra_units=args.extra_units, baseline=not args.no_baseline)
    misses = miss_lines(result.patch_rows, result.mutant_rows)
    print("\n".join(result.lines + misses))
    if misses:
        print(f"selection benchmark FAILED: {len(misses)} change(s) or mutant(s) with a failing "
              "test the plan left out", file=sys.stderr)
    return exit_code(result.patch_rows, result.mutant_rows)


if __name__ == "__main__":
    sys.exit(main())
