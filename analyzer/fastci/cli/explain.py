"""``fastci explain TEST``: why a test runs or is skipped for a change."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastci.cli.command import Command
from fastci.config import Config
from fastci.cli.options import add_change_arguments
from fastci.types import RelPath, TestId, normalize_test_id, shown


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("test", help="test id (Bazel label or pytest node id; either names a gpu_test "
                                "whose main file is a pytest module)")
    add_change_arguments(p)


def _run(args: argparse.Namespace) -> int:
    from fastci.plan.planner import analyze_change
    from fastci.select.explain import explain, resolve

    args.test = normalize_test_id(args.test)  # `@//p:t` and `//p` name `//p:t` and `//p:p`
    root = args.root.resolve()
    cfg, analysis = analyze_change(root, base=args.base, head=args.head, store=args.store,
                                   runner=args.runner, prune=args.prune,
                                   granularity=args.granularity)
    store = None
    try:
        from fastci.evidence.store.db import EvidenceStore

        store = EvidenceStore.open(cfg.path(root, "store"))
    except Exception:  # noqa: BLE001 - contexts are optional detail; the decision is known
        store = None
    mains = None
    if analysis.runner == "bazel" and args.test not in analysis.selection.by_test:
        mains = _declared_mains(root, cfg)  # a main file that is not <name>.py
    try:
        for line in explain(analysis.selection, args.test, store, mains):
            print(line)
        for tid in resolve(analysis.selection, args.test, mains):
            choice = analysis.choices.get(tid)
            if choice is not None:  # the workload the plan gives it (fastci.plan.reduce)
                print(f"  workload {shown(tid)}: {choice.why}")
    finally:
        if store is not None:
            store.close()
    return 0 if resolve(analysis.selection, args.test, mains) else 1


def _declared_mains(root: Path, cfg: Config) -> dict[TestId, RelPath] | None:
    """Label -> main file of every declared gpu_test (None: no Bazel answer; the default main is assumed).

    Asked only when the runner is Bazel (:func:`fastci.plan.inputs.choose_runner`).
    """
    try:
        from fastci.integrations.bazel.mains import mains
        from fastci.integrations.bazel.query import list_gpu_tests
        from fastci.integrations.bazel.runner import Bazel

        return mains(list_gpu_tests(Bazel(root, cfg.bazel), cfg.targets))
    except Exception:  # noqa: BLE001 - the default main (<name>.py) is the fallback
        return None


COMMAND = Command("explain", "explain why a test runs or is skipped for a change",
                  _add_arguments, _run)
