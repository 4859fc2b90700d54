"""``fastci eval``: measure FastCI's plans against running everything, on real runs.

``fastci eval [CHANGE...] [--faults N] [--tests ID...] [--gpu-slots G] [--out DIR]``
evaluates each change (a commit, a range ``A..B``, a patch file; default ``HEAD``)
in a scratch worktree (:mod:`fastci.eval.harness`) and writes ``DIR/results.jsonl``,
``DIR/summary.md`` (also appended to ``$GITHUB_STEP_SUMMARY`` when set) and
``DIR/report.html``. ``--from FILE...`` runs nothing: it merges result files and
writes the reports. Exits 1 when the plan missed a test that failed under run-all,
so a nightly shadow evaluation fails loudly (docs/EVAL.md).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from fastci.cli.command import Command

if TYPE_CHECKING:
    from fastci.eval.results import ChangeResult

OK, MISSED = 0, 1


def default_slots() -> int:
    """The host's GPUs (the pool ``fastci run`` schedules on), at least 1."""
    from fastci.run.gpus import discover_devices

    return max(len(discover_devices(os.environ).devices), 1)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("changes", nargs="*", metavar="CHANGE",
                   help="a commit, a range A..B (each commit against its parent) or a patch "
                        "file (applied to --base); default: HEAD")
    p.add_argument("--base", default="HEAD", help="the commit patch files apply to (default: HEAD)")
    p.add_argument("--faults", type=int, default=0, metavar="N",
                   help="add N generated faults (seeded libcst mutants) per changed unit")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated faults (default: 0)")
    p.add_argument("--tests", nargs="+", default=[], metavar="ID",
                   help="restrict everything to these tests (ids or globs), for a quick look")
    p.add_argument("--gpu-slots", type=int, default=None, metavar="G",
                   help="GPU slots the latencies are scheduled on (default: the host's GPUs, "
                        "at least 1)")
    p.add_argument("--out", type=Path, default=Path(".fastci/eval"),
                   help="output folder: results.jsonl, summary.md, report.html and the "
                        "baseline cache (default: .fastci/eval)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the scratch worktree and the store copy live (default: "
                        "~/.cache/fastci/eval/<repository>)")
    runner = p.add_mutually_exclusive_group()
    runner.add_argument("--bazel", dest="runner", action="store_const", const="bazel",
                        help="run gpu_tests with Bazel (default: config `runner`)")
    runner.add_argument("--no-bazel", dest="runner", action="store_const", const="pytest",
                        help="run tests with pytest (default: config `runner`)")
    p.add_argument("--prune", choices=("off", "safe", "aggressive"), default=None,
                   help="plan with this pruning mode (default: config `prune`)")
    p.add_argument("--granularity", choices=("unit", "line"), default=None,
                   help="plan with this granularity (default: config `granularity`)")
    p.add_argument("--from", dest="merge", nargs="+", type=Path, default=[], metavar="FILE",
                   help="run nothing: merge these results.jsonl files into --out and report")
    p.add_argument("--title", default="FastCI evaluation", help="the reports' title")
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")


def _report(results: Sequence[ChangeResult], out: Path, title: str) -> float:
    """Write the reports; returns the seconds it took."""
    from fastci.eval.report import write_reports

    t0 = time.perf_counter()
    summary, html = write_reports(results, out, title=title)
    print(f"wrote {out / 'results.jsonl'}, {summary} and {html}")
    return time.perf_counter() - t0


def _headline(results: Sequence[ChangeResult]) -> None:
    from fastci.eval.results import totals

    t = totals(results)
    print(f"{t.changes} change(s): GPU-s {t.fastci_gpu_s:.0f} vs {t.all_gpu_s:.0f} run-all "
          f"({100 * t.gpu_saved:.1f}% saved); latency {t.fastci_latency_s:.0f} vs "
          f"{t.all_latency_s:.0f} s ({100 * t.latency_saved:.1f}% saved); retention "
          f"{t.retained_lines}/{t.changed_lines} ({100 * t.retention:.1f}%); detected "
          f"{t.detected}/{t.detectable} failing change(s); missed test(s): {t.missed_tests}")
    for r in results:
        for m in r.missed:
            print(f"MISSED {m.get('test')} in {m.get('change')}: {m.get('why')}")


def _run(args: argparse.Namespace) -> int:
    from fastci.eval.results import merge, read_results, write_results
    from fastci.integrations.git.repository import repo_root

    root = repo_root(args.root.resolve())
    out = args.out if args.out.is_absolute() else root / args.out
    if args.merge:
        results = merge(*(read_results(p) for p in args.merge))
        write_results(out / "results.jsonl", results)
        _report(results, out, args.title)
        _headline(results)
        return MISSED if any(r.missed for r in results) else OK
    from fastci.eval.harness import EvalOptions, run_evaluation

    options = EvalOptions(changes=tuple(args.changes), base=args.base, faults=args.faults,
                          seed=args.seed, tests=tuple(args.tests),
                          gpu_slots=args.gpu_slots or default_slots(), out=out,
                          workdir=args.workdir, runner=args.runner, prune=args.prune,
                          granularity=args.granularity)
    evaluation = run_evaluation(root, options)
    report_s = _report(evaluation.results, out, args.title)
    _headline(evaluation.new)
    runs = sum(r.timing.get("runs", 0.0) for r in evaluation.new) + evaluation.warmup_s
    overhead = sum(r.timing.get("bookkeeping", 0.0) for r in evaluation.new) + \
        evaluation.setup_s + report_s
    analysis = sum(r.analysis_s for r in evaluation.new)
    if runs > 0:
        print(f"harness overhead: {overhead:.1f} s (set-up, bookkeeping, reports) = "
              f"{100 * overhead / runs:.1f}% of the {runs:.0f} s of test runs it made; "
              f"FastCI's analysis: {analysis:.1f} s")
    return MISSED if any(r.missed for r in evaluation.new) else OK


COMMAND = Command("eval", "measure plans against running everything on real runs: "
                  "results.jsonl, summary.md, report.html", _add_arguments, _run)
