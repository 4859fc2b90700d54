"""``fastci explain TEST``: why a test runs or is skipped for a change."""

from __future__ import annotations

import argparse

from fastci.cli.command import Command
from fastci.cli.options import add_change_arguments
from fastci.plan.build import analyze_change
from fastci.select.explain import explain
from fastci.types import normalize_test_id


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("test", help="test id (Bazel label or pytest node id)")
    add_change_arguments(p)


def _run(args: argparse.Namespace) -> int:
    args.test = normalize_test_id(args.test)  # `@//p:t` and `//p` name `//p:t` and `//p:p`
    root = args.root.resolve()
    cfg, analysis = analyze_change(root, base=args.base, head=args.head, store=args.store,
                                   query_bazel=not args.no_bazel)
    store = None
    try:
        from fastci.evidence.store import EvidenceStore

        store = EvidenceStore.open(cfg.path(root, "store"))
    except Exception:  # noqa: BLE001 - contexts are optional detail; the decision is known
        store = None
    try:
        for line in explain(analysis.selection, args.test, store):
            print(line)
    finally:
        if store is not None:
            store.close()
    return 0 if args.test in analysis.selection.by_test else 1


COMMAND = Command("explain", "explain why a test runs or is skipped for a change",
                  _add_arguments, _run)
