"""``fastci targets``: list the workspace's gpu_tests and what they declare (real ``bazel query``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastci.cli.command import Command

if TYPE_CHECKING:
    from fastci.integrations.bazel.query import TestDecl


def format_decl(decl: TestDecl) -> str:
    """One line per test: id, GPUs, scope, check, reference, and per dimension its full value
    and whether it shrinks (to its floor) or is frozen; "(default)" marks what the test left
    undeclared, and a declaration the rules would reject ends with its problem."""
    from fastci.plan.workload import reducible_dims, reduction_problems, resolve_reduction

    problems = reduction_problems(decl)
    red = None if problems else resolve_reduction(decl)
    shrinks = reducible_dims(decl)

    def default(attr: str) -> str:
        return " (default)" if red is not None and attr in red.defaulted else ""

    dims = []
    for dim, value in sorted(decl.workload.items()):
        if dim in shrinks:
            how = f"shrinks to {json.dumps(shrinks[dim][0])}"
        elif red is not None and dim in red.frozen:
            how = "frozen, default" if "frozen" in red.defaulted else "frozen"
        else:
            how = "frozen"  # an invalid declaration reduces nothing
        dims.append(f"{dim}={json.dumps(value)} ({how})")
    scope = ",".join(decl.scope) or "-"
    check = red.check if red is not None else decl.check or "?"
    reference = red.reference if red is not None else decl.reference or "?"
    line = (f"{decl.id}  gpus={decl.gpus}  scope={scope}  check={check}{default('check')}  "
            f"reference={reference}{default('reference')}  workload: {', '.join(dims) or '-'}")
    return line + (f"  INVALID: {problems[0]}" if problems else "")


def decl_json(decl: TestDecl) -> dict[str, Any]:
    """A test's declaration as JSON: the TestDecl's fields with frozen, check and reference
    resolved (defaults applied), plus ``reducible`` (dimension -> floor and full value) and
    ``problems`` (why the declaration is invalid; then nothing is reducible)."""
    from fastci.plan.workload import reducible_dims, reduction_problems, resolve_reduction

    data = asdict(decl)
    problems = reduction_problems(decl)
    if not problems:
        red = resolve_reduction(decl)
        data.update(frozen=list(red.frozen), check=red.check, reference=red.reference,
                    defaulted=list(red.defaulted))
    data["reducible"] = {dim: {"floor": floor, "full": full} for dim, (floor, full) in reducible_dims(decl).items()}
    data["problems"] = problems
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``--workspace``, ``--universe`` and ``--json``."""
    parser.add_argument("--workspace", type=Path, default=Path("."), help="Bazel workspace root (default: .)")
    parser.add_argument("--universe", default="//...", help="target pattern to look in (default: //...)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of lines")


def learned(root: Path, decls: list[TestDecl]) -> dict[str, dict[str, tuple[Any, str]]]:
    """Test -> the floors its escapes raised (dimension -> (value to exceed, why)).

    Read from the evidence store's run history (:func:`fastci.plan.reduce.escapes`);
    empty when there is no store (nothing was learned)."""
    from fastci import config
    from fastci.plan.inputs import declared_test
    from fastci.plan.reduce import learned_floors_at

    return learned_floors_at(config.load(root).path(root, "store"),
                             {d.id: declared_test(d) for d in decls})


def run(args: argparse.Namespace) -> int:
    """Print every gpu_test's declaration, and the floors escapes raised."""
    from fastci.integrations.bazel.query import list_gpu_tests
    from fastci.integrations.bazel.runner import Bazel

    root = args.workspace.resolve()
    decls = list_gpu_tests(Bazel(root), args.universe)
    try:
        floors = learned(root, decls)
    except Exception as exc:  # noqa: BLE001 - the declarations still print
        print(f"fastci: learned floors unknown: {str(exc).splitlines()[0] if str(exc) else exc}")
        floors = {}
    if args.json:
        data = [decl_json(d) for d in decls]
        for item in data:
            item["learned_floors"] = {dim: {"above": v, "why": why}
                                      for dim, (v, why) in floors.get(item["id"], {}).items()}
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for decl in decls:
            print(format_decl(decl))
            for dim, (value, why) in sorted(floors.get(decl.id, {}).items()):
                print(f"    learned floor: {dim} > {json.dumps(value)} ({why})")
        print(f"{len(decls)} gpu_test(s)")
    return 0


COMMAND = Command(
    name="targets",
    help="list gpu_tests and their declared GPUs, workload (what shrinks, to which floor; what is frozen), scope, check and reference",
    add_arguments=add_arguments,
    run=run,
)
