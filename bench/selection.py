"""Selection benchmark: FastCI's plan vs run-all on real edits of the example framework.

For each patch in ``bench/changes/`` (real edits of microllm, several of them
injected bugs: a wrong all-reduce, an off-by-one in rotary positions, a broken
checkpoint RNG restore...), in the scratch workspace of ``make demo``:

1. apply the patch; ``fastci plan`` it against evidence recorded on the base;
2. run *every* gpu_test (run-all) through Bazel and read the build event file;
3. report tests selected vs all, measured GPU-seconds (duration x GPUs) of the
   plan's tests vs all tests in that same run-all execution, and whether every
   test that failed under run-all is in the plan (the safety property).

Run-all executes at the tests' declared *floors* by default (a plan that
overrides every test to its floors): the full workloads take too long on a
CPU-only CI machine. ``--full`` runs the full workloads. Either way the plan's
GPU-seconds are measured in the same execution as run-all's. The second part,
:mod:`bench.selection_synthetic`, times planning at 10,000 tests x 50,000 units.
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

from fastci.analyze import analyze
from fastci.bazel.bep import parse_bep
from fastci.bazel.query import list_gpu_tests
from fastci.evidence.store import EvidenceStore
from fastci.plan import Plan, PlannedTest, dump_plan
from fastci.select import DeclaredTest

HERE = Path(__file__).resolve().parent
CHANGES = HERE / "changes"


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
    dump_plan(Plan(mode="selective", reason=f"bench run-all ({'full' if full else 'floors'})",
                   tests=tests), sc.config.path(sc.ws, "plan"))
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
    try:
        with EvidenceStore.open(sc.store_path) as store:
            t0 = time.perf_counter()
            analysis = analyze(sc.ws, sc.config, base=sc.commit, declared=declared, store=store)
            plan_s = time.perf_counter() - t0
        planned = {t.id for t in analysis.plan.tests}
        results, note = run_all(sc, decls, full=full, tag=patch.stem)
    finally:
        _git(sc.ws, "checkout", "-q", "--", ".")
    gpus = {d.id: d.gpus for d in decls}
    gpu_s = {t: dur * max(gpus.get(t, 1), 1) for t, (_, dur) in results.items()}
    failing = tuple(sorted(t for t, (ok, _) in results.items() if not ok))
    missed = tuple(t for t in failing if t not in planned)
    mode = analysis.plan.mode
    return Outcome(patch.stem, kind, len(planned), len(decls),
                   sum(gpu_s.get(t, 0.0) for t in planned), sum(gpu_s.values()), failing, missed,
                   plan_s, note=("plan widened: " + analysis.plan.reason) if mode == "all" else note)


def report(rows: Sequence[Outcome], *, full: bool) -> list[str]:
    """The table and totals."""
    lines = ["== selection on real changes of examples/microllm "
             f"(run-all measured at {'full workloads' if full else 'floors'}; GPU-s = duration x GPUs)",
             f"  {'change':<34} {'kind':<7} {'selected':>9} {'plan GPU-s':>11} {'all GPU-s':>10} "
             f"{'fail':>5} {'safe':>5} {'plan s':>7}"]
    for r in rows:
        safe = "yes" if not r.missed else "NO"
        lines.append(f"  {r.name:<34} {r.kind:<7} {r.selected:>4}/{r.total:<4} {r.plan_gpu_s:>11.1f} "
                     f"{r.all_gpu_s:>10.1f} {len(r.failing):>5} {safe:>5} {r.plan_s:>7.2f}")
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
                 f"({100 * sel / max(tot, 1):.0f}%), GPU-s {pg:.0f} vs {ag:.0f} "
                 f"({100 * (1 - pg / ag) if ag else 0:.0f}% saved), failing tests in the plan: "
                 f"{caught}/{fails}")
    return lines


def run(workdir: Path, *, full: bool = False, only: Sequence[str] = (), fresh: bool = False,
        synthetic: bool = True, echo: Callable[[str], None] = print) -> list[str]:
    """Run the benchmark and return its report lines."""
    from fastci.demo import prepare

    lines: list[str] = []
    patches = sorted(p for p in CHANGES.glob("*.patch") if not only or any(o in p.stem for o in only))
    if patches:
        sc = prepare(echo, reuse=not fresh)
        try:
            decls = list_gpu_tests(sc.bazel, sc.config.targets)
            declared = {d.id: DeclaredTest(d.id, d.gpus, dict(d.workload)) for d in decls}
            rows = []
            for patch in patches:
                echo(f"-- {patch.stem}")
                rows.append(bench_change(sc, patch, decls, declared, full=full))
                r = rows[-1]
                echo(f"   selected {r.selected}/{r.total}, failing {list(r.failing)}, missed "
                     f"{list(r.missed)} {r.note}")
            lines += report(rows, full=full)
        finally:
            sc.bazel.shutdown()
    if synthetic:
        from bench.selection_synthetic import run as run_synthetic

        lines += run_synthetic(workdir)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.selection [--full] [--only NAME...] [--no-synthetic]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.selection")
    parser.add_argument("--full", action="store_true", help="run-all at full workloads")
    parser.add_argument("--only", nargs="*", default=(), help="changes whose name contains these")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the scale benchmark")
    parser.add_argument("--fresh", action="store_true",
                        help="re-copy the checkout (and re-record if it changed) instead of "
                             "reusing the scratch snapshot of the last demo/bench")
    parser.add_argument("--workdir", type=Path,
                        default=Path(tempfile.gettempdir()) / "fastci-bench")
    args = parser.parse_args(argv)
    lines = run(args.workdir, full=args.full, only=args.only, fresh=args.fresh,
                synthetic=not args.no_synthetic)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
