"""``fastci ingest``: merge trace files (bazel-testlogs, pytest trace dirs) into the store.

The work is :func:`fastci.evidence.fill.ingest_paths`, which also says how the
evidence is stamped (``HEAD``, or ``dirty:<tree>`` for a modified tree).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastci import config
from fastci.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the trace paths, ``--bep``, ``--store``, ``--commit`` and ``--source``."""
    parser.add_argument("paths", nargs="*", type=Path,
                        help="trace files or directories (default: ./bazel-testlogs)")
    parser.add_argument("--bep", type=Path,
                        help="build event JSON file: outcomes/durations win over the traces', "
                             "and only its tests' testlogs are read")
    parser.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")
    parser.add_argument("--commit", help="commit the traces were recorded at (default: HEAD, "
                                         "or dirty:<tree id> when the source tree is modified)")
    parser.add_argument("--source-root", type=Path, default=None,
                        help="source tree the traces were recorded from, for unit checksums "
                             "(default: the repository)")
    parser.add_argument("--source", default=None, choices=("bazel", "pytest"),
                        help="where the traces come from (default: guessed from the paths)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="processes that merge traces while the store is written (default: "
                             "one per CPU, for 4,000 runs or more; 1: all in this process)")
    parser.add_argument("--keep-traces", action="store_true",
                        help="keep the trace files FastCI wrote under .fastci/ once they are in "
                             "the store (default: delete them; corrupt ones are always kept, "
                             "and Bazel's testlogs are never touched)")


def run(args: argparse.Namespace) -> int:
    """Ingest and print a summary; exit 1 if a trace was corrupt."""
    from fastci.evidence.fill import dirty_note, ingest_paths, summary
    from fastci.evidence.record.trace import remove_ingested
    from fastci.integrations.git.repository import repo_root

    root = repo_root(Path.cwd())
    notes: list[str] = []  # e.g. code executed from outside the repository (not evidence)
    report, commit = ingest_paths(
        args.store or config.load(root).path(root, "store"),
        list(args.paths) or [root / "bazel-testlogs"],
        source=args.source, bep=args.bep, commit=args.commit,
        source_root=(args.source_root or root).resolve(), notes=notes, jobs=args.jobs)
    for msg in report.corrupt:
        print(f"fastci: {msg}")
    print(summary(report))
    for line in notes + dirty_note(commit):
        print(line)
    if not args.keep_traces:
        removed = remove_ingested(own_traces(root, report.ingested))
        if removed:
            print(f"fastci: removed {removed} ingested trace file(s) (--keep-traces keeps them)")
    return 1 if report.corrupt else 0


def own_traces(root: Path, origins: list[str]) -> list[Path]:
    """The ingested traces FastCI itself wrote: plain files under ``root/.fastci``.

    Traces in archives and under ``bazel-testlogs`` (Bazel's outputs: deleting them
    makes Bazel re-run the tests) or anywhere else the user pointed at stay.
    """
    own = (root / ".fastci").resolve()
    out = []
    for origin in origins:
        if "!" in origin:
            continue
        path = Path(origin).resolve()
        if path.is_relative_to(own):
            out.append(path)
    return out


COMMAND = Command(
    name="ingest",
    help="merge trace files into the evidence store (idempotent; newest run wins)",
    add_arguments=add_arguments,
    run=run,
)
