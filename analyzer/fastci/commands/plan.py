"""``fastci plan``: analyze a change and write ``.fastci/plan.json``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fastci import config as config_mod
from fastci.analyze import Analysis, analyze, bazel_declared, summarize
from fastci.commands import Command
from fastci.git import WORKTREE
from fastci.plan import dump_plan


def add_change_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``plan``, ``explain`` and ``run``: the change and the inputs."""
    p.add_argument("--base", help="base revision (default: config `base`, HEAD)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--head", help="head revision (default: the working tree)")
    group.add_argument("--worktree", action="store_true",
                       help="compare against the working tree, untracked files included (default)")
    p.add_argument("--store", help="evidence store (default: config `store`)")
    p.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    p.add_argument("--no-bazel", action="store_true",
                   help="do not `bazel query` the declared tests; the universe is the store's tests")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_change_arguments(p)
    p.add_argument("--out", help="plan file to write (default: config `plan`)")
    p.add_argument("--shadow", action="store_true",
                   help="shadow mode: run everything, and have `fastci run` report failures "
                        "the plan would have skipped")


def load_config(args: argparse.Namespace) -> config_mod.Config:
    """The effective config for a command's arguments (CLI is precedence level 4)."""
    root = args.root.resolve()
    return config_mod.load(root, overrides={"base": args.base, "store": args.store,
                                            "plan": getattr(args, "out", None)})


def run_analysis(args: argparse.Namespace) -> tuple[config_mod.Config, Analysis]:
    """Run the analysis described by the common arguments."""
    cfg = load_config(args)
    head = args.head or WORKTREE  # --head and --worktree are mutually exclusive
    return cfg, analyze(args.root.resolve(), cfg, base=cfg.base, head=head,
                        declared=None if args.no_bazel else bazel_declared)


def _run(args: argparse.Namespace) -> int:
    cfg, analysis = run_analysis(args)
    out = cfg.path(args.root.resolve(), "plan")
    plan = analysis.plan
    if args.shadow and plan.mode == "selective":
        plan = dataclasses.replace(plan, mode="shadow",
                                   reason=f"shadow (everything runs): {plan.reason}")
    dump_plan(plan, out)
    for line in summarize(analysis):
        print(line)
    if plan.mode == "shadow":
        print("  shadow mode: every test runs; `fastci run` reports what the plan would have missed")
    print(f"  wrote {out}")
    return 0


COMMAND = Command("plan", "analyze a change and write the plan (.fastci/plan.json)",
                  _add_arguments, _run)
