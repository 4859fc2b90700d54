"""``fastci run``: run a plan through Bazel and pytest (node ids; the only runner without a
Bazel workspace) in priority order and record the results; ``--fail-fast`` stops at the
first failure (docs/RUNNING.md). While Bazel runs, its progress (tests finished, ETA) goes
to stderr (:mod:`fastci.progress`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastci import config as config_mod
from fastci.cli.command import Command
from fastci.errors import PlanError, StoreError

OK, FAIL = 0, 1


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", help="plan file to run (default: config `plan`)")
    p.add_argument("--store", help="evidence store to record results in (default: config `store`)")
    p.add_argument("--root", type=Path, default=Path("."), help="workspace root (default: .)")
    p.add_argument("--no-record", action="store_true", help="do not record results in the store")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop at the first failing test (bazel --notest_keep_going, pytest -x); "
                        "the tests that did not run are counted as not run")
    p.add_argument("--full-sample", nargs="?", const="config", default=None, metavar="RATE",
                   help="after the plan, run a sample of its reduced tests that passed again at "
                        "full workload and record both (a post-merge job: a failure there is an "
                        "escape, and raises the test's learned floors); RATE: the share drawn, "
                        "seeded by the commit (default: config `full_sample`, 0.1)")


def _run(args: argparse.Namespace) -> int:
    from fastci.plan.model import Plan, load_plan
    from fastci.progress import Progress
    from fastci.run.runner import execute

    root = args.root.resolve()
    rate = args.full_sample if args.full_sample != "config" else None
    cfg = config_mod.load(root, overrides={"plan": args.plan, "store": args.store,
                                           "full_sample": rate})
    sample = cfg.full_sample if args.full_sample is not None else None
    source = cfg.path(root, "plan")
    try:
        plan = load_plan(source)
    except PlanError as exc:
        print(f"fastci run: {exc}: running every test at full workload")
        plan = Plan.run_all(str(exc))
    if plan.mode != "all" and plan.base is not None:
        from fastci.plan.planner import plan_file_at

        _, moved = plan_file_at(root, cfg, plan.base)
        if moved is not None:
            problem = f"{moved}, so {source} is not the plan `fastci plan` wrote"
            print(f"fastci run: WARNING: {problem}: running every test at full workload")
            plan = Plan.run_all(f"plan not obeyed: {problem}")
    store = None
    if not args.no_record:
        from fastci.evidence.store.db import EvidenceStore

        try:
            store = EvidenceStore.open(cfg.path(root, "store"), create=True)
        except StoreError as exc:
            # The tests matter more than their history: run them, record nothing,
            # and leave the store as it is for a person to look at.
            print(f"fastci run: {exc}: running the plan without recording results")
    # Progress on stderr while Bazel runs; closed before the lines after it, so the
    # last line on stdout stays `N passed, N failed`.
    progress = Progress(None, "run")
    try:
        report = execute(root, plan, cfg, store=store, fail_fast=args.fail_fast,
                         echo=progress.echo, progress=progress, full_sample=sample,
                         source=source)
    finally:
        progress.close()
        if store is not None:
            store.close()
    return OK if report.failed == 0 else FAIL


COMMAND = Command("run", "run the plan through Bazel and pytest, record outcomes, print N passed, N failed",
                  _add_arguments, _run)
