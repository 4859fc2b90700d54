"""The planner's typed inputs: where the declared tests come from, and the runner's environment.

Each input is a small value or a Protocol with one method, so :func:`fastci.plan.planner.analyze`
takes no polymorphic argument:

* :class:`Declarations` says who declares the tests of a plan. :data:`BY_RUNNER` (the
  default) follows the runner (:func:`choose_runner`: ``bazel query`` for Bazel, the
  store's tests for pytest); :class:`Given` holds the tests a caller already has (None:
  the store's tests); :class:`Query` asks a function the caller supplies.
* :class:`EnvironmentProbe` says what the test runner's environment is.
  :data:`RUNNER_ENVIRONMENT` (the default) runs the runner's interpreter
  (:func:`runner_python`) and reads every part of its environment; :class:`KnownFingerprint`
  is a fingerprint a caller already has.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from fastci.config import Config
from fastci.errors import FastCIError
from fastci.select.test_rules import DeclaredTest
from fastci.types import RelPath, TestId

if TYPE_CHECKING:
    from fastci.integrations.bazel.query import TestDecl

LOG = logging.getLogger(__name__)

#: Files that make a directory a Bazel workspace root.
WORKSPACE_FILES = ("WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel")

#: Asks for the declared tests, given the repository root and the decision rules; None:
#: the store's tests are the universe (a pytest suite declares nothing ahead).
AskDeclared = Callable[[Path, Config], "Mapping[TestId, DeclaredTest] | None"]


@dataclass(frozen=True)
class DeclaredBy:
    """Who declares a plan's tests, known before they are asked for.

    ``ask`` may shell out (``bazel query``) and fail; the planner asks once the evidence
    store is open, so that a failure widens to every recorded test. ``runner`` and
    ``why`` say which runner declares them and why (None: the caller chose).
    """

    ask: AskDeclared
    runner: str | None = None
    why: str = ""


class Declarations(Protocol):
    """Where a plan's declared tests come from."""

    def declared_by(self, root: Path, rules: Config) -> DeclaredBy:
        """Who declares the tests under the decision ``rules`` (no test is asked for yet)."""
        ...


@dataclass(frozen=True)
class ByRunner:
    """The declared tests follow the runner (:func:`choose_runner`): ``bazel query`` when it
    is Bazel, else the store's tests."""

    def declared_by(self, root: Path, rules: Config) -> DeclaredBy:
        runner, why = choose_runner(root, rules)
        return DeclaredBy(bazel_declared if runner == "bazel" else _store_only, runner, why)


@dataclass(frozen=True)
class Given:
    """Tests the caller already has; None: the tests in the store are the universe."""

    tests: Mapping[TestId, DeclaredTest] | None

    def declared_by(self, root: Path, rules: Config) -> DeclaredBy:
        return DeclaredBy(self._ask)

    def _ask(self, root: Path, rules: Config) -> Mapping[TestId, DeclaredTest] | None:
        return self.tests


@dataclass(frozen=True)
class Query:
    """The tests a caller's function declares (a ``bazel query`` with its own Bazel)."""

    ask: AskDeclared

    def declared_by(self, root: Path, rules: Config) -> DeclaredBy:
        return DeclaredBy(self.ask)


def _store_only(root: Path, rules: Config) -> None:
    return None


#: The default: the declared tests follow the runner.
BY_RUNNER = ByRunner()
#: No declarations: the tests in the evidence store are the universe.
STORE_ONLY = Given(None)


@dataclass(frozen=True)
class Environment:
    """The test runner's environment: its fingerprint (None: unknown, every test re-runs)
    and, when the runner described itself, every part of it (packages included)."""

    fingerprint: str | None
    parts: Mapping[str, str] | None = None


class EnvironmentProbe(Protocol):
    """What the test runner's environment is."""

    def probe(self, root: Path, rules: Config) -> Environment:
        """The environment, never raising (an unknown one has fingerprint None)."""
        ...


@dataclass(frozen=True)
class KnownFingerprint:
    """A fingerprint the caller already has: all there is to compare."""

    fingerprint: str

    def probe(self, root: Path, rules: Config) -> Environment:
        return Environment(self.fingerprint)


@dataclass(frozen=True)
class RunnerInterpreter:
    """The runner's interpreter (:func:`runner_python`) describes itself, packages included,
    so evidence recorded in an environment that differs only in packages a test never
    imported stays usable."""

    def probe(self, root: Path, rules: Config) -> Environment:
        from fastci.evidence.record.environment import environment_of_interpreter

        try:
            env = environment_of_interpreter(runner_python(root, rules), cwd=root)
        except Exception as exc:  # noqa: BLE001 - unknown environment: every test re-runs
            LOG.warning("cannot compute the test runner's environment fingerprint: %s", exc)
            return Environment(None)
        return Environment(env["fingerprint"], env)


