"""The pytest side of a plan: deselect skipped tests (with reasons), order the rest.

``fastci.pytest.plugin`` registers :class:`PlanPlugin` for ``--fastci-plan PATH``.
Tests are matched by pytest node id (as pytest writes it, or with its file path
repo-relative), or by Bazel label: an item in the file ``pkg/foo_test.py`` is the
gpu_test ``//pkg:foo_test`` whose main file it is (the default main, ``<name>.py``:
:mod:`fastci.integrations.bazel.mains`; no ``bazel query`` at run time). A test the
plan does not mention runs (the safe side); a plan in mode ``all`` or ``shadow``
deselects nothing. A selective plan none of whose ids matches a collected test
is warned about loudly (a ``PytestWarning`` and a terminal section): its ids are
probably of another suite or kind. A plan that deselects every collected test
("nothing affected") ends the session with exit status 0, not pytest's 5 ("no
tests ran"), and says so. The deselected tests are summarized in one line
(how many of how many, and which plan); ``--fastci-list-deselected`` lists each
with its reason (``fastci explain TEST`` gives any test's reason too).

Workload overrides follow the Bazel rules: a planned test's overrides reach it
as ``FASTCI_WORKLOAD`` (JSON) while it runs only when the test declares its
workload with the ``fastci_workload`` marker and the overrides pass
:func:`fastci.plan.workload.override_problems` (declared dimension with a floor,
same type, ``floor <= value <= full``, constraints hold). Otherwise the test
runs at full workload (the variable is left as it was) and the reason is
shown: a warning on the test and a line in the terminal summary. A suite
declares a test's workload like this (its conftest can attach the marker to
collected items)::

    @pytest.mark.fastci_workload(workload={"train_iters": 8, "tp": 2},
                                 floors={"train_iters": 2},
                                 constraints=["train_iters % 2 == 0"],
                                 scope=["parallel_parity"])
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Mapping

import pytest

from fastci.integrations.bazel.mains import labels_by_main
from fastci.pytest.ids import test_id_for
from fastci.plan.model import Plan, by_priority
from fastci.types import is_label

LOG = logging.getLogger(__name__)

WORKLOAD_ENV = "FASTCI_WORKLOAD"
MARKER = "fastci_workload"
MARKER_LINE = (f"{MARKER}(workload, floors={{}}, constraints=[], scope=[], frozen=None, "
               "check=None, reference=None): the test's declared workload (dimension -> full "
               "value), floors (no floor = frozen), constraints, scope, check and reference "
               "(as a gpu_test's attributes); a FastCI plan may reduce it within these only")


@dataclass(frozen=True)
class Declaration:
    """A test's workload declaration, from its ``fastci_workload`` marker."""

    workload: Mapping[str, Any]
    floors: Mapping[str, Any]
    constraints: tuple[str, ...]
    scope: tuple[str, ...]
    #: As a gpu_test's attributes (None: not declared, the defaults apply).
    frozen: tuple[str, ...] | None = None
    check: str | None = None
    reference: str | None = None


def declaration(item: pytest.Item) -> Declaration | None:
    """The item's ``fastci_workload`` declaration, None when it has none.

    Raises:
        ValueError: the marker is malformed (the caller runs the test at full workload).
    """
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("workload", marker.args[0])
    unknown = sorted(set(kwargs) - {"workload", "floors", "constraints", "scope", "frozen",
                                    "check", "reference"})
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}")
    workload, floors = kwargs.get("workload"), kwargs.get("floors", {})
    constraints, scope = kwargs.get("constraints", ()), kwargs.get("scope", ())
    if not isinstance(workload, Mapping) or not isinstance(floors, Mapping):
        raise ValueError("workload and floors must be dicts")
    if isinstance(constraints, str) or not all(isinstance(c, str) for c in constraints):
        raise ValueError("constraints must be a list of strings")
    if isinstance(scope, str) or not all(isinstance(c, str) for c in scope):
        raise ValueError("scope must be a list of strings")
    frozen = kwargs.get("frozen")
    if frozen is not None and (isinstance(frozen, str)
                               or not all(isinstance(c, str) for c in frozen)):
        raise ValueError("frozen must be a list of strings")
    check, reference = kwargs.get("check"), kwargs.get("reference")
    if not all(v is None or isinstance(v, str) for v in (check, reference)):
        raise ValueError("check and reference must be strings")
    return Declaration(dict(workload), dict(floors), tuple(constraints), tuple(scope),
                       None if frozen is None else tuple(frozen), check, reference)


