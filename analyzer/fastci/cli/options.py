"""Options shared by more than one command (not a command itself).

``fastci plan`` and ``fastci explain`` both take a change — base, head, store,
root — and hand it to :func:`fastci.plan.planner.analyze_change`; declaring the
options once keeps their spelling and defaults the same in both.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_change_arguments(p: argparse.ArgumentParser) -> None:
    """Declare the change and the inputs: ``--base``, ``--head``/``--worktree``, ``--store``,
    ``--root``, ``--bazel``/``--no-bazel`` (``args.runner``: ``bazel``, ``pytest`` or None),
    ``--prune`` (``args.prune``: a mode or None), ``--granularity`` (``args.granularity``)."""
    p.add_argument("--base", help="base revision (default: config `base`, HEAD)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--head", help="head revision (default: the working tree)")
    group.add_argument("--worktree", action="store_true",
                       help="compare against the working tree, untracked files included (default)")
    p.add_argument("--store", help="evidence store (default: config `store`)")
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    runner = p.add_mutually_exclusive_group()
    runner.add_argument("--no-bazel", dest="runner", action="store_const", const="pytest",
                        help="runner pytest: do not `bazel query` the declared tests; the "
                             "universe is the store's tests (default: config `runner`, auto: "
                             "pytest without a Bazel workspace or `bazel`)")
    runner.add_argument("--bazel", dest="runner", action="store_const", const="bazel",
                        help="runner bazel: the declared gpu_tests come from `bazel query` "
                             "(default: config `runner`, auto: Bazel in a Bazel workspace)")
    p.add_argument("--prune", choices=("off", "safe", "aggressive"), default=None,
                   help="equivalent-context pruning of the selected tests (default: config "
                        "`prune`); docs/SELECTION.md, \"Pruning\"")
    p.add_argument("--granularity", choices=("unit", "line"), default=None,
                   help="line: a test that entered a changed function but ran none of its "
                        "changed lines (line evidence from `fastci calibrate`) is not affected "
                        "(default: config `granularity`); docs/SELECTION.md, \"Line granularity\"")
