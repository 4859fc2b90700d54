"""The pytest side of a plan: deselect skipped tests (with reasons), order the rest.

``fastci.pytest_plugin`` registers :class:`PlanPlugin` for ``--fastci-plan PATH``.
Tests are matched by pytest node id. A test the plan does not mention runs (the
safe side); a plan in mode ``all`` or ``shadow`` deselects nothing. A planned
test's workload overrides are passed to it as ``FASTCI_WORKLOAD`` (JSON) while it
runs; with empty overrides the variable is left as it was.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Generator

import pytest

from fastci.plan import Plan

LOG = logging.getLogger(__name__)

WORKLOAD_ENV = "FASTCI_WORKLOAD"


class PlanPlugin:
    """Apply a :class:`~fastci.plan.Plan` to a pytest session."""

    def __init__(self, plan: Plan, root: Path | None = None) -> None:
        self.plan = plan
        # Evidence (and so plans) name tests relative to the repo root; pytest's
        # node ids are relative to its rootdir. Match either.
        self.root = root
        self.order = {t.id: i for i, t in enumerate(plan.tests)}
        self.skip_why = {s.id: s.why for s in plan.skipped} if plan.mode == "selective" else {}
        self.overrides = {t.id: dict(t.overrides) for t in plan.tests if t.overrides}
        self.deselected: list[tuple[str, str]] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Deselect the plan's skipped tests and sort the rest by plan order."""
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            tid = self._plan_id(item)
            why = self.skip_why.get(tid)
            if why is None:
                keep.append(item)
            else:
                dropped.append(item)
                self.deselected.append((tid, why or "skipped by the plan"))
        unplanned = len(self.order)
        position = {id(item): i for i, item in enumerate(keep)}
        keep.sort(key=lambda it: (self.order.get(self._plan_id(it), unplanned), position[id(it)]))
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item,
                                nextitem: pytest.Item | None) -> Generator[None, Any, None]:
        """Run a test with its plan overrides in ``FASTCI_WORKLOAD``."""
        overrides = self.overrides.get(self._plan_id(item))
        if not overrides:
            yield
            return
        old = os.environ.get(WORKLOAD_ENV)
        os.environ[WORKLOAD_ENV] = json.dumps(overrides, sort_keys=True)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(WORKLOAD_ENV, None)
            else:
                os.environ[WORKLOAD_ENV] = old

    def _plan_id(self, item: pytest.Item) -> str:
        """The id the plan uses for ``item``: its node id, or its repo-relative id."""
        if self.root is None or item.nodeid in self.order or item.nodeid in self.skip_why:
            return item.nodeid
        from fastci.pytest_plugin import test_id_for

        return test_id_for(item, self.root)

    def pytest_report_header(self, config: pytest.Config) -> str:
        """Say which plan is in effect."""
        return (f"fastci plan: mode {self.plan.mode}, {len(self.plan.tests)} planned, "
                f"{len(self.plan.skipped)} skipped" + (f" ({self.plan.reason})" if self.plan.reason else ""))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """List every deselected test with the plan's reason."""
        if not self.deselected:
            return
        terminalreporter.section("fastci: skipped by the plan")
        for nodeid, why in self.deselected:
            terminalreporter.write_line(f"{nodeid}: {why}")
