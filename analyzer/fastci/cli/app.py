"""The ``fastci`` command line: a thin shell over the subcommand modules.

``main(argv) -> int`` parses arguments, configures logging (only the CLI does),
runs one subcommand and turns a :class:`~fastci.errors.FastCIError` into a
one-line message and its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from fastci import __version__
from fastci.cli.command import COMMAND_MODULES, Command
from fastci.errors import FastCIError

OK = 0
ERR = 2


def _load_commands() -> list[Command]:
    commands = []
    for modname in COMMAND_MODULES:
        module = importlib.import_module(modname)
        commands.append(module.COMMAND)
    return commands


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="fastci",
        description="Select, prune, prioritize and shrink GPU-heavy tests from runtime evidence.",
    )
    parser.add_argument("--version", action="version", version=f"fastci {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in commands:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    parser = build_parser(_load_commands())
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING,
        format="fastci: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        rc: int = args._run(args)
        return rc
    except FastCIError as exc:
        print(f"fastci: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("fastci: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
