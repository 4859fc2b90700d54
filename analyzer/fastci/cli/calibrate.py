"""``fastci calibrate``: run tests at the rungs of their workload ladder.

The runner is chosen as ``fastci plan`` chooses it (:func:`fastci.plan.inputs.choose_runner`).
Bazel: the gpu_tests and their declarations come from ``bazel query`` (every gpu_test
under config ``targets``, or the labels and patterns given), and
:func:`fastci.run.calibration_runs.calibrate_bazel` runs the rungs in rounds of ``bazel test``.
pytest: ``pytest --collect-only`` in the tests' interpreter reads each item's
``fastci_workload`` and ``gpus`` markers, and :func:`fastci.run.calibration_runs.calibrate`
runs one process per rung. Either way the rungs go into the calibration store
(config ``calibration``, never the evidence store). docs/CALIBRATION.md. One line per rung
on stdout as before, and the progress of the rungs to run, with an ETA, on stderr
(:mod:`fastci.progress`).

Bad input stops the command before anything runs, with one line and a nonzero exit:
an unreadable calibration store (left as it is), tests the runner cannot list or a
test it does not know.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from fastci import config
from fastci.cli.command import Command
from fastci.types import TestId, normalize_test_id

if TYPE_CHECKING:
    from fastci.integrations.bazel.runner import Bazel
    from fastci.run.calibration_runs import CalibrationReport, Declared

__all__ = ["COMMAND", "add_arguments", "run"]

#: The exit code when a rung run by the command did not pass (its rung is stored).
EXIT_RUNG_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the tests, ``--store``, ``--bazel-flag``, ``--pytest-arg``, ``--root``,
    ``--bazel``/``--no-bazel`` and ``--no-resume``."""
    parser.add_argument("tests", nargs="*", metavar="TEST",
                        help="Bazel labels or target patterns of gpu_tests, or pytest node ids "
                             "or paths (default: every gpu_test under config `targets`, or "
                             "every test pytest collects that declares a workload)")
    parser.add_argument("--bazel-flag", action="append", default=[], dest="bazel_flags",
                        metavar="FLAG", help="extra flag for every `bazel test` (repeatable)")
    runner = parser.add_mutually_exclusive_group()
    runner.add_argument("--bazel", dest="runner", action="store_const", const="bazel",
                        default=None, help="calibrate gpu_tests with Bazel")
    runner.add_argument("--no-bazel", dest="runner", action="store_const", const="pytest",
                        help="calibrate pytest tests (no Bazel)")
    parser.add_argument("--store", type=Path, default=None,
                        help="calibration store (default: config `calibration`, "
                             ".fastci/calibration.db)")
    parser.add_argument("--pytest-arg", action="append", default=[], dest="pytest_args",
                        metavar="ARG", help="extra argument for every pytest run (repeatable)")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="repository root (default: the repository holding .)")
    parser.add_argument("--no-resume", action="store_true",
                        help="run every rung again, even those already calibrated at this "
                             "commit under the same declaration")
    parser.add_argument("--every-rung", action="store_true",
                        help="also run the rungs left out as not needed: those a smaller "
                             "passing rung makes useless (it reaches every line, arc and "
                             "context of the full run), and midpoints whose floor did not "
                             "cost less than the full workload")


def _is_pattern(target: str) -> bool:
    """Whether a Bazel target names several targets (``//p/...``, ``//p:all``, ``//p:*``)."""
    return target.endswith("...") or target.endswith((":all", ":*", ":all-targets"))


def gpu_tests(bazel: Bazel, targets: Sequence[str], *, universe: str) -> dict[TestId, Declared]:
    """The gpu_tests to calibrate, with their declarations (``bazel query``).

    ``targets`` are labels and target patterns (empty: every gpu_test under ``universe``).

    Raises:
        CalibrationError: a label is not a gpu_test, or a pattern holds none.
        BazelError: the query failed.
    """
    from fastci.integrations.bazel.query import list_gpu_tests
    from fastci.plan.inputs import declared_test
    from fastci.run.calibration_runs import CalibrationError

    found: dict[TestId, Declared] = {}
    if not targets:
        for d in list_gpu_tests(bazel, universe):
            found[d.id] = declared_test(d)
        return found
    patterns = [t for t in targets if _is_pattern(t)]
    labels = [normalize_test_id(t) for t in targets if not _is_pattern(t)]
    for pattern in patterns:
        decls = list_gpu_tests(bazel, pattern)
        if not decls:
            raise CalibrationError(f"{pattern}: no gpu_test matches")
        for d in decls:
            found[d.id] = declared_test(d)
    if labels:
        known = {d.id: d for d in list_gpu_tests(bazel, universe)}
        for label in labels:
            if label not in known:
                raise CalibrationError(f"{label}: not a gpu_test under {universe}")
            found[label] = declared_test(known[label])
    return found


