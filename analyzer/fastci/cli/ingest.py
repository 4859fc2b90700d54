"""``fastci ingest``: merge trace files (bazel-testlogs, pytest trace dirs) into the store.

Evidence is stamped with the commit of the tree it was recorded from
(:func:`fastci.integrations.git.tree.evidence_commit`): ``HEAD`` for a clean tree, ``dirty:<tree>``
for a modified one, which never passes for a commit, so plans compare every
recorded file with what they analyse instead of trusting it as ``HEAD``'s.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from fastci import config
from fastci.cli.command import Command
from fastci.errors import FastCIError
from fastci.evidence.ingest import IngestReport, find_traces, ingest, results_from_bep
from fastci.evidence.store import EvidenceStore
from fastci.integrations.git.repository import repo_root
from fastci.integrations.git.tree import DIRTY_PREFIX, evidence_commit

LOG = logging.getLogger(__name__)


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


def summary(report: IngestReport) -> str:
    """One line saying what an ingest did."""
    line = (f"ingested {report.traces} trace(s): {report.runs_added} run(s) added, "
            f"{report.runs_skipped} already known, {len(report.tests)} test(s)")
    if report.incomplete_tests:
        line += f", {len(report.incomplete_tests)} with incomplete evidence"
    if report.corrupt:
        line += f", {len(report.corrupt)} corrupt trace(s) skipped"
    return line


def dirty_note(commit: str | None) -> list[str]:
    """The line saying evidence was stamped as a modified tree's (none for a commit)."""
    if commit is None or not commit.startswith(DIRTY_PREFIX):
        return []
    return [f"recorded from a modified tree: evidence stamped {commit[:len(DIRTY_PREFIX) + 12]}…; "
            "plans compare every recorded file"]


def run(args: argparse.Namespace) -> int:
    """Ingest and print a summary; exit 1 if a trace was corrupt."""
    root = repo_root(Path.cwd())
    paths = list(args.paths) or [root / "bazel-testlogs"]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise FastCIError(f"{missing[0]}: no such file or directory")
    source = args.source or ("bazel" if any("testlogs" in str(p) for p in paths) else "pytest")
    results = results_from_bep(args.bep) if args.bep else None
    store_path = args.store or config.load(root).path(root, "store")
    source_root = (args.source_root or root).resolve()
    # The tree the unit checksums are computed from, taken before the store is created.
    commit = args.commit or evidence_commit(source_root)
    store = EvidenceStore.open(store_path, create=True)
    try:
        report = ingest(store, find_traces(paths), source=source, commit=commit,
                        results=results, root=source_root,
                        only=set(results) if results is not None else None)
    finally:
        store.close()
    for msg in report.corrupt:
        print(f"fastci: {msg}")
    print(summary(report))
    for line in dirty_note(commit):
        print(line)
    return 1 if report.corrupt else 0


COMMAND = Command(
    name="ingest",
    help="merge trace files into the evidence store (idempotent; newest run wins)",
    add_arguments=add_arguments,
    run=run,
)
