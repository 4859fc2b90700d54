"""pytest plugin (entry point ``pytest11: fastci``): record evidence, obey a plan.

Inert unless asked:

* ``--fastci-record`` runs every test item under a
  :class:`~fastci.evidence.record.recorder.Recorder` (setup, call and teardown) and
  writes one trace per test (plus one per child process) into
  ``--fastci-trace-dir`` (default ``.fastci/runs/pytest-traces``); ingest them
  with ``fastci ingest .fastci/runs/pytest-traces``. The test id is the node id
  with its file path made repo-relative. What runs while pytest collects
  (module top levels, conftest files, package ``__init__``s, collection hooks)
  is recorded once, as segments (:mod:`fastci.evidence.record.collection`), and
  every item names those of its collector chain and of the modules they
  imported, first or not. A fixture above function scope is set up (and torn
  down) inside one test's recording, into segments of its own that every test
  whose fixture closure holds it names. ``fastci ingest`` adds named segments
  to each test's evidence (docs/EVIDENCE.md).
* ``--fastci-plan PATH`` registers ``fastci.pytest.plan.PlanPlugin(plan)``
  (deselects and orders tests; the plan may name them by node id or by gpu_test
  label). A malformed plan, one made for another tree (its ``tree``) or for none,
  or a plan file git tracks runs everything, loudly.
* ``--fastci-results PATH`` writes one JSON line per test run: its FastCI id
  (repo-relative node id), outcome, duration (all phases), declared workload,
  the overrides it ran with and its ``gpus`` marker. ``fastci run`` reads it to
  record results (:mod:`fastci.run.runner`).

Outcomes (:class:`fastci.types.Outcome`, recorded alike in traces and result
lines) are pytest's own: ``passed``, ``failed``, ``error`` (setup or teardown
failed), ``skipped``, ``xfailed``, ``xpassed`` (a non-strict xfail that passed; a
strict one is ``failed``, as pytest reports it). A test the plan deselected
does not run and is recorded nowhere: a "deselected" run would hide the test's
real last outcome (and duration) behind one that says nothing about the code.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator

import pytest

from fastci.pytest.ids import test_id_for
from fastci.types import Outcome

if TYPE_CHECKING:
    from fastci.evidence.record.collection import CollectionRecorder
    from fastci.evidence.record.recorder import Recorder

LOG = logging.getLogger(__name__)

DEFAULT_TRACE_DIR = Path(".fastci/runs/pytest-traces")
#: A segment key no trace defines: a test naming it is recorded as incomplete.
NO_COLLECTION = "fastci/collection-not-recorded"
_COLLECTION = pytest.StashKey["CollectionRecorder"]()
_ROOT = pytest.StashKey[Path]()
_UNDO_UNTRACED = pytest.StashKey[Callable[[], None]]()


#: Every name this module is loaded under: the entry point, the documented path, its own.
_NAMES = ("fastci", "fastci.pytest_plugin", __name__)


def pytest_plugin_registered(plugin: object, plugin_name: str,
                             manager: pytest.PytestPluginManager) -> None:
    """Loaded under one name (``-p fastci.pytest_plugin``, ``-p`` with this module's path, or
    the ``pytest11`` entry point ``fastci``): keep the other names of this same module from
    registering it a second time."""
    if plugin is not sys.modules[__name__]:
        return
    for name in _NAMES:
        if name != plugin_name and manager.get_plugin(name) is None \
                and not manager.is_blocked(name):
            manager.set_blocked(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register FastCI's options."""
    group = parser.getgroup("fastci", "FastCI test selection and evidence recording")
    group.addoption("--fastci-record", action="store_true", default=False,
                    help="record per-test evidence (executed units, contexts, files read)")
    group.addoption("--fastci-trace-dir", default=None,
                    help=f"where traces go (default: <repo>/{DEFAULT_TRACE_DIR})")
    group.addoption("--fastci-plan", default=None, metavar="PATH",
                    help="run only what this FastCI plan selects, in its order")
    group.addoption("--fastci-results", default=None, metavar="PATH",
                    help="write each test's id, outcome, duration and workload as JSON lines")
    group.addoption("--fastci-prunes-rerun", action="store_true", default=False,
                    help="skip the plan's pruned tests: the caller runs them after any failure "
                         "(set by `fastci run`; without it pruned tests run)")
    group.addoption("--fastci-list-deselected", action="store_true", default=False,
                    help="list every test the plan deselected, with its reason (default: "
                         "one summary line; `fastci explain TEST` gives any test's reason)")


