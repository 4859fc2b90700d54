"""Hand-written plans in tests, tied to the tree they are run on.

A runner obeys only a plan that names the tree it runs on (issue 34 item 6: a plan
tied to no tree is not obeyed). A test that hand-writes a plan for a suite in a
temporary folder ties it here, as a person would with
``python -m fastci.integrations.git.tree``.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

from fastci.integrations.git.tree import plan_tree
from fastci.plan.model import Plan


def tie(plan: Plan, root: Path, *outside: Path) -> Plan:
    """``plan`` naming the tree of the working tree at ``root``.

    ``root`` becomes a git repository when it is in none (no commit is needed: the
    tree is the content). ``outside``: files written after this call (the plan file
    itself) that must stay out of the tree; they are excluded in ``.git/info/exclude``,
    which is no file of the tree.
    """
    fresh = subprocess.run(["git", "-C", str(root), "rev-parse", "--git-dir"],
                           capture_output=True, check=False).returncode != 0
    if fresh:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    top = Path(subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, check=True).stdout.strip())
    git_dir = Path(subprocess.run(["git", "-C", str(root), "rev-parse", "--absolute-git-dir"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # A repository made here leaves out what Bazel and pytest write while the tests run.
    names = ["/bazel-*", "*.bep.json", "/bep.json", "/user.bazelrc", "__pycache__/"] if fresh else []
    for path in outside:
        try:
            names.append("/" + path.resolve().relative_to(top.resolve()).as_posix())
        except ValueError:
            continue  # outside the repository: never part of its tree
    if names:
        exclude = git_dir / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as f:
            f.write("".join(n + "\n" for n in names))
    return dataclasses.replace(plan, tree=plan_tree(root))


def tie_json(plan: dict[str, Any], root: Path) -> dict[str, Any]:
    """:func:`tie` for a plan written as decoded JSON (a plan in mode ``all`` names no tree)."""
    if plan.get("mode") == "all" or "tree" in plan:
        return plan
    return dict(plan, tree=tie(Plan(mode="selective"), root).tree)
