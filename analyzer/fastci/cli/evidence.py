"""``fastci evidence show TEST``: what a test depends on, as recorded; ``fastci evidence
export`` / ``import``: the store as one file to publish between CI jobs."""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from fastci import config
from fastci.cli.command import Command
from fastci.errors import FastCIError
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
    export = sub.add_parser("export", help="write the store as one compact file to publish "
                                           "between CI jobs (docs/EVIDENCE.md, \"Sharing\")")
    export.add_argument("--out", type=Path, required=True, help="file to write (.jsonl.gz)")
    export.add_argument("--commit", help="the commit the evidence describes (default: the "
                                         "newest evidence's)")
    export.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")
    imp = sub.add_parser("import", help="merge exported files into the store (any order, "
                                        "idempotent)")
    imp.add_argument("files", type=Path, nargs="+", help="files written by `evidence export`")
    imp.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")


def _exchange(args: argparse.Namespace, path: Path) -> int:
    from fastci.evidence.store.exchange import export_store, import_runs, load_export
    from fastci.evidence.store.db import EvidenceStore

    if args.action == "export":
        out = args.out.expanduser().resolve()
        if out in {Path(f"{path.resolve()}{suffix}") for suffix in ("", "-wal", "-shm")}:
            raise FastCIError(f"--out {args.out} is the evidence store itself: export writes a "
                              "new file; choose another path")
        if out.is_dir():
            raise FastCIError(f"--out {args.out} is a directory: name the file to write")
        with EvidenceStore.open(path) as store:
            try:
                m = export_store(store, out, commit=args.commit)
            except OSError as exc:
                raise FastCIError(f"cannot write {args.out}: {exc.strerror or exc}") from exc
        size = out.stat().st_size
        print(f"fastci evidence: wrote {args.out}: {m.runs} runs of {m.tests} tests, commit "
              f"{(m.commit or '?')[:12]}, {size / 1e6:.2f} MB, {m.digest}")
        return 0
    loaded = [(f, *load_export(f)) for f in args.files]  # all checked before the store is touched
    with EvidenceStore.open(path, create=True) as store:
        for f, m, runs in loaded:
            done = import_runs(store, runs, where=str(f))
            for line in (*done.warnings, *done.conflicts):
                print(f"fastci evidence: warning: {line}")
            print(f"fastci evidence: imported {f}: {done.new} new of {m.runs} runs "
                  f"(commit {(m.commit or '?')[:12]})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Print the evidence of one test, or export / import the store."""
    from fastci.evidence.store.db import EvidenceStore
    from fastci.integrations.git.repository import repo_root

    root = repo_root(Path.cwd())
    if args.action in ("export", "import"):
        return _exchange(args, args.store or config.load(root).path(root, "store"))
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
                          "last_run": last.as_dict() if last else None}, indent=2, sort_keys=True,
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
    help="show what a test depends on (units with contexts, files, last run); export or "
         "import the store between CI jobs",
    add_arguments=add_arguments,
    run=run,
)