def learned_floors_of(store_path: Path, declared: Mapping[TestId, Declared]) -> dict[TestId, dict[str, Any]]:
    """Each test's floors learned from escapes in the evidence store's run history
    (dimension -> the value a rung must exceed; :func:`fastci.plan.reduce.learned_floors`),
    for the tests that have any. No store: none. An unreadable store stops the command
    (:class:`~fastci.errors.StoreError`): a rung below a learned floor must not stand in
    for others."""
    from fastci.plan.reduce import learned_floors_at
    from fastci.select import DeclaredTest

    found = learned_floors_at(store_path, {test: decl for test, decl in declared.items()
                                           if isinstance(decl, DeclaredTest)})
    return {test: {dim: value for dim, (value, _why) in floors.items()}
            for test, floors in found.items()}


def run(args: argparse.Namespace) -> int:
    """Collect, calibrate, print one line per rung (progress on stderr) and the cost summary.

    Exits 1 when a rung run now did not pass (it is stored, and never chosen)."""
    from fastci.evidence.store.calibrations import CalibrationStore
    from fastci.integrations.bazel.runner import Bazel
    from fastci.integrations.git.repository import repo_root
    from fastci.integrations.git.tree import evidence_commit
    from fastci.run.collect import collect
    from fastci.plan.inputs import choose_runner, runner_python
    from fastci.progress import Progress
    from fastci.run.calibration_runs import calibrate, calibrate_bazel

    root = repo_root(args.root.resolve())
    cfg = config.load(root, overrides={"calibration": str(args.store) if args.store else None,
                                       "runner": args.runner})
    store_path = cfg.path(root, "calibration")
    if store_path.exists():  # an unusable store stops everything before anything runs
        CalibrationStore.open(store_path).close()
    runner, why = choose_runner(root, cfg)
    if runner == "bazel":
        bz = Bazel(root, bazel=cfg.bazel)
        declared = gpu_tests(bz, list(args.tests), universe=cfg.targets)
        learned = learned_floors_of(cfg.path(root, "store"), declared)
        print(f"fastci calibrate: {len(declared)} gpu_test(s) with Bazel ({why})", flush=True)
        with Progress(None, "calibrate", unit="rung") as progress:
            report = calibrate_bazel(root, list(declared), declared, store_path, bazel=bz,
                                     flags=args.bazel_flags, commit=evidence_commit(root),
                                     echo=progress.echo, resume=not args.no_resume,
                                     progress=progress, every_rung=args.every_rung,
                                     learned=learned)
        return _finish(report, store_path)
    python = runner_python(root, cfg)
    declared = collect(root, list(args.tests), python=python, pytest_args=args.pytest_args)
    if args.tests:
        tests = list(declared)
    else:
        tests = [t for t, d in declared.items() if d is not None]
        quiet = len(declared) - len(tests)
        if quiet:
            print(f"fastci calibrate: {quiet} collected test(s) declare no workload "
                  "(no fastci_workload marker): not calibrated")
    learned = learned_floors_of(cfg.path(root, "store"), {t: declared[t] for t in tests})
    with Progress(None, "calibrate", unit="rung") as progress:
        report = calibrate(root, tests, declared, store_path, python=python,
                           pytest_args=args.pytest_args, commit=evidence_commit(root),
                           echo=progress.echo, resume=not args.no_resume, progress=progress,
                           every_rung=args.every_rung, learned=learned,
                           rung_timeout_s=cfg.rung_timeout_s)
    return _finish(report, store_path)


def _finish(report: CalibrationReport, store_path: Path) -> int:
    """Print the summary; 1 when a rung run now did not pass."""
    print(report.summary())
    print(f"fastci calibrate: rungs in {store_path} (not evidence: `fastci plan` reads them to "
          "choose reduced workloads)")
    if report.failed:
        test, rung, what = report.failed[0]
        print(f"fastci calibrate: {len(report.failed)} rung(s) did not pass, e.g. {test} at "
              f"{rung}: {what}", file=sys.stderr)
        return EXIT_RUNG_FAILED
    return 0


COMMAND = Command(
    name="calibrate",
    help="run gpu_tests (Bazel) or pytest tests at each rung of their workload ladder (full, "
         "floors, midpoints) and store the measured cost and coverage in the calibration store",
    add_arguments=add_arguments,
    run=run,
)