def _repo_root(config: pytest.Config) -> Path:
    """The git top level of the session's root dir, asked of git once per session (each
    ask is a ``git rev-parse`` process: ~10 ms)."""
    root = config.stash.get(_ROOT, None)
    if root is None:
        from fastci.integrations.git.repository import repo_root

        root = config.stash[_ROOT] = repo_root(Path(str(config.rootpath)))
    return root


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, Any, None]:
    """With ``--fastci-record``, start recording collection before the first conftest runs."""
    if getattr(early_config.known_args_namespace, "fastci_record", False):
        try:
            from fastci.evidence.record.collection import CollectionRecorder

            col = CollectionRecorder(_repo_root(early_config))
            col.start()
            early_config.stash[_COLLECTION] = col
        except Exception as exc:  # tests then name a missing segment: incomplete, selected
            LOG.warning("fastci: collection not recorded (%r); every test's evidence "
                        "is recorded as incomplete", exc)
        else:
            _untrace_rewrites(early_config, col)
    yield


def _untrace_rewrites(config: pytest.Config, col: "CollectionRecorder") -> None:
    """pytest's assertion rewriting runs untraced while this session records
    (:mod:`fastci.pytest.untraced`); :class:`RecordPlugin` undoes it at
    the end. A failure only leaves rewriting traced: slower, the same evidence."""
    try:
        from fastci.pytest import untraced

        undo = untraced.install(col.mapper.rel)
    except Exception as exc:
        LOG.warning("fastci: assertion rewriting stays traced (%r)", exc)
        return
    if undo is not None:
        config.stash[_UNDO_UNTRACED] = undo


def pytest_configure(config: pytest.Config) -> None:
    """Register the record and plan plugins when their options are given."""
    from fastci.pytest.plan import register_marker

    register_marker(config)  # suites may declare workloads under --strict-markers, plan or not
    # The recorder registers first so the plan plugin's wrapper (later = outer) has
    # set the test's FASTCI_WORKLOAD before the recorder reads it.
    if config.getoption("--fastci-record"):
        root = _repo_root(config)
        out = config.getoption("--fastci-trace-dir")
        out_dir = Path(out).resolve() if out else root / DEFAULT_TRACE_DIR
        config.pluginmanager.register(
            RecordPlugin(root, out_dir, config.stash.get(_COLLECTION, None)), "fastci-record")
    results = config.getoption("--fastci-results")
    if results:  # before the plan plugin too: it reads the FASTCI_WORKLOAD the plan set
        config.pluginmanager.register(
            ResultsPlugin(_repo_root(config), Path(results).resolve()),
            "fastci-results")
    plan_path = config.getoption("--fastci-plan")
    if plan_path:
        from fastci.errors import FastCIError
        from fastci.plan.model import load_plan

        try:
            plan = load_plan(plan_path)
        except FastCIError as exc:
            msg = f"fastci: {exc}; running every test"
            LOG.warning(msg)
            config.issue_config_time_warning(pytest.PytestWarning(msg), stacklevel=2)
        else:
            from fastci.pytest import plan as pytest_plan  # lazily: owned by the selection area
            from fastci.plan.model import for_runner
            from fastci.integrations.git.tree import current_tree

            root = _repo_root(config)
            # A plan made for another tree, or for none, or committed (tracked by git)
            # is not obeyed, like a malformed one.
            obeyed, warning = for_runner(plan, current_tree(root), Path(plan_path), root)
            if warning is not None:
                msg = f"fastci: {warning}"
                LOG.warning(msg)
                config.issue_config_time_warning(pytest.PytestWarning(msg), stacklevel=2)
            if obeyed is plan:
                config.pluginmanager.register(pytest_plan.PlanPlugin(
                    plan, root, source=plan_path,
                    list_deselected=bool(config.getoption("--fastci-list-deselected")),
                    prunes_rerun=bool(config.getoption("--fastci-prunes-rerun"))),
                    "fastci-plan")