def register_marker(config: pytest.Config) -> None:
    """Register the ``fastci_workload`` marker (once), so ``--strict-markers`` accepts it."""
    if not any(line.split("(")[0] == MARKER for line in config.getini("markers")):
        config.addinivalue_line("markers", MARKER_LINE)


class PlanPlugin:
    """Apply a :class:`~fastci.plan.model.Plan` to a pytest session."""

    def __init__(self, plan: Plan, root: Path | None = None, *, source: str | None = None,
                 list_deselected: bool | None = None, prunes_rerun: bool = False) -> None:
        """Apply ``plan`` (read from ``source``, for messages) to the session.

        ``list_deselected``: list each deselected test in the terminal summary
        (None: the ``--fastci-list-deselected`` option decides; default one line).
        ``prunes_rerun``: the caller runs the plan's pruned tests after any failure or
        flaky pass (``fastci run``, ``--fastci-prunes-rerun``), so they are deselected.
        Without it a prune does not hold (it is safe only under that rule): the pruned
        tests run at full workload, as tests the plan does not list do.
        """
        self.plan = plan
        self.source = source
        self.list_deselected = list_deselected
        # Evidence (and so plans) name tests relative to the repo root; pytest's
        # node ids are relative to its rootdir. Match either.
        self.root = root
        self.order = {t.id: i for i, t in enumerate(by_priority(plan.tests))}
        selective = plan.mode == "selective"
        #: Pruned tests run here: nothing in this session runs them after a failure.
        self.conditional = frozenset(s.id for s in plan.skipped if s.stand_ins) \
            if selective and not prunes_rerun else frozenset()
        self.skip_why = {s.id: s.why for s in plan.skipped
                         if s.id not in self.conditional} if selective else {}
        self.unpruned: list[str] = []  # pruned tests this session runs (conditional)
        self.overrides = {t.id: dict(t.overrides) for t in plan.tests if t.overrides}
        # Main file -> label, for a plan written in Bazel labels (one gpu_test per main file).
        self.by_main = labels_by_main([*self.order, *(s.id for s in plan.skipped)])
        self.deselected: list[tuple[str, str]] = []
        self.applied: dict[str, dict[str, Any]] = {}  # plan id -> overrides it ran with
        self.ignored: list[tuple[str, str]] = []  # (plan id, why it ran at full workload)
        self.matched: set[str] = set()  # plan ids that named a collected item
        self.collected = 0
        self.no_match: str | None = None  # the loud warning, when no plan id matched
        self.all_deselected = False  # the plan deselected every collected test

    def pytest_configure(self, config: pytest.Config) -> None:
        """Register the ``fastci_workload`` marker; read ``--fastci-list-deselected``."""
        register_marker(config)
        if self.list_deselected is None:  # the option exists only where the plugin is loaded
            self.list_deselected = bool(config.getoption("--fastci-list-deselected",
                                                         default=False))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Deselect the plan's skipped tests and sort the rest by plan order."""
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        self.collected = len(items)
        for item in items:
            tid = self._plan_id(item)
            if tid in self.order or tid in self.skip_why or tid in self.conditional:
                self.matched.add(tid)
            if tid in self.conditional:
                self.unpruned.append(tid)
            why = self.skip_why.get(tid)
            if why is None:
                keep.append(item)
            else:
                dropped.append(item)
                # An item deselected by its gpu_test's label: name both.
                shown = f"{self._item_id(item)} ({tid})" if is_label(tid) else tid
                self.deselected.append((shown, why or "skipped by the plan"))
        self._warn_no_match(config)
        self.all_deselected = bool(dropped) and not keep
        unplanned = len(self.order)
        position = {id(item): i for i, item in enumerate(keep)}
        keep.sort(key=lambda it: (self.order.get(self._plan_id(it), unplanned), position[id(it)]))
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item,
                                nextitem: pytest.Item | None) -> Generator[None, Any, None]:
        """Run a test with its plan overrides in ``FASTCI_WORKLOAD``, if they are acceptable."""
        tid = self._plan_id(item)
        overrides = self.overrides.get(tid)
        why = self._problem(item, overrides) if overrides else None
        if why is not None:
            msg = f"fastci: {tid}: overrides {_render(overrides or {})} ignored ({why}): " \
                  "runs at full workload"
            self.ignored.append((tid, why))
            LOG.warning(msg)
            item.warn(pytest.PytestWarning(msg))
        if not overrides or why is not None:
            yield
            return
        self.applied[tid] = dict(overrides)
        old = os.environ.get(WORKLOAD_ENV)
        os.environ[WORKLOAD_ENV] = json.dumps(overrides, sort_keys=True)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(WORKLOAD_ENV, None)
            else:
                os.environ[WORKLOAD_ENV] = old

    @staticmethod
    def _problem(item: pytest.Item, overrides: Mapping[str, Any]) -> str | None:
        """Why ``overrides`` cannot apply to ``item`` (None: they can), as Bazel decides."""
        from fastci.plan.workload import override_problems, reduction_problems

        try:
            decl = declaration(item)
        except ValueError as exc:
            return f"its {MARKER} marker is malformed: {exc}"
        if decl is None:
            return f"the test declares no workload (no @pytest.mark.{MARKER})"
        try:
            # Held to what a gpu_test's rules enforce at load time (one shared corpus).
            problems = [f"its declaration is invalid: {p}" for p in reduction_problems(decl)]
            problems = problems or override_problems(decl.workload, decl.floors,
                                                     decl.constraints, overrides)
        except Exception as exc:  # noqa: BLE001 - any doubt runs the full workload
            return f"they cannot be checked: {exc}"
        return "; ".join(problems) if problems else None

    def _warn_no_match(self, config: pytest.Config) -> None:
        """Warn loudly when a selective plan names tests but none of the collected ones."""
        ids = len(set(self.order) | set(self.skip_why) | self.conditional)
        if self.plan.mode != "selective" or not ids or not self.collected or self.matched:
            return
        self.no_match = (f"fastci: none of the plan's {ids} test id(s) matched any of the "
                         f"{self.collected} collected test(s): the plan deselected nothing "
                         "(is it a plan of another suite, or of gpu_tests whose main file is "
                         "not <name>.py?)")
        LOG.warning(self.no_match)
        config.issue_config_time_warning(pytest.PytestWarning(self.no_match), stacklevel=2)

    def _plan_id(self, item: pytest.Item) -> str:
        """The id the plan uses for ``item``: its node id, its repo-relative id, or its gpu_test's label."""
        known = (self.order, self.skip_why, self.conditional)
        if any(item.nodeid in ids for ids in known):
            return item.nodeid
        tid = self._item_id(item)
        if any(tid in ids for ids in known) or not self.by_main:
            return tid
        label = self.by_main.get(tid.partition("::")[0])
        return label if label is not None else tid

    def _item_id(self, item: pytest.Item) -> str:
        return item.nodeid if self.root is None else test_id_for(item, self.root)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The plan skipped every collected test: that is "nothing affected", not a failure."""
        if self.all_deselected and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK

    def pytest_report_header(self, config: pytest.Config) -> str:
        """Say which plan is in effect."""
        return (f"fastci plan: mode {self.plan.mode}, {len(self.plan.tests)} planned, "
                f"{len(self.plan.skipped)} skipped" + (f" ({self.plan.reason})" if self.plan.reason else ""))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Summarize the deselected tests (or list them), and list ignored overrides with why."""
        if self.no_match is not None:
            terminalreporter.section("fastci: WARNING: the plan matched no collected test", red=True)
            terminalreporter.write_line(self.no_match)
        if self.all_deselected:
            terminalreporter.write_line(
                f"fastci: the plan skips all {len(self.deselected)} collected test(s) "
                "(nothing it runs is affected by the change): exit status 0, not 5")
        if self.unpruned:
            terminalreporter.write_line(
                f"fastci: {len(set(self.unpruned))} pruned test(s) ran at full workload: a prune "
                "holds only where a failure runs the pruned tests, which `fastci run` does "
                "and this session does not")
        if self.ignored:
            terminalreporter.section("fastci: overrides ignored, ran at full workload")
            for nodeid, why in self.ignored:
                terminalreporter.write_line(f"{nodeid}: {why}")
        if not self.deselected:
            return
        if not self.list_deselected:
            # One line: a plan may deselect thousands of tests.
            terminalreporter.write_line(self.deselected_line())
            return
        terminalreporter.section("fastci: skipped by the plan")
        for nodeid, why in self.deselected:
            terminalreporter.write_line(f"{nodeid}: {why}")

    def deselected_line(self) -> str:
        """The one-line summary of what the plan deselected."""
        where = f" (plan {self.source})" if self.source else ""
        return (f"fastci: deselected {len(self.deselected)} of {self.collected} tests{where}; "
                "--fastci-list-deselected to list them, `fastci explain TEST` for why")


def _render(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))
