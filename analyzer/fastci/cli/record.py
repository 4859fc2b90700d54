"""``fastci record``: run tests under the recorder with Bazel, then ingest the traces.

The evidence is stamped with :func:`fastci.integrations.git.tree.evidence_commit` of the
workspace, taken before the tests run: ``HEAD`` for a clean tree,
``dirty:<tree id>`` for a modified one (see :mod:`fastci.cli.ingest`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Sequence

from fastci import config
from fastci.integrations.bazel.runner import Bazel
from fastci.cli.command import Command
from fastci.cli.ingest import dirty_note, summary
from fastci.errors import BazelError
from fastci.evidence.ingest import find_traces, ingest, results_from_bep
from fastci.evidence.store import EvidenceStore
from fastci.integrations.git.repository import repo_root
from fastci.integrations.git.tree import evidence_commit

LOG = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare targets, ``--store``, ``--bazel-flag`` and ``--workspace``."""
    parser.add_argument("targets", nargs="*", help="target patterns (default: config `targets`)")
    parser.add_argument("--workspace", type=Path, default=None, help="workspace (default: repo)")
    parser.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")
    parser.add_argument("--bazel-flag", action="append", default=[], dest="bazel_flags",
                        help="extra flag for `bazel test` (repeatable)")


def record(workspace: Path, targets: list[str], store_path: Path, *,
           flags: Sequence[str] = (), bazel: Bazel | None = None) -> str:
    """Run ``bazel test --config=fastci_record`` and ingest; return the summary text."""
    bz = bazel or Bazel(workspace)
    # The tree the tests run on: taken before the run writes anything into the workspace.
    commit = evidence_commit(workspace)
    bep = workspace / ".fastci" / "runs" / "record-bep.json"
    bep.parent.mkdir(parents=True, exist_ok=True)
    res = bz.test(targets, flags=["--config=fastci_record", *flags], bep_path=bep)
    testlogs = Path(bz.info("bazel-testlogs"))
    results = results_from_bep(bep)
    if not results and not res.no_tests:
        raise BazelError(f"bazel test reported no test results in {bep}")
    store = EvidenceStore.open(store_path, create=True)
    try:
        report = ingest(store, find_traces([testlogs]) if testlogs.exists() else iter(()),
                        source="bazel", commit=commit, results=results,
                        root=workspace, only=set(results))
        stats = store.stats()
    finally:
        store.close()
    passed = sum(1 for r in results.values() if r.outcome == "passed")
    lines = [f"{passed} passed, {len(results) - passed} failed",
             summary(report),
             f"store {store_path}: {stats['test']} tests, {stats['unit']} units, "
             f"{stats['context']} contexts, {stats['file_read']} file reads, "
             f"{stats['evidence']} evidence rows, {stats['bytes'] / 1e6:.2f} MB"]
    lines += [f"fastci: {m}" for m in report.corrupt]
    lines += dirty_note(commit)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Record and ingest; print the summary."""
    root = repo_root(Path.cwd())
    workspace = (args.workspace or root).resolve()
    cfg = config.load(workspace)
    targets = list(args.targets) or [cfg.targets]
    store_path = args.store or cfg.path(workspace, "store")
    bz = Bazel(workspace, bazel=cfg.bazel)
    print(record(workspace, targets, store_path, flags=args.bazel_flags, bazel=bz))
    return 0


COMMAND = Command(
    name="record",
    help="run tests under the recorder (bazel --config=fastci_record) and ingest the traces",
    add_arguments=add_arguments,
    run=run,
)
