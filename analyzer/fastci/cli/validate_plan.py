"""``fastci validate-plan [PATH]``: check a plan file the way the Bazel rules will.

Exit 0 and a one-line summary when the plan is valid; otherwise the CLI
prints the precise problem (``PlanError``) and exits 2. With ``--targets``,
also checks every override against the gpu_tests' declarations (real
``bazel query``): overrides of undeclared or frozen (floorless) dimensions,
wrong types, values outside ``[floor, full]`` and broken constraints make the
rules run that test at full workload, so they are reported here.

It also says whether the plan describes the workspace's current tree (its
``tree``): a plan made for another tree is valid, but no runner obeys it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from fastci.cli.command import Command
from fastci.errors import PlanError
from fastci.types import normalize_test_id

if TYPE_CHECKING:
    from fastci.integrations.bazel.query import TestDecl
    from fastci.plan.model import Plan

#: :data:`fastci.plan.model.DEFAULT_PATH` for ``--help``, spelled out so that building the
#: parser imports no stage (``tests/test_cli.py`` checks that the two agree).
DEFAULT_PLAN = Path(".fastci/plan.json")


def override_problems(plan: Plan, decls: Sequence[TestDecl]) -> list[str]:
    """Overrides that the rules would ignore, one line each (pure).

    The same rules as ``rules/private/plan_model.bzl`` and the pytest plugin
    (:func:`fastci.plan.workload.override_problems`): only a dimension with a floor is
    reducible, to ``floor <= value <= full`` of the full value's type, and every
    constraint must hold on the reduced workload.
    """
    from fastci.plan.workload import override_problems as workload_problems

    by_id = {d.id: d for d in decls}
    problems = []
    for i, test in enumerate(plan.tests):
        decl = by_id.get(normalize_test_id(test.id))
        if decl is None or not test.overrides:
            continue
        # The rules accept numeric floors only (validate.bzl), so nothing else can be one.
        floors = {k: v for k, v in decl.floors.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        problems += [f"tests[{i}].overrides ({test.id}): {p}" for p in workload_problems(
            decl.workload, floors, decl.constraints, test.overrides)]
    return problems


def tree_line(plan: Plan, tree: str | None) -> str:
    """One line: does ``plan`` describe the tree ``tree`` (the current one; None = unknown)? (pure)"""
    from fastci.plan.model import tree_problem

    if plan.mode == "all":
        return "tree: not checked (mode all: every test runs at full workload)"
    problem = tree_problem(plan, tree)
    if problem is not None:
        what = "STALE" if plan.tree is not None else "none"
        return f"tree: {what}: {problem}: every runner runs every test at full workload"
    return f"tree: matches this tree ({tree})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``PATH`` and ``--targets``."""
    parser.add_argument("path", nargs="?", type=Path, default=None, help=f"plan file (default: {DEFAULT_PLAN})")
    parser.add_argument("--workspace", type=Path, default=Path("."), help="Bazel workspace root (default: .)")
    parser.add_argument(
        "--targets", action="store_true", help="also check overrides against gpu_test declarations (bazel query)"
    )


def run(args: argparse.Namespace) -> int:
    """Validate the plan; print ``<path>: ok: ...`` and return 0, or raise PlanError."""
    from fastci.integrations.git.tree import committed_plan_problem, current_tree
    from fastci.plan.model import DEFAULT_PATH, inputs_problem, load_plan

    path = args.path or args.workspace / DEFAULT_PATH
    plan = load_plan(path)
    if args.targets:
        from fastci.integrations.bazel.query import list_gpu_tests
        from fastci.integrations.bazel.runner import Bazel

        bazel = Bazel(args.workspace.resolve())
        problems = override_problems(plan, list_gpu_tests(bazel))
        if problems:
            extra = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise PlanError(f"{path.name}: {problems[0]}{extra}")
    print(
        f"{path}: ok: version 1, mode {plan.mode}, {len(plan.tests)} tests, {len(plan.skipped)} skipped"
        + (f" ({plan.reason})" if plan.reason else "")
    )
    committed = committed_plan_problem(path) if plan.mode != "all" else None
    if committed is not None:
        print(f"{path}: NOT OBEYED: {committed}")
    if plan.inputs:
        from fastci.integrations.git.repository import repo_root

        stale = inputs_problem(plan, repo_root(args.workspace))
        print(f"{path}: inputs: " + (f"STALE: {stale}: every runner runs every test at full "
                                      "workload" if stale else
                                      f"the {len(plan.inputs)} git-ignored input(s) match"))
    print(f"{path}: {tree_line(plan, current_tree(args.workspace))}")
    return 0


COMMAND = Command(
    name="validate-plan",
    help="check a plan file (.fastci/plan.json) against schema version 1",
    add_arguments=add_arguments,
    run=run,
)
