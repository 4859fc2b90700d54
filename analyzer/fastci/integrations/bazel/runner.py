"""Run ``bazel`` the way FastCI needs it run.

Every command gets ``--repo_env=FASTCI_PLAN_DIGEST=<sha256 of .fastci/plan.json>``
so a plan that appears, changes or vanishes is always re-read (Bazel 4.2.3
does not notice a plan file created after a run without one), and
``--repo_env=FASTCI_TREE_DIGEST=<git tree id of the working tree>``
(:func:`fastci.integrations.git.tree.current_tree`, ``unknown`` outside git) so the rules obey a
plan only on the tree it was made for (``rules/private/plan.bzl``); test
commands get ``--test_env=FASTCI_VENV_DIGEST=<digest of pip freeze>`` because
the venv is not an action input: without it a changed venv would serve stale
cached results. ``Bazel.plan`` (or the ``plan`` argument of a call) names the plan
file the rules read: ``--repo_env=FASTCI_PLAN_FILE=<absolute path>``, its digest
in ``FASTCI_PLAN_DIGEST`` (``fastci run`` hands Bazel the plan it runs, so Bazel
and pytest obey one file; without it the rules read ``.fastci/plan.json``).
Shutting the server down (``trap 'bazel shutdown' EXIT``) is
the caller's job: :meth:`Bazel.shutdown`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from fastci.integrations import procs
from fastci.errors import BazelError

LOG = logging.getLogger(__name__)

PLAN_FILE = Path(".fastci/plan.json")

#: Bazel exit codes FastCI reads (https://bazel.build/run/scripts#exit-codes).
EXIT_OK = 0
EXIT_BUILD_FAILED = 1
EXIT_BAD_OPTION = 2
EXIT_TESTS_FAILED = 3
EXIT_NO_TESTS = 4
EXIT_INTERRUPTED = 8

_TEST_COMMANDS = ("test", "coverage")
_REPO_COMMANDS = ("build", "test", "coverage", "run", "query", "cquery", "aquery", "fetch", "sync")


def plan_digest(workspace: Path, plan: Path | None = None) -> str:
    """Digest of the plan file (``plan``, else the workspace's default one), or ``absent``."""
    try:
        return hashlib.sha256((plan or workspace / PLAN_FILE).read_bytes()).hexdigest()[:16]
    except FileNotFoundError:
        return "absent"


def tree_digest(workspace: Path) -> str:
    """The tree id of the workspace's git working tree, or ``unknown`` (never raises).

    The same value ``rules/bazelw`` computes in shell and ``fastci plan`` writes
    into the plan's ``tree``.
    """
    from fastci.integrations.git.tree import UNKNOWN_TREE, current_tree

    try:
        return current_tree(workspace) or UNKNOWN_TREE
    except Exception as exc:  # noqa: BLE001 - never fail a bazel command over the digest
        LOG.warning("cannot compute the tree digest: %s: plans are not obeyed", exc)
        return UNKNOWN_TREE


def venv_digest(python: Path | str) -> str:
    """Digest of ``pip freeze`` for the interpreter's environment (``unknown`` if pip fails)."""
    res = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        LOG.warning("pip freeze failed for %s: cached test results ignore the venv", python)
        return "unknown"
    # Same bytes as rules/bazelw: `pip freeze --all | grep -v '^-e ' | LC_ALL=C sort | sha256sum`.
    lines = sorted(line for line in res.stdout.splitlines() if line and not line.startswith("-e "))
    return hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BazelResult:
    """One finished ``bazel`` command."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    bep_path: Path | None = None

    @property
    def no_tests(self) -> bool:
        """True when ``bazel test`` found nothing to run (exit 4: an empty selection)."""
        return self.returncode == EXIT_NO_TESTS


@dataclass
class Bazel:
    """A ``bazel`` client bound to one workspace.

    Attributes:
        workspace: the workspace root (where ``bazel`` runs).
        bazel: the executable.
        startup: startup options (e.g. ``--output_base=...``).
        python: the venv interpreter whose ``pip freeze`` keys test results.
        env: the environment for the client (None = inherit).
        plan: the plan file the rules read (None: ``.fastci/plan.json``).
    """

    workspace: Path
    bazel: str = "bazel"
    startup: Sequence[str] = ()
    python: Path | str = field(default_factory=lambda: sys.executable)
    env: Mapping[str, str] | None = None
    plan: Path | None = None
    _venv_digest: str | None = field(default=None, init=False, repr=False)

    def fastci_flags(self, command: str, plan: Path | None = None) -> list[str]:
        """The flags FastCI adds after ``command`` (see module docstring); ``plan``
        replaces :attr:`plan` for this command."""
        flags: list[str] = []
        plan = plan or self.plan
        if command in _REPO_COMMANDS:
            if plan is not None:
                plan = Path(os.path.abspath(plan))
                flags.append(f"--repo_env=FASTCI_PLAN_FILE={plan}")
            flags.append(f"--repo_env=FASTCI_PLAN_DIGEST={plan_digest(self.workspace, plan)}")
            flags.append(f"--repo_env=FASTCI_TREE_DIGEST={tree_digest(self.workspace)}")
        if command in _TEST_COMMANDS:
            if self._venv_digest is None:
                self._venv_digest = venv_digest(self.python)
            flags.append(f"--test_env=FASTCI_VENV_DIGEST={self._venv_digest}")
        return flags

    def argv(self, command: str, args: Sequence[str], plan: Path | None = None) -> list[str]:
        """The full command line for ``bazel <command> <args>`` (``plan``: as in :meth:`fastci_flags`)."""
        return [self.bazel, *self.startup, command, *self.fastci_flags(command, plan), *args]

    def run(self, command: str, args: Sequence[str] = (), *, timeout: float | None = None,
            plan: Path | None = None) -> BazelResult:
        """Run one command and return its result (never raises on a non-zero exit)."""
        argv = self.argv(command, args, plan)
        LOG.debug("running %s", " ".join(argv))
        try:
            res = procs.run(
                argv,
                cwd=self.workspace,
                env=None if self.env is None else dict(self.env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                timeout=timeout,
            )
        except FileNotFoundError as exc:
            raise BazelError(f"{self.bazel}: not found (run `make setup`)") from exc
        except subprocess.TimeoutExpired as exc:
            raise BazelError(f"bazel {command} timed out after {timeout:.0f}s") from exc
        return BazelResult(tuple(argv), res.returncode, res.stdout, res.stderr)

    def test(
        self,
        targets: Sequence[str] = ("//...",),
        *,
        flags: Sequence[str] = (),
        bep_path: Path | None = None,
        timeout: float | None = None,
        plan: Path | None = None,
    ) -> BazelResult:
        """``bazel test`` with a build-event JSON file (exit 3/4 are results, not errors);
        ``plan``: the plan file the rules obey (default :attr:`plan`)."""
        bep = bep_path or self.workspace / "bazel-fastci-bep.json"
        started = time.time()
        res = self.run(
            "test",
            [f"--build_event_json_file={bep}", *flags, "--", *targets],
            timeout=timeout,
            plan=plan,
        )
        if res.returncode not in (EXIT_OK, EXIT_TESTS_FAILED, EXIT_NO_TESTS):
            raise BazelError(f"bazel test failed (exit {res.returncode}): "
                             f"{self._why(res.stderr, started)}")
        return BazelResult(res.args, res.returncode, res.stdout, res.stderr, bep)

    def _why(self, stderr: str, started: float) -> str:
        """Why a command failed: its last ``ERROR:`` line; when it printed none (a server
        that crashed, e.g. on a malformed ``--remote_cache``), the crash message of the
        server's own log (``<output_base>/java.log``), else its last line of output."""
        if any(line.startswith("ERROR:") for line in stderr.splitlines()):
            return _last_error(stderr)
        crash = None
        try:
            res = procs.run([self.bazel, *self.startup, "info", "output_base"], cwd=self.workspace,
                            env=None if self.env is None else dict(self.env),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            timeout=60)
            if res.returncode == 0 and res.stdout.strip():
                crash = server_crash(Path(res.stdout.strip()), since=started - 1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if crash:
            return f"the Bazel server crashed: {crash}"
        return _last_error(stderr)

    def query(self, expression: str, *, output: str = "label", flags: Sequence[str] = ()) -> str:
        """``bazel query``; returns stdout.

        Raises:
            BazelError: the query failed.
        """
        res = self.run("query", [expression, f"--output={output}", *flags])
        if res.returncode != 0:
            raise BazelError(f"bazel query {expression!r} failed (exit {res.returncode}): {_last_error(res.stderr)}")
        return res.stdout

    def info(self, key: str) -> str:
        """``bazel info <key>`` (e.g. ``bazel-testlogs``)."""
        res = self.run("info", [key])
        if res.returncode != 0:
            raise BazelError(f"bazel info {key} failed: {_last_error(res.stderr)}")
        return res.stdout.strip()

    def shutdown(self) -> None:
        """Stop this workspace's Bazel server (servers otherwise linger for hours)."""
        subprocess.run(
            [self.bazel, *self.startup, "shutdown"],
            cwd=self.workspace,
            env=None if self.env is None else dict(self.env),
            capture_output=True,
            check=False,
        )


_CRASH = re.compile(r'Exit status was DetailedExitCode\{exitCode=(\w+), failureDetail=message: "(.*)"')


def server_crash(output_base: Path, since: float = 0.0) -> str | None:
    """The last failure a Bazel server's log records (``Crashed: ...``), or None.

    Each server start writes a new ``java.log.*`` in ``output_base`` (``java.log`` links
    to the newest), and asking a crashed server anything starts a new one: so every log
    written since ``since`` (a ``time.time()``) is read, newest first.
    """
    try:
        logs = sorted((p for p in output_base.glob("java.log.*") if p.stat().st_mtime >= since),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for log in logs:
        try:
            with open(log, "rb") as fh:
                fh.seek(max(0, fh.seek(0, 2) - (1 << 20)))  # its last MiB holds the end
                tail = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        found = _CRASH.findall(tail)
        if found:
            code, message = found[-1]
            return f"{message} ({code})"[:500]
    return None


def _last_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("ERROR:")]
    return (lines[-1] if lines else (stderr.strip().splitlines() or ["no output"])[-1])[:500]
