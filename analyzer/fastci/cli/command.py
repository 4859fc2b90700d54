"""Subcommands of ``fastci``: one module each, listed here in help order.

A command module defines ``COMMAND = Command(name, help, add_arguments, run)``.
Only commands that exist are listed, so ``fastci --help`` never shows a stub.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

COMMAND_MODULES: tuple[str, ...] = (
    "fastci.cli.record",
    "fastci.cli.ingest",
    "fastci.cli.evidence",
    "fastci.cli.plan",
    "fastci.cli.explain",
    "fastci.cli.run",
    "fastci.cli.validate_plan",
    "fastci.cli.targets",
)


@dataclass(frozen=True)
class Command:
    """One ``fastci`` subcommand."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
