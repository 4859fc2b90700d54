"""Options shared by more than one command (not a command itself).

``fastci plan`` and ``fastci explain`` both take a change — base, head, store,
root — and hand it to :func:`fastci.plan.build.analyze_change`; declaring the
options once keeps their spelling and defaults the same in both.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_change_arguments(p: argparse.ArgumentParser) -> None:
    """Declare the change and the inputs: ``--base``, ``--head``/``--worktree``, ``--store``, ``--root``, ``--no-bazel``."""
    p.add_argument("--base", help="base revision (default: config `base`, HEAD)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--head", help="head revision (default: the working tree)")
    group.add_argument("--worktree", action="store_true",
                       help="compare against the working tree, untracked files included (default)")
    p.add_argument("--store", help="evidence store (default: config `store`)")
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    p.add_argument("--no-bazel", action="store_true",
                   help="do not `bazel query` the declared tests; the universe is the store's tests")
