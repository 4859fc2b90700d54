"""The ``fastci`` command line: a thin shell over the subcommand modules.

``main(argv) -> int`` parses arguments, configures logging (only the CLI does),
runs one subcommand and turns a :class:`~fastci.errors.FastCIError` into a
one-line message and its exit code. A command with an ``on_error`` hook
(:class:`~fastci.cli.command.Command`) hears of its failure first, whether its
arguments did not parse or its run raised.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys
from typing import Any, Callable, NoReturn, Sequence

from fastci import __version__
from fastci.cli.command import (COMMAND_MODULES, COMMANDS, Command, printable,
                                printable_stdout, quiet_stdout)
from fastci.errors import FastCIError

OK = 0
ERR = 2


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that calls ``on_usage_error(description)`` before it exits with 2."""

    def __init__(self, *args: Any, on_usage_error: Callable[[str], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_usage_error = on_usage_error

    def error(self, message: str) -> NoReturn:
        if self.on_usage_error is not None:
            self.on_usage_error(f"bad arguments: {message}")
        super().error(message)


def _load_commands(name: str | None = None) -> list[Command]:
    """The command ``name`` (its module only), or every command when ``name`` is None
    or names none (argparse then lists them all)."""
    modules = [COMMANDS[name]] if name in COMMANDS else COMMAND_MODULES
    commands = []
    for modname in modules:
        module = importlib.import_module(modname)
        commands.append(module.COMMAND)
    return commands


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the
    top-level options take no value), None when there is none."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(commands: Sequence[Command], argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per command.

    ``argv`` is the command line about to be parsed: a command's ``on_error`` hook
    gets it when its arguments do not parse.
    """
    parser = _Parser(
        prog="fastci",
        description="Select, prune, prioritize and shrink GPU-heavy tests from runtime evidence.",
    )
    parser.add_argument("--version", action="version", version=f"fastci {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in commands:
        hook = _bind(cmd.on_error, argv)
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help, on_usage_error=hook)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run, _on_error=hook, _parser=p)
    return parser


def _bind(on_error: Callable[[str, Sequence[str]], None] | None,
          argv: Sequence[str]) -> Callable[[str], None] | None:
    if on_error is None:
        return None
    frozen = tuple(argv)

    def hook(description: str) -> None:
        on_error(description, frozen)

    return hook


def describe(exc: BaseException) -> str:
    """A failure in one line: a FastCIError's message, else the exception's type and message."""
    if isinstance(exc, FastCIError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def os_error(exc: OSError) -> str:
    """A failed file operation in one line: what, where, and that nothing else is wrong."""
    where = f"{exc.filename}: " if exc.filename else ""
    what = exc.strerror or str(exc) or type(exc).__name__
    hint = {errno.ENOSPC: " (the disk is full: free space and run it again)",
            errno.EROFS: " (a read-only file system: make it writable or point FastCI "
                         "elsewhere, see docs/CONFIG.md)",
            errno.EACCES: " (permission denied: check the folder's owner and mode)",
            errno.EDQUOT: " (over the disk quota)"}.get(exc.errno or 0, "")
    return f"{where}{what}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_load_commands(_command_word(argv)), argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Reported by the command's own parser, so that its usage (and its hook) applies.
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING,
        format="fastci: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    from fastci.integrations import procs  # not needed to parse or print help

    try:
        # A cancelling signal (a CI's cancel button) stops every child first.
        with procs.cancellable(), printable_stdout():
            rc: int = args._run(args)
        return rc
    except BrokenPipeError:
        # Whoever read the output went away (`fastci ... | head`): not a failure of the
        # command's work, so no on_error hook (a plan written in full stays as it is).
        quiet_stdout()
        return 141  # 128 + SIGPIPE, as a program killed by the closed pipe would
    except BaseException as exc:
        if args._on_error is not None:
            args._on_error(describe(exc))
        if isinstance(exc, OSError) and not isinstance(exc, FastCIError):
            print(printable(f"fastci: {os_error(exc)}"), file=sys.stderr)
            return ERR
        if isinstance(exc, FastCIError):
            print(printable(f"fastci: {exc}"), file=sys.stderr)
            return exc.exit_code
        if isinstance(exc, KeyboardInterrupt):
            print("fastci: interrupted", file=sys.stderr)
            return 130
        raise


if __name__ == "__main__":
    sys.exit(main())
