"""Subcommands of ``fastci``: one module each, listed here in help order.

A command module defines ``COMMAND = Command(name, help, add_arguments, run)``,
parses its options and calls the stages that do the work; command modules never
import each other (options several commands share live in :mod:`fastci.cli.options`).
Only commands that exist are listed, so ``fastci --help`` never shows a stub.

A command module is light: at its top it imports the standard library, this package and
the shared leaves (``fastci.errors``, ``types``, ``config``, ``gcpause``) only, so that
declaring its options costs nothing; the stages it calls are imported inside ``run`` and
the helpers that do the work (names used only in annotations under ``TYPE_CHECKING``).
``fastci --help`` thus builds every command's parser without importing a stage
(``tests/test_cli.py`` checks ``sys.modules``; ``make bench`` times it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TextIO

#: Each command's name and its module, in help order. ``fastci NAME ...`` imports only
#: NAME's module (``fastci --help`` all of them, which import no stage), and NAME's stage
#: when it runs.
COMMANDS: dict[str, str] = {
    "record": "fastci.cli.record",
    "ingest": "fastci.cli.ingest",
    "evidence": "fastci.cli.evidence",
    "plan": "fastci.cli.plan",
    "explain": "fastci.cli.explain",
    "run": "fastci.cli.run",
    "validate-plan": "fastci.cli.validate_plan",
    "targets": "fastci.cli.targets",
    "calibrate": "fastci.cli.calibrate",
    "eval": "fastci.cli.eval",
}
COMMAND_MODULES: tuple[str, ...] = tuple(COMMANDS.values())


@dataclass(frozen=True)
class Command:
    """One ``fastci`` subcommand.

    Attributes:
        name: the subcommand's name.
        help: one line for ``fastci --help``.
        add_arguments: declares the subcommand's options on its parser.
        run: does the work; returns the exit code (a ``FastCIError`` it raises becomes
            a one-line message and its exit code).
        on_error: called when the command fails, before the failure is reported:
            with a one-line description and the whole command line (``argv`` as
            :func:`fastci.cli.app.main` got it) when the arguments do not parse
            (argparse then exits with 2), or when ``run`` raises (the exception is
            then reported or re-raised as usual). For a command whose failure must
            leave something safe behind (``fastci plan``: no selective plan).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    on_error: Callable[[str, Sequence[str]], None] | None = None


def quiet_stdout() -> None:
    """Send the rest of stdout to ``/dev/null``: its reader has gone (``fastci plan | head``),
    and the interpreter's last flush must not fail as well."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def echo(line: str) -> None:
    """Print one line of a command's report. A reader that went away (a closed pipe) stops
    the printing, not the command: what the command writes to disk is done in full."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        quiet_stdout()


#: Control characters as visible escapes: a test id, path or message that holds one
#: (``\x1b[2J``, a newline in a parametrize id) must not clear the screen or forge a line.
#: Newlines and tabs between FastCI's own lines stay as they are.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))
            if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """``text`` with its control characters (but newline and tab) escaped as ``\\xNN``."""
    return text.translate(_ESCAPES)


class _Printable:
    """A text stream that escapes control characters on their way to ``inner``."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        return self._inner.write(printable(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def printable_stdout() -> Iterator[None]:
    """While inside, what a command prints on stdout has its control characters escaped
    (:func:`printable`): ids and paths come from plans, stores and test runners."""
    inner = sys.stdout
    sys.stdout = _Printable(inner)
    try:
        yield
    finally:
        sys.stdout = inner
