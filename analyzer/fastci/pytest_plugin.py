"""pytest plugin (entry point ``pytest11: fastci``): record evidence, obey a plan.

Inert unless asked:

* ``--fastci-record`` runs every test item under a
  :class:`~fastci.evidence.recorder.Recorder` (setup, call and teardown) and
  writes one trace per test (plus one per child process) into
  ``--fastci-trace-dir`` (default ``.fastci/runs/pytest-traces``); ingest them
  with ``fastci ingest .fastci/runs/pytest-traces``. The test id is the node id
  with its file path made repo-relative. Module top levels executed while
  collecting are not attributed to any test (collection runs before any test).
* ``--fastci-plan PATH`` registers ``fastci.pytest_plan.PlanPlugin(plan)``
  (deselects and orders tests). A malformed plan runs everything, loudly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Generator

import pytest

LOG = logging.getLogger(__name__)

DEFAULT_TRACE_DIR = Path(".fastci/runs/pytest-traces")


def pytest_plugin_registered(plugin: object, plugin_name: str,
                             manager: pytest.PytestPluginManager) -> None:
    """Loaded with ``-p fastci.pytest_plugin``: keep the ``pytest11`` entry point
    (the same module, named ``fastci``) from registering it a second time."""
    if plugin is sys.modules[__name__] and plugin_name != "fastci" \
            and manager.get_plugin("fastci") is None:
        manager.set_blocked("fastci")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register FastCI's options."""
    group = parser.getgroup("fastci", "FastCI test selection and evidence recording")
    group.addoption("--fastci-record", action="store_true", default=False,
                    help="record per-test evidence (executed units, contexts, files read)")
    group.addoption("--fastci-trace-dir", default=None,
                    help=f"where traces go (default: <repo>/{DEFAULT_TRACE_DIR})")
    group.addoption("--fastci-plan", default=None, metavar="PATH",
                    help="run only what this FastCI plan selects, in its order")


def pytest_configure(config: pytest.Config) -> None:
    """Register the record and plan plugins when their options are given."""
    # The recorder registers first so the plan plugin's wrapper (later = outer) has
    # set the test's FASTCI_WORKLOAD before the recorder reads it.
    if config.getoption("--fastci-record"):
        from fastci.git import repo_root

        root = repo_root(Path(str(config.rootpath)))
        out = config.getoption("--fastci-trace-dir")
        out_dir = Path(out).resolve() if out else root / DEFAULT_TRACE_DIR
        config.pluginmanager.register(RecordPlugin(root, out_dir), "fastci-record")
    plan_path = config.getoption("--fastci-plan")
    if plan_path:
        from fastci.errors import FastCIError
        from fastci.plan import load_plan

        try:
            plan = load_plan(plan_path)
        except FastCIError as exc:
            msg = f"fastci: {exc}; running every test"
            LOG.warning(msg)
            config.issue_config_time_warning(pytest.PytestWarning(msg), stacklevel=2)
        else:
            from fastci import pytest_plan  # lazily: owned by the selection area
            from fastci.git import repo_root

            root = repo_root(Path(str(config.rootpath)))
            config.pluginmanager.register(pytest_plan.PlanPlugin(plan, root), "fastci-plan")


def test_id_for(item: pytest.Item, root: Path) -> str:
    """The item's node id with its file path relative to the repo root."""
    nodeid = item.nodeid
    _, sep, rest = nodeid.partition("::")
    try:
        rel = Path(str(item.path)).resolve().relative_to(root).as_posix()
    except ValueError:
        return nodeid
    return f"{rel}{sep}{rest}"


class RecordPlugin:
    """Wrap each test item's run protocol in a recorder."""

    def __init__(self, root: Path, out_dir: Path) -> None:
        self.root = root
        self.out_dir = out_dir
        self.traces = 0
        self._outcome = "passed"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Generator[None, Any, None]:
        from fastci.evidence.recorder import Recorder

        marker = item.get_closest_marker("gpus")
        gpus = int(marker.args[0]) if marker and marker.args else 0
        try:
            workload = json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}")
        except ValueError:
            workload = {}
        rec = Recorder(test_id_for(item, self.root), self.out_dir, repo_root=self.root,
                       workload=workload if isinstance(workload, dict) else {}, gpus=gpus)
        self._outcome = "passed"
        rec.start()
        try:
            yield
        finally:
            rec.stop(self._outcome)
            self.traces += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold the phase reports into one outcome: error > failed > skipped > passed."""
        if report.failed:
            self._outcome = "error" if report.when != "call" else "failed"
        elif report.skipped and self._outcome == "passed":
            self._outcome = "skipped"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Say where the traces went and how to ingest them."""
        terminalreporter.write_line(
            f"fastci: {self.traces} test trace(s) in {self.out_dir}; "
            f"ingest with `fastci ingest {self.out_dir}`")
