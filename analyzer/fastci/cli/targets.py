"""``fastci targets``: list the workspace's gpu_tests and what they declare (real ``bazel query``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from fastci.integrations.bazel.query import TestDecl, list_gpu_tests
from fastci.integrations.bazel.runner import Bazel
from fastci.cli.command import Command


def format_decl(decl: TestDecl) -> str:
    """One line per test: id, GPUs, workload (with floors), scope."""
    dims = []
    for dim, value in sorted(decl.workload.items()):
        floor = decl.floors.get(dim)
        dims.append(f"{dim}={json.dumps(value)}" + (f" (floor {json.dumps(floor)})" if floor is not None else ""))
    scope = ",".join(decl.scope) or "-"
    return f"{decl.id}  gpus={decl.gpus}  scope={scope}  workload: {', '.join(dims) or '-'}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--workspace``, ``--universe`` and ``--json``."""
    parser.add_argument("--workspace", type=Path, default=Path("."), help="Bazel workspace root (default: .)")
    parser.add_argument("--universe", default="//...", help="target pattern to look in (default: //...)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of lines")


def run(args: argparse.Namespace) -> int:
    """Print every gpu_test's declaration."""
    decls = list_gpu_tests(Bazel(args.workspace.resolve()), args.universe)
    if args.json:
        print(json.dumps([asdict(d) for d in decls], indent=2, sort_keys=True))
    else:
        for decl in decls:
            print(format_decl(decl))
        print(f"{len(decls)} gpu_test(s)")
    return 0


COMMAND = Command(
    name="targets",
    help="list gpu_tests and their declared GPUs, workload, floors and scope",
    add_arguments=add_arguments,
    run=run,
)