def _declared_and_overrides(item: pytest.Item) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The item's declared workload (its ``fastci_workload`` marker) and what this run changed.

    Under pytest, ``FASTCI_WORKLOAD`` holds only the dimensions a plan (or the user)
    overrides for the running test; the declared workload comes from the marker.
    Unparsable values are recorded as unknown overrides, never as a full-workload run.
    """
    from fastci.pytest.plan import declaration

    try:
        decl = declaration(item)
    except ValueError:
        decl = None
    declared = dict(decl.workload) if decl is not None else {}
    try:
        raw = json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}")
    except ValueError:
        return declared, None
    if not isinstance(raw, dict):
        return declared, None
    return declared, {k: v for k, v in raw.items() if declared.get(k) != v}


def phase_outcome(report: pytest.TestReport) -> str:
    """The outcome one phase report (setup, call or teardown) says, in pytest's words.

    pytest's skipping plugin has already turned xfail markers into reports: an
    expected failure is a *skipped* report with ``wasxfail``, a non-strict xpass a
    *passed* one with ``wasxfail``, a strict xpass a *failed* call.
    """
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        return Outcome.FAILED.value if report.when == "call" else Outcome.ERROR.value
    if report.skipped:
        return Outcome.XFAILED.value if xfail else Outcome.SKIPPED.value
    return Outcome.XPASSED.value if xfail else Outcome.PASSED.value


#: Which phase's word wins when the phases disagree (higher wins): a failed
#: teardown after an xfailed call is an error, as pytest counts it.
_PRECEDENCE = {o.value: i for i, o in enumerate((
    Outcome.PASSED, Outcome.SKIPPED, Outcome.XPASSED, Outcome.XFAILED, Outcome.FAILED,
    Outcome.ERROR))}


def fold_outcome(current: str, phase: str) -> str:
    """Fold one phase's outcome into the test's: error > failed > xfailed > xpassed > skipped > passed."""
    return phase if _PRECEDENCE.get(phase, 0) > _PRECEDENCE.get(current, 0) else current


class RecordPlugin:
    """Wrap each test item's run protocol in a recorder; share collection and fixtures."""

    def __init__(self, root: Path, out_dir: Path,
                 collection: CollectionRecorder | None = None) -> None:
        self.root = root
        self.out_dir = out_dir
        self.traces = 0
        self._outcome = Outcome.PASSED.value
        self.collection = collection
        self._collected = False  # the collection segments were written
        self._session = collection.session if collection is not None else uuid.uuid4().hex
        self._rec: Recorder | None = None
        self._seq = 0
        # id(FixtureDef) -> (argname, its segment keys) while set up (scope above function).
        self._alive: dict[int, tuple[str, list[str]]] = {}
        # id(FixtureDef) -> (recorder, owned) while tearing down.
        self._tearing: dict[int, tuple[Recorder, bool]] = {}

    # ------------------------------------------------------------------ collection

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Generator[None, Any, None]:
        col = self.collection
        depth = col.enter_node(collector.nodeid) if col is not None else 0
        try:
            yield
        finally:
            if col is not None:
                col.leave_node(depth)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Collection is over: write its segments (one shared trace)."""
        col = self.collection
        if col is None:
            return
        try:
            col.stop()
            col.write(self.out_dir)
            self._collected = True
        except Exception as exc:  # tests then name a missing segment: incomplete, selected
            LOG.warning("fastci: collection evidence not written (%r); every test's "
                        "evidence is recorded as incomplete", exc)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Take the session's wrappers off: the collection recorder's import hooks and
        the untraced assertion rewriting (in-process sessions run one after another)."""
        if self.collection is not None:
            self.collection.close()
        undo = config.stash.get(_UNDO_UNTRACED, None)
        if undo is not None:
            undo()

    def _collection_keys(self, item: pytest.Item) -> list[str]:
        col = self.collection
        if col is None or not self._collected:
            return [NO_COLLECTION]
        return col.keys_for(node.nodeid for node in item.listchain())

    # ------------------------------------------------------------------ fixtures

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, None]:
        """A fixture above function scope records its setup into a segment of its own."""
        if fixturedef.scope == "function":
            yield
            return
        self._seq += 1
        name = f"{self._session}/fx{self._seq}-{fixturedef.argname}"
        keys = [f"{name}:setup", f"{name}:teardown"]
        rec = self._rec if self._rec is not None and self._rec.recording else None
        if rec is not None:
            rec.begin_segment(keys[0])
            rec.shared.update(keys)
        try:
            yield
        finally:
            if rec is not None and rec.recording:
                rec.end_segment()
            self._alive[id(fixturedef)] = (fixturedef.argname, keys)
            # Finalizers run last-in first-out: this one runs before the fixture's own.
            fixturedef.addfinalizer(functools.partial(self._teardown_begins, fixturedef, keys[1]))

    def _teardown_begins(self, fixturedef: Any, key: str) -> None:
        from fastci.evidence.record.recorder import Recorder

        rec = self._rec if self._rec is not None and self._rec.recording else None
        owned = rec is None
        if rec is None:  # torn down outside any test (an interrupted session): a trace of its own
            rec = Recorder("", self.out_dir, repo_root=self.root, workload={}, gpus=0,
                           role="shared", run_id=self._session, children=False)
            rec.start()
        rec.begin_segment(key)
        self._tearing[id(fixturedef)] = (rec, owned)

    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        """A fixture's finalizers ran: close its teardown segment."""
        self._alive.pop(id(fixturedef), None)
        entry = self._tearing.pop(id(fixturedef), None)
        if entry is None:
            return
        rec, owned = entry
        if rec.recording:
            rec.end_segment()
            if owned:
                rec.stop("")

    def _fixture_keys(self, item: pytest.Item) -> set[str]:
        names = set(getattr(item, "fixturenames", ()))
        names.update(getattr(item, "funcargs", {}) or {})
        return {k for argname, keys in self._alive.values() if argname in names for k in keys}

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item,
                                nextitem: pytest.Item | None) -> Generator[None, Any, None]:
        # Before teardown every fixture the test used is still set up.
        if self._rec is not None:
            self._rec.shared.update(self._fixture_keys(item))
        yield

    # ------------------------------------------------------------------ tests

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Generator[None, Any, None]:
        from fastci.evidence.record.recorder import Recorder

        marker = item.get_closest_marker("gpus")
        gpus = int(marker.args[0]) if marker and marker.args else 0
        declared, overrides = _declared_and_overrides(item)
        rec = Recorder(test_id_for(item, self.root), self.out_dir, repo_root=self.root,
                       workload=declared, overrides=overrides, gpus=gpus)
        rec.shared.update(self._collection_keys(item))
        col = self.collection
        if col is not None:
            col.take_requested()  # imports between tests are nobody's
        self._outcome = Outcome.PASSED.value
        rec.start()
        self._rec = rec
        try:
            yield
        finally:
            self._rec = None
            if col is not None:
                # Modules the test imported that collection had run: their top levels.
                rec.shared.update(col.take_requested())
            rec.stop(self._outcome)
            self.traces += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold the phase reports into one outcome (:func:`fold_outcome`)."""
        self._outcome = fold_outcome(self._outcome, phase_outcome(report))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Say where the traces went and how to ingest them."""
        terminalreporter.write_line(
            f"fastci: {self.traces} test trace(s) in {self.out_dir}; "
            f"ingest with `fastci ingest {self.out_dir}`")


def _gpus(item: pytest.Item) -> int:
    marker = item.get_closest_marker("gpus")
    try:
        return int(marker.args[0]) if marker and marker.args else 0
    except (TypeError, ValueError):
        return 0


class ResultsPlugin:
    """Write each test's result as a JSON line (``--fastci-results``), for ``fastci run``."""

    def __init__(self, root: Path, path: Path) -> None:
        self.root = root
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")  # a run that collects nothing leaves an empty file, not a stale one
        self._outcome = Outcome.PASSED.value
        self._duration = 0.0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Generator[None, Any, None]:
        declared, overrides = _declared_and_overrides(item)
        self._outcome, self._duration = Outcome.PASSED.value, 0.0
        try:
            yield
        finally:
            line = {"id": test_id_for(item, self.root), "outcome": self._outcome,
                    "duration_s": round(self._duration, 6), "workload": declared,
                    "overrides": overrides, "gpus": _gpus(item)}
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(line, sort_keys=True) + "\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Fold the phase reports into one outcome (:func:`fold_outcome`)."""
        self._duration += float(getattr(report, "duration", 0.0) or 0.0)
        self._outcome = fold_outcome(self._outcome, phase_outcome(report))
