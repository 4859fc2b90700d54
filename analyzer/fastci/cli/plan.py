"""``fastci plan``: analyze a change and write ``.fastci/plan.json``.

The plan names the tree it was made for (``tree``: the git tree id of the
working tree's content, or of ``--head REV``), so that every runner can tell a
stale plan from a current one. A ``fastci plan`` that fails — a config error,
unusable arguments, an analysis error or crash — leaves no selective plan
behind: it replaces the plan file that is there with a plan that runs every
test at full workload, its reason naming the error (:func:`withdraw_plan`, the
command's ``on_error`` hook, which :mod:`fastci.cli.app` calls for unusable
arguments and for a run that raises alike).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from fastci import config as config_mod
from fastci.cli.command import Command, echo
from fastci.cli.options import add_change_arguments
from fastci.errors import FastCIError
from fastci.gcpause import no_gc


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_change_arguments(p)
    p.add_argument("--out", help="plan file to write (default: config `plan`)")
    p.add_argument("--shadow", action="store_true",
                   help="shadow mode: run everything, and have `fastci run` report failures "
                        "the plan would have skipped")


def _plan(args: argparse.Namespace, echo: Callable[[str], None]) -> int:
    from fastci.integrations.git.repository import WORKTREE
    from fastci.integrations.git.tree import committed_plan_problem, plan_tree
    from fastci.plan.planner import analyze, change_config, plan_file_at
    from fastci.plan.summary import summarize
    from fastci.plan.model import Plan, dump_plan

    root = args.root.resolve()
    head = args.head or WORKTREE
    # The tree is taken before the analysis reads any file, and again after: an edit
    # made while analysing makes the two differ, and such a plan describes no tree.
    tree_before = plan_tree(root, None if head == WORKTREE else head)
    cfg = change_config(root, base=args.base, store=args.store, plan=args.out,
                        runner=args.runner, prune=args.prune,
                        granularity=args.granularity)
    analysis = analyze(root, cfg, base=cfg.base, head=head)  # the runner's declared tests
    tree = plan_tree(root, None if head == WORKTREE else head)
    out, moved = plan_file_at(root, cfg, cfg.base)  # where the base's config puts plans
    plan = dataclasses.replace(analysis.plan, tree=tree)
    if tree != tree_before:
        plan = Plan.run_all(f"the tree changed while it was analysed ({tree_before} -> {tree})")
    elif args.shadow and plan.mode == "selective":
        plan = dataclasses.replace(plan, mode="shadow",
                                   reason=f"shadow (everything runs): {plan.reason}")
    dump_plan(plan, out)
    for line in summarize(analysis):
        echo(line)
    if plan.mode == "shadow":
        echo("  shadow mode: every test runs; `fastci run` reports what the plan would have missed")
    if tree != tree_before:
        echo(f"  the working tree changed during the analysis: the plan runs every test ({plan.reason})")
    echo(f"  wrote {out} (for tree {tree})")
    if moved is not None:
        echo(f"  warning: {moved}: wrote the base's")
    for warning in _unignored(root, [out, cfg.path(root, "store")]):
        echo(f"  warning: {warning}")
    committed = committed_plan_problem(out)
    if committed is not None:  # no runner obeys it
        echo(f"  warning: {committed}")
    return 0


def _unignored(root: Path, paths: Sequence[Path]) -> list[str]:
    """Warnings for FastCI's files outside ``.fastci/`` that git does not ignore.

    ``.fastci/`` is never part of the tree (:mod:`fastci.integrations.git.tree`), but a plan or a
    store configured elsewhere is, unless ignored: writing it would make the tree
    differ from the plan's, and every runner would run everything.
    """
    from fastci.integrations.git.repository import repo_root
    from fastci.integrations.git.tree import OWN_DIR

    try:
        top = repo_root(root)
        rels = [p.resolve().relative_to(top).as_posix() for p in paths]
    except (OSError, ValueError):
        return []  # outside the repository: not part of its tree
    rels = [rel for rel in rels if not rel.startswith(OWN_DIR + "/")]
    if not rels:
        return []
    try:
        res = subprocess.run(["git", "-C", str(top), "check-ignore", "--no-index", "--", *rels],
                             capture_output=True, text=True, check=False)
    except OSError:
        return []
    if res.returncode not in (0, 1):
        return []
    ignored = set(res.stdout.splitlines())
    return [f"{rel} is not ignored by git: writing it changes the tree the plan was made for, "
            f"so runners will run everything (add /{rel} to .gitignore)"
            for rel in rels if rel not in ignored]


def intended_plan_path(root: Path, out: str | None = None) -> Path:
    """The plan file a ``fastci plan`` at ``root`` writes, found even when the config is broken.

    The effective config when it loads; else ``--out``, ``$FASTCI_PLAN``, the
    ``plan`` key of a ``fastci.yaml`` that still parses, or the default.
    """
    from fastci.plan.model import DEFAULT_PATH

    try:
        return config_mod.load(root, overrides={"plan": out}).path(root, "plan")
    except FastCIError:
        pass
    value: Any = out or os.environ.get("FASTCI_PLAN")
    if not value:
        cfg_file = os.environ.get(config_mod.ENV_CONFIG_FILE) or root / config_mod.CONFIG_FILE
        try:
            value = config_mod.read_file(Path(cfg_file)).get("plan")
        except FastCIError:
            value = None
    if not isinstance(value, str) or not value:
        value = str(DEFAULT_PATH)
    path = Path(value)
    return path if path.is_absolute() else root / path


def withdraw_plan(path: Path, why: str, echo: Callable[[str], None]) -> None:
    """After a failed ``fastci plan``: leave no selective plan at ``path``.

    An existing plan file is replaced with a plan that runs every test at full
    workload, its reason naming the failure (removed when it cannot be replaced).
    No file is created where there was none: without a plan every runner runs
    everything already.
    """
    from fastci.plan.model import Plan, dump_plan

    if not path.is_file() and not path.is_symlink():
        return
    reason = f"fastci plan failed: {why}"
    try:
        dump_plan(Plan.run_all(reason), path)
        echo(f"fastci plan: failed; {path} now runs every test at full workload ({reason})")
        return
    except OSError:
        pass
    try:
        path.unlink()
        echo(f"fastci plan: failed; removed {path}: every test runs at full workload ({reason})")
    except OSError as exc:
        echo(f"fastci plan: failed, and the previous plan {path} could not be removed "
             f"({exc.strerror}): delete it before running tests")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    # The cyclic collector stays paused until the plan is written and summarized, not
    # only during the analysis: re-enabled while the analysis' objects are still held,
    # its first pass would walk all of them (~0.07 s at 100,000 tests) to free nothing.
    with no_gc():
        return _plan(args, echo)


def _on_error(why: str, argv: Sequence[str]) -> None:
    """Withdraw the plan after a failed ``fastci plan``, however it failed."""
    root, out = _lenient_root_and_out(argv)
    withdraw_plan(intended_plan_path(root, out), why, _stderr)


def _lenient_root_and_out(argv: Sequence[str]) -> tuple[Path, str | None]:
    """``--root`` and ``--out`` from arguments that may not parse as a whole."""
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.add_argument("--root", default=".")
    p.add_argument("--out")
    try:
        ns, _ = p.parse_known_args(list(argv))
        return Path(ns.root).resolve(), ns.out
    except (argparse.ArgumentError, SystemExit, TypeError):
        return Path(".").resolve(), None


COMMAND = Command("plan", "analyze a change and write the plan (.fastci/plan.json)",
                  _add_arguments, _run, on_error=_on_error)
