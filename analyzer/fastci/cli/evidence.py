"""``fastci evidence show TEST``: what a test depends on, as recorded."""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from fastci import config
from fastci.cli.command import Command
from fastci.errors import FastCIError
from fastci.evidence.store import EvidenceStore
from fastci.integrations.git.repository import repo_root
from fastci.types import normalize_test_id


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``show TEST``, ``--store``, ``--json`` and ``--max-contexts``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="units (with contexts), files and last run of a test")
    show.add_argument("test", help="test id (Bazel label or pytest node id)")
    show.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.add_argument("--max-contexts", type=int, default=3,
                      help="contexts shown per unit (default: 3; 0 = all)")


def run(args: argparse.Namespace) -> int:
    """Print the evidence of one test."""
    root = repo_root(Path.cwd())
    store = EvidenceStore.open(args.store or config.load(root).path(root, "store"))
    args.test = normalize_test_id(args.test)
    try:
        if args.test not in set(store.test_ids()):
            raise FastCIError(f"no evidence for {args.test!r}; `fastci record` records it")
        units = store.units_of_test(args.test)
        files = store.files_of_test(args.test)
        runs = store.runs_of_test(args.test)
    finally:
        store.close()
    last = runs[-1] if runs else None
    if args.json:
        print(json.dumps({"test": args.test, "units": units, "files": files,
                          "last_run": last.__dict__ if last else None}, indent=2, sort_keys=True,
                         default=str))
        return 0
    print(args.test)
    if last:
        when = datetime.datetime.fromtimestamp(last.recorded_at, datetime.timezone.utc)
        print(f"  last run: {last.outcome}, {last.duration_s:.1f}s, {last.gpus} GPU(s), "
              f"{'complete' if last.complete else 'INCOMPLETE'} evidence, "
              f"commit {(last.commit or '?')[:12]}, env {last.env_fingerprint or '?'}, "
              f"{when:%Y-%m-%d %H:%M} UTC, workload {json.dumps(dict(last.workload), sort_keys=True)}")
    print(f"  units ({len(units)}):")
    for uid in sorted(units):
        sigs = units[uid]
        print(f"    {uid}  [{len(sigs)} context(s)]")
        shown = sigs if args.max_contexts == 0 else sigs[: args.max_contexts]
        for sig in shown:
            print(f"        {sig}")
        if len(shown) < len(sigs):
            print(f"        ... {len(sigs) - len(shown)} more")
    print(f"  files read ({len(files)}):")
    for path in files:
        print(f"    {path}")
    return 0


COMMAND = Command(
    name="evidence",
    help="show what a test depends on (units with contexts, files, last run)",
    add_arguments=add_arguments,
    run=run,
)