#: The default: ask the test runner's interpreter.
RUNNER_ENVIRONMENT = RunnerInterpreter()


def choose_runner(root: Path, config: Config) -> tuple[str, str]:
    """The runner whose tests make the universe (``bazel`` or ``pytest``), and why.

    Config ``runner`` (set by ``fastci.yaml``, ``$FASTCI_RUNNER`` or ``--bazel`` /
    ``--no-bazel``) wins; ``auto`` is Bazel when a Bazel workspace file is at
    ``root`` and the Bazel executable (config ``bazel``) is found, else pytest.
    """
    if config.runner in ("bazel", "pytest"):
        where = ("the command line or $FASTCI_RUNNER" if "runner" in config.overridden
                 else "config `runner`")
        return config.runner, f"set by {where}"
    marker = next((name for name in WORKSPACE_FILES if (Path(root) / name).is_file()), None)
    if marker is None:
        return "pytest", ("no Bazel workspace (no " + ", ".join(WORKSPACE_FILES)
                          + " at the repository root)")
    exe = config.bazel
    if "/" in exe:  # a path; a relative one is run from the root
        path = Path(exe) if Path(exe).is_absolute() else Path(root) / exe
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(exe) is not None
    if not found:
        return "pytest", (f"{marker} is at the repository root, but the Bazel executable "
                          f"{exe!r} is not found (set `runner: bazel` to insist)")
    return "bazel", f"{marker} is at the repository root and {exe!r} is found"


def runner_python(root: Path, config: Config) -> str:
    """The interpreter the tests run with, whose environment the fingerprint must describe.

    ``runner_python`` from the config: a path (relative to ``root``), a command on
    ``PATH``, or ``auto``: the lookup of the Bazel Python toolchain
    (``rules/private/python_interpreter.bzl``) -- ``$FASTCI_PYTHON``,
    ``$VIRTUAL_ENV/bin/python3``, ``<root>/.venv/bin/python3`` -- then this process's
    interpreter (a pytest suite run with the planner's Python).

    Raises:
        FastCIError: a configured command is not on ``PATH``.
    """
    value = config.runner_python
    if value != "auto":
        if "/" in value:
            path = Path(value).expanduser()
            return str(path if path.is_absolute() else Path(root) / path)
        found = shutil.which(value)
        if found is None:
            raise FastCIError(f"runner_python {value!r} is not on PATH")
        return found
    if os.environ.get("FASTCI_PYTHON"):
        return os.environ["FASTCI_PYTHON"]
    if os.environ.get("VIRTUAL_ENV"):
        return os.path.join(os.environ["VIRTUAL_ENV"], "bin", "python3")
    venv = Path(root) / ".venv" / "bin" / "python3"
    return str(venv) if venv.exists() else sys.executable


def label_to_path(label: str) -> str | None:
    """``//pkg/sub:file.py`` -> ``pkg/sub/file.py``; None for another repository's file.

    Raises:
        LabelError: ``label`` is not a well-formed label.
    """
    from fastci.types import parse_label  # the one label parser (fastci.types)

    return parse_label(label).source_path()


def bazel_declared(root: Path, config: Config, *, bazel: Any = None) -> dict[TestId, DeclaredTest]:
    """The declared gpu_tests from ``bazel query`` (:mod:`fastci.integrations.bazel.query`)."""
    from fastci.integrations.bazel.query import list_gpu_tests  # imported lazily: it shells out
    from fastci.integrations.bazel.runner import Bazel

    return declared_tests(list_gpu_tests(bazel or Bazel(root, config.bazel), config.targets))


def declared_tests(decls: Iterable[TestDecl]) -> dict[TestId, DeclaredTest]:
    """``bazel query``'s test declarations as the selector takes them, by test id."""
    out: dict[TestId, DeclaredTest] = {}
    for d in decls:
        # A source in another repository has no path here: no change of ours can touch it.
        srcs = tuple(p for p in map(label_to_path, d.srcs) if p is not None)
        out[d.id] = declared_test(d, srcs)
    return out


def declared_test(d: TestDecl, srcs: tuple[RelPath, ...] = ()) -> DeclaredTest:
    """A :class:`~fastci.integrations.bazel.query.TestDecl` as the selector takes it:
    GPUs, workload and sources, and the whole reduction declaration."""
    return DeclaredTest(d.id, int(d.gpus), dict(d.workload), srcs, floors=dict(d.floors),
                        frozen=d.frozen, scope=tuple(d.scope), constraints=tuple(d.constraints),
                        check=d.check, reference=d.reference, defaulted=tuple(d.defaulted))
