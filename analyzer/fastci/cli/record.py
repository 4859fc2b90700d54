"""``fastci record``: run tests under the recorder with Bazel, then ingest the traces.

The work is :func:`fastci.evidence.fill.record_tests`; the evidence is stamped
with the workspace's tree as it was before the tests ran (``HEAD``, or
``dirty:<tree id>`` for a modified tree). A test that fails while recording makes
the command exit 1 (the evidence is still ingested, its outcome marked), so CI notices.
While Bazel runs, its progress (tests finished, ETA) goes to stderr (:mod:`fastci.progress`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fastci import config
from fastci.cli.command import Command

__all__ = ["COMMAND", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare targets, ``--store``, ``--bazel-flag`` and ``--workspace``."""
    parser.add_argument("targets", nargs="*", help="target patterns (default: config `targets`)")
    parser.add_argument("--workspace", type=Path, default=None, help="workspace (default: repo)")
    parser.add_argument("--store", type=Path, help="evidence store (default: .fastci/evidence.db)")
    parser.add_argument("--bazel-flag", action="append", default=[], dest="bazel_flags",
                        help="extra flag for `bazel test` (repeatable)")


#: The exit code when a recorded test failed (FastCIError's are 2 and up).
EXIT_TESTS_FAILED = 1


def run(args: argparse.Namespace) -> int:
    """Record and ingest; print the summary. Exits 1 when a test failed while recording."""
    from fastci.evidence.fill import record_tests
    from fastci.integrations.bazel.runner import Bazel
    from fastci.integrations.git.repository import repo_root
    from fastci.progress import Progress

    root = repo_root(Path.cwd())
    workspace = (args.workspace or root).resolve()
    cfg = config.load(workspace)
    targets = list(args.targets) or [cfg.targets]
    store_path = args.store or cfg.path(workspace, "store")
    bz = Bazel(workspace, bazel=cfg.bazel)
    # Progress on stderr while Bazel runs (closed before the summary prints).
    with Progress(None, "record") as progress:
        recording = record_tests(workspace, targets, store_path, flags=args.bazel_flags,
                                 bazel=bz, progress=progress)
    print(recording.summary)
    problem = recording.failure_line()
    if problem is not None:
        # CI must notice: a recording with failures is not a green recording.
        print(f"fastci record: {problem}", file=sys.stderr)
        return EXIT_TESTS_FAILED
    return 0


COMMAND = Command(
    name="record",
    help="run tests under the recorder (bazel --config=fastci_record) and ingest the traces",
    add_arguments=add_arguments,
    run=run,
)
