"""Running tests for ``fastci eval``: really, through Bazel or pytest, recorded in line mode.

An :class:`Executor` knows its suite (:meth:`~Executor.universe`: every test and its
GPUs) and runs a set of tests, each at the overrides given (empty: full workload),
under the recorder in line mode, so each run also says which lines it executed
(for retention). It returns one :class:`TestRun` per test asked for: a test the
runner did not report is ``not run``, never passed.

- :class:`BazelExecutor`: one ``bazel test --config=fastci --config=fastci_record
  --test_env=FASTCI_RECORD_LINES=1 --keep_going`` per call, overrides through a
  stand-in ``@fastci_plan`` repository (the way ``fastci calibrate`` passes them),
  so ``.fastci/plan.json`` is never written. Outcomes and durations come from the
  build event file; the traces from ``bazel-testlogs``.
- :class:`PytestExecutor`: one ``pytest -p fastci.pytest_plugin --fastci-record``
  per call, overrides through a plan file the plugin obeys.

Each run's traces are handed to ``keep`` (a directory laid out like
``bazel-testlogs``) before they are read, so the evaluation can cache them and
ingest them as evidence (a range refreshes evidence after each commit).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol

from fastci.integrations import procs
from fastci.config import Config
from fastci.errors import BazelError, FastCIError
from fastci.evidence.store.ingest import Checksums, results_from_bep
from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
from fastci.integrations.bazel.query import list_gpu_tests
from fastci.integrations.bazel.runner import Bazel
from fastci.integrations.bazel.testlogs import test_dir
from fastci.evidence.record.recorder import LINES_ENV
from fastci.plan.inputs import declared_tests
from fastci.run.calibration_runs import PLUGIN, decode_run, node_arg
from fastci.select import DeclaredTest
from fastci.types import RelPath, TestId

LOG = logging.getLogger(__name__)

#: Flags of every Bazel run of an evaluation: recorded in line mode, never cached.
BAZEL_FLAGS = ("--config=fastci", "--config=fastci_record", f"--test_env={LINES_ENV}=1",
               "--keep_going")


@dataclass(frozen=True)
class TestRun:
    """One test's run: outcome (``passed``, ``failed``, ``error``, ``not run``), seconds,
    and the lines it executed per file (empty when it left no trace)."""

    outcome: str
    duration_s: float
    lines: Mapping[RelPath, frozenset[int]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """Whether the run counts as a failure (anything but passed or skipped)."""
        return self.outcome not in ("passed", "skipped")


class Executor(Protocol):
    """Runs tests of one workspace for an evaluation."""

    name: str

    def universe(self) -> dict[TestId, int]:
        """Every test of the suite and its GPUs, as the runner declares them now."""

    def declared(self) -> Mapping[TestId, DeclaredTest] | None:
        """The declarations the last :meth:`universe` read, as the planner takes them
        (so the plan of the same tree does not ask the runner again); None: the
        planner finds them itself."""

    def run(self, tests: Mapping[TestId, Mapping[str, Any]], *,
            keep: Path | None = None) -> dict[TestId, TestRun]:
        """Run ``tests`` (id -> overrides) once; traces copied under ``keep``."""

    def close(self) -> None:
        """Release what the executor holds (a Bazel server)."""


class BazelExecutor:
    """Runs gpu_tests with Bazel in ``workspace`` (see the module docstring)."""

    name = "bazel"

    def __init__(self, workspace: Path, config: Config, *, python: str | None = None) -> None:
        self.workspace = workspace
        self.config = config
        python = python or sys.executable
        # The toolchain's interpreter (rules/private/python_interpreter.bzl): the one the
        # repository's tests run with, not whatever a fresh worktree would find.
        self.bazel = Bazel(workspace, config.bazel, python=python,
                           env=dict(os.environ, FASTCI_PYTHON=python))
        self._declared: dict[TestId, DeclaredTest] | None = None

    def universe(self) -> dict[TestId, int]:
        # What analyze's own `bazel query` (plan.inputs.bazel_declared) would read.
        self._declared = declared_tests(list_gpu_tests(self.bazel, self.config.targets))
        return {t: d.gpus for t, d in self._declared.items()}

    def declared(self) -> Mapping[TestId, DeclaredTest] | None:
        return self._declared

    def run(self, tests: Mapping[TestId, Mapping[str, Any]], *,
            keep: Path | None = None) -> dict[TestId, TestRun]:
        if not tests:
            return {}
        testlogs = Path(self.bazel.info("bazel-testlogs"))
        checksums = Checksums(self.workspace)
        with tempfile.TemporaryDirectory(prefix="fastci-eval-") as tmp:
            repo = write_plan_repo(Path(tmp) / "plan", tests, status="fastci eval")
            bep = Path(tmp) / "bep.json"
            try:
                self.bazel.test(list(tests), flags=[*BAZEL_FLAGS, override_flag(repo)],
                                bep_path=bep)
            except BazelError as exc:
                LOG.warning("bazel test: %s", str(exc).splitlines()[0])
            results = results_from_bep(bep) if bep.is_file() else {}
        out: dict[TestId, TestRun] = {}
        for label in tests:
            result = results.get(label)
            if result is None:
                out[label] = TestRun("not run", 0.0)
                continue
            outputs = test_dir(testlogs, label) / "test.outputs"
            lines: Mapping[RelPath, frozenset[int]] = {}
            if outputs.is_dir():
                if keep is not None:
                    shutil.copytree(outputs, test_dir(keep, label) / "test.outputs",
                                    dirs_exist_ok=True)
                got = decode_run(label, outputs, None, checksums, source="bazel", result=result)
                if got is not None:
                    lines = {p: frozenset(v) for p, v in got.lines.items() if v}
            out[label] = TestRun(result.outcome, result.duration_s, lines)
        return out

    def close(self) -> None:
        self.bazel.shutdown()


class PytestExecutor:
    """Runs pytest tests in ``root`` with the plugin (see the module docstring)."""

    name = "pytest"

    def __init__(self, root: Path, *, python: str | None = None,
                 pytest_args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.python = python or sys.executable
        self.pytest_args = pytest_args

    def universe(self) -> dict[TestId, int]:
        from fastci.run.collect import collect

        found = collect(self.root, [], python=self.python, pytest_args=self.pytest_args)
        return {t: int(getattr(d, "gpus", 0) or 0) for t, d in found.items()}

    def declared(self) -> Mapping[TestId, DeclaredTest] | None:
        return None  # a pytest plan takes its tests from the store and the calibration

    def run(self, tests: Mapping[TestId, Mapping[str, Any]], *,
            keep: Path | None = None) -> dict[TestId, TestRun]:
        if not tests:
            return {}
        with tempfile.TemporaryDirectory(prefix="fastci-eval-") as tmp:
            plan = Path(tmp) / "plan.json"
            # Tied to the tree it runs on: the plugin obeys no plan tied to no tree.
            from fastci.integrations.git.tree import UNKNOWN_TREE, current_tree

            plan.write_text(json.dumps({
                "version": 1, "mode": "selective", "reason": "fastci eval",
                "tree": current_tree(self.root) or UNKNOWN_TREE,
                "tests": [{"id": t, "overrides": dict(o)} for t, o in tests.items()],
                "skipped": []}))
            traces, results = Path(tmp) / "traces", Path(tmp) / "results.jsonl"
            env = dict(os.environ, **{LINES_ENV: "1"})
            procs.run(
                # Options as one token each, and --rootdir: pytest takes a separate path
                # argument for a test path when it looks for the rootdir (ids are
                # relative to the root).
                [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN,
                 f"--rootdir={self.root}", f"--fastci-plan={plan}", "--fastci-record",
                 f"--fastci-trace-dir={traces}", f"--fastci-results={results}",
                 *self.pytest_args, *(node_arg(self.root, t) for t in tests)],
                cwd=self.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            reported = _pytest_results(results)
            if keep is not None and traces.is_dir():
                shutil.copytree(traces, keep / "pytest", dirs_exist_ok=True)
            checksums = Checksums(self.root)
            out: dict[TestId, TestRun] = {}
            for test in tests:
                outcome, seconds = reported.get(test, ("not run", 0.0))
                got = decode_run(test, traces, None, checksums) if traces.is_dir() else None
                lines = {p: frozenset(v) for p, v in (got.lines if got else {}).items() if v}
                out[test] = TestRun(outcome, seconds, lines)
        return out

    def close(self) -> None:
        pass


def _pytest_results(path: Path) -> dict[TestId, tuple[str, float]]:
    """The plugin's ``--fastci-results`` lines: id -> (outcome, seconds)."""
    out: dict[TestId, tuple[str, float]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
            out[str(row["id"])] = (str(row["outcome"]), float(row.get("duration_s") or 0.0))
        except (ValueError, KeyError, TypeError):
            LOG.warning("%s: unreadable result line (skipped)", path)
    return out


def executor_for(workspace: Path, config: Config, runner: str, *, python: str) -> Executor:
    """The executor of ``runner`` (``bazel`` or ``pytest``) for ``workspace``, its tests
    run by ``python``."""
    if runner == "bazel":
        return BazelExecutor(workspace, config, python=python)
    if runner == "pytest":
        return PytestExecutor(workspace, python=python)
    raise FastCIError(f"unknown runner {runner!r} (bazel or pytest)")
