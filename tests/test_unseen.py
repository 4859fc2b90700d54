"""The structural safety net (fastci.select.unseen), end to end: recorded with pytest and
the real recorder, planned with the real planner.

A helper run only on a thread ``_thread.start_new_thread`` started (the stand-in for a
C callback, a library's worker pool or autograd's device threads) is absent from every
test's evidence; breaking it must still select the tests that run its module, at full
workload, with the reason. A dead-code edit in a module no test reaches selects nothing.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.analysis import Analysis
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.select import DecisionKind
from record_support import edited, plan_now, record
from selection_support import Repo, env_now, ingest, units_of

PROJECT = {
    "pkg/__init__.py": "",
    "pkg/work.py": textwrap.dedent('''
        import _thread
        import threading


        def helper(x):
            return x * 2


        def run_native(x):
            out = []
            done = threading.Event()

            def body():
                out.append(helper(x))
                done.set()

            _thread.start_new_thread(body, ())
            assert done.wait(10)
            return out[0]


        def other():
            return 1
        '''),
    "pkg/dead.py": textwrap.dedent('''
        def unused(x):
            return x + 1
        '''),
    "pkg/plain.py": textwrap.dedent('''
        def ident(x):
            return x
        '''),
    "test_work.py": textwrap.dedent('''
        from pkg.work import other, run_native

        def test_native():
            assert run_native(2) == 4

        def test_other():
            assert other() == 1
        '''),
    "test_plain.py": textwrap.dedent('''
        from pkg.plain import ident

        def test_plain():
            assert ident(3) == 3
        '''),
}
NATIVE, OTHER, PLAIN = "test_work.py::test_native", "test_work.py::test_other", \
    "test_plain.py::test_plain"


class Recorded:
    def __init__(self, root: Path, store: EvidenceStore, base: str) -> None:
        self.root, self.store, self.base = root, store, base

    def plan_after(self, rel: str, old: str, new: str) -> Analysis:
        with edited(self.root / rel, old, new):
            return plan_now(self.root, self.base, self.store)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    root = tmp_path_factory.mktemp("unseen") / "repo"
    # The safety net is for an engine that misses the native thread: coverage.py's, forced
    # here on any Python (on 3.12+ the default sys.monitoring engine records the thread:
    # tests/test_monitor.py::test_a_function_run_only_on_a_native_thread_selects_its_test).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTCI_RECORDER", "coverage")
        _, store, base = record(root, dict(PROJECT, **{".gitignore": "/.fastci/\n"}),
                                "test_work.py", "test_plain.py", passed=3)
    yield Recorded(root, store, base)
    store.close()


def test_a_function_run_only_on_a_native_thread_selects_the_tests_of_its_module(
        recorded: Recorded) -> None:
    users = recorded.store.tests_for_units(
        ["pkg/work.py::helper", "pkg/work.py::run_native.<locals>.body",
         "pkg/work.py::run_native", "pkg/work.py::other"])
    # The reported case: the tracer never saw the native thread's code...
    assert users["pkg/work.py::helper"] == set()
    assert users["pkg/work.py::run_native.<locals>.body"] == set()
    # ...while it saw the code around it.
    assert users["pkg/work.py::run_native"] == {NATIVE}
    assert users["pkg/work.py::other"] == {OTHER}
    a = recorded.plan_after("pkg/work.py", "return x * 2", "return x * 3")
    assert a.plan.mode == "selective", a.plan.reason
    chosen = {d.test: d for d in a.selection.selected}
    assert set(chosen) == {NATIVE, OTHER}  # every test that runs pkg/work.py's functions
    reason = next(r for r in chosen[NATIVE].reasons if r.kind is DecisionKind.UNSEEN_CODE)
    assert reason.unit == "pkg/work.py::helper"
    assert reason.sentence.startswith(
        "changed code no test was seen executing; the recorder may not see it (native "
        "threads, autograd device threads, compiled frames): pkg/work.py::helper")
    assert "full workload" in reason.sentence
    # Only this reason: nothing the evidence saw changed, so without the net nothing runs.
    assert {r.kind for r in chosen[NATIVE].reasons} == {DecisionKind.UNSEEN_CODE}
    test = next(t for t in a.plan.tests if t.id == NATIVE)
    assert not test.overrides


def test_a_dead_code_edit_in_a_module_no_test_reaches_selects_nothing(
        recorded: Recorded) -> None:
    assert recorded.store.tests_for_modules(["pkg/dead.py"]) == {"pkg/dead.py": set()}
    a = recorded.plan_after("pkg/dead.py", "return x + 1", "return x + 2")
    assert a.plan.mode == "selective", a.plan.reason
    assert a.selection.selected == []


def test_a_seen_function_s_change_is_not_widened_by_the_net(recorded: Recorded) -> None:
    a = recorded.plan_after("pkg/work.py", "return 1", "return 2")
    chosen = {d.test: d for d in a.selection.selected}
    assert set(chosen) == {OTHER}
    assert {r.kind for r in chosen[OTHER].reasons} == {DecisionKind.CHANGED_UNIT}


def test_a_module_whose_functions_no_test_ran_falls_back_to_its_importers(
        tmp_path: Path) -> None:
    # Module code ran at import only (a callback registered with a C library there):
    # importing is then the only reach the evidence holds.
    repo = Repo(tmp_path / "repo")
    src = "def callback(x):\n    return x\n\n\nREGISTERED = [callback]\n"
    base = repo.commit({"pkg/cb.py": src, "pkg/other.py": "def f():\n    return 1\n"})
    units = units_of(repo.root, ["pkg/cb.py", "pkg/other.py"])
    with EvidenceStore.open(tmp_path / "e.db", create=True) as store:
        ingest(store, "t_imports", {"pkg/cb.py::<module>": units["pkg/cb.py::<module>"]},
               commit=base)
        ingest(store, "t_other", {"pkg/other.py::f": units["pkg/other.py::f"]}, commit=base)
        repo.write({"pkg/cb.py": src.replace("return x", "return -x")})
        a = analyze(repo.root, Config(), base=base, declared=Given(None), environment=KnownFingerprint(env_now()),
                    store=store)
    chosen = {d.test: d for d in a.selection.selected}
    assert set(chosen) == {"t_imports"}
    (reason,) = chosen["t_imports"].reasons
    assert reason.kind is DecisionKind.UNSEEN_CODE and "imports it" in reason.sentence


def test_a_net_reason_keeps_the_full_workload_a_code_reason_alone_would_reduce(
        tmp_path: Path) -> None:
    from fastci.select.decisions import Reason
    from test_reduce import UNIT, World, full_ladder

    w = World(tmp_path)
    full_ladder(w)
    w.edit(2, "    y = x + 2")
    code = Reason(DecisionKind.CHANGED_UNIT, "executes f", unit=UNIT, path="pkg/m.py")
    assert w.choose((code,)).overrides  # a calibrated rung reaches the changed lines
    net = Reason(DecisionKind.UNSEEN_CODE, "changed code no test was seen executing",
                 unit="pkg/m.py::g", path="pkg/m.py")
    c = w.choose((code, net))
    assert c.overrides == {} and DecisionKind.UNSEEN_CODE.value in c.why
