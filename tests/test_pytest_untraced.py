"""pytest's assertion rewriting runs untraced while a session records, and the
evidence stays the same (fastci.pytest.untraced); FastCI's own modules
are not assertion-rewritten (fastci.pytest._not_rewritten)."""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import FrameType
from typing import Any, Iterator

import pytest

from fastci.evidence.record.files import PathMapper
from fastci.evidence.store.db import EvidenceStore
from fastci.pytest import _not_rewritten, untraced

HERE = os.path.dirname(os.path.abspath(__file__))
#: What the plug-in passes: the recorder's map of file names to repo paths.
NOTHING_MEASURED = PathMapper(Path("/nonexistent-root"), extra_roots=[]).rel
HERE_MEASURED = PathMapper(Path(HERE), extra_roots=[]).rel


def _busy(n: int) -> int:
    return sum(range(n))


@pytest.fixture
def events() -> Iterator[list[str]]:
    """Calls seen by a trace function installed for the test (restored after)."""
    seen: list[str] = []
    saved = sys.gettrace()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            seen.append(frame.f_code.co_name)
        return None

    sys.settrace(tracer)
    try:
        yield seen
    finally:
        sys.settrace(saved)


def test_the_wrapped_call_runs_untraced_and_the_tracer_comes_back(events: list[str]) -> None:
    tracer = sys.gettrace()
    wrapped = untraced.paused_tracing(_busy, NOTHING_MEASURED)
    assert wrapped(10) == 45
    assert "_busy" not in events
    assert sys.gettrace() is tracer
    _busy(3)
    assert events.count("_busy") == 1  # traced again after the wrapped call


def test_the_tracer_comes_back_when_the_call_raises(events: list[str]) -> None:
    tracer = sys.gettrace()

    def boom() -> None:
        raise SyntaxError("bad test module")

    with pytest.raises(SyntaxError):
        untraced.paused_tracing(boom, NOTHING_MEASURED)()
    assert sys.gettrace() is tracer
    assert "boom" not in events


def test_garbage_collection_is_paused_inside_and_restored_after(events: list[str]) -> None:
    seen: list[bool] = []
    wrapped = untraced.paused_tracing(lambda: seen.append(gc.isenabled()), NOTHING_MEASURED)
    assert gc.isenabled()
    wrapped()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        wrapped()
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_a_repo_signal_handler_keeps_the_call_traced(events: list[str]) -> None:
    def handler(signum: int, frame: Any) -> None:  # defined in a measured file
        pass

    saved = signal.signal(signal.SIGUSR1, handler)
    try:
        assert untraced.handler_in(HERE_MEASURED)
        untraced.paused_tracing(_busy, HERE_MEASURED)(5)
    finally:
        signal.signal(signal.SIGUSR1, saved)
    assert "_busy" in events
    assert not untraced.handler_in(HERE_MEASURED)


def test_a_handler_whose_code_cannot_be_told_counts_as_the_repo_s() -> None:
    saved = signal.signal(signal.SIGUSR1, functools.partial(lambda *a: None))
    try:
        assert untraced.handler_in(NOTHING_MEASURED)
    finally:
        signal.signal(signal.SIGUSR1, saved)


def test_nothing_changes_when_nothing_traces() -> None:
    saved = sys.gettrace()
    sys.settrace(None)
    try:
        assert untraced.paused_tracing(lambda: sys.gettrace(), NOTHING_MEASURED)() is None
    finally:
        sys.settrace(saved)


def test_install_wraps_pytest_s_rewrite_once_and_undo_restores_it() -> None:
    from _pytest.assertion import rewrite

    before = rewrite._rewrite_test
    undo = untraced.install(NOTHING_MEASURED)
    try:
        assert undo is not None
        assert rewrite._rewrite_test is not before
        assert getattr(rewrite._rewrite_test, "__wrapped__") is before
        assert untraced.install(NOTHING_MEASURED) is None  # never wrapped twice
    finally:
        if undo is not None:
            undo()
    assert rewrite._rewrite_test is before


def test_fastci_is_taken_off_pytest_s_rewrite_list(monkeypatch: pytest.MonkeyPatch) -> None:
    class AssertionRewritingHook:  # the shape pytest's hook has
        def __init__(self) -> None:
            self._must_rewrite = {"fastci", "fastci.evidence", "fastcix", "hypothesis"}

    hook = AssertionRewritingHook()
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    _not_rewritten()
    assert hook._must_rewrite == {"fastcix", "hypothesis"}


FILES = {
    "helpers.py": textwrap.dedent('''
        def table(n):
            return [i * i for i in range(n)]

        SQUARES = table(4)
        '''),
    "lib.py": textwrap.dedent('''
        def scale(x, factor=2):
            return x * factor

        def order(names):
            return sorted(names)
        '''),
    "conftest.py": textwrap.dedent('''
        import json
        import os

        import lib

        def pytest_collection_modifyitems(items):
            lib.order([i.name for i in items])

        def pytest_sessionfinish(session):
            from _pytest.assertion import rewrite
            out = os.environ.get("UNTRACED_PROBE")
            if out:
                with open(out, "w") as f:
                    json.dump({"wrapped": hasattr(rewrite._rewrite_test, "__wrapped__")}, f)
        '''),
    "test_a.py": textwrap.dedent('''
        import helpers
        import lib

        def test_scale():
            assert lib.scale(3) == 6

        def test_squares():
            assert helpers.SQUARES[-1] == 9
        '''),
    "test_b.py": textwrap.dedent('''
        import lib

        def test_float():
            assert lib.scale(1.5, factor=4) == 6.0
        '''),
    # Loaded with -p before FastCI's plug-in wraps anything: marks pytest's rewrite
    # function as already wrapped, so install() leaves it as it is (the "off" run).
    "keep_rewrite_traced.py": textwrap.dedent('''
        from _pytest.assertion import rewrite
        rewrite._rewrite_test.__fastci_untraced__ = True
        '''),
}


def _record(root: Path, name: str, *extra: str) -> tuple[EvidenceStore, bool]:
    from fastci.evidence.store.ingest import find_traces, ingest

    traces = root.parent / f"traces-{name}"
    probe = root.parent / f"probe-{name}.json"
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1", UNTRACED_PROBE=str(probe))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *extra, "-p", "fastci.pytest.plugin", "--fastci-record",
                          f"--fastci-trace-dir={traces}", "test_a.py", "test_b.py"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert "3 passed" in res.stdout, res.stdout + res.stderr
    store = EvidenceStore.open(root.parent / f"{name}.db", create=True)
    report = ingest(store, find_traces([traces]), source="pytest", commit=None, root=root)
    assert report.runs_added == 3 and not report.corrupt and not report.incomplete_tests
    return store, bool(json.loads(probe.read_text())["wrapped"])


def _evidence(store: EvidenceStore) -> dict[str, Any]:
    return {t: (store.evidence_of_test(t), sorted(store.files_of_test(t)))
            for t in store.test_ids()}


def test_recording_with_untraced_rewrites_keeps_the_evidence(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / ".git").mkdir()  # the repository root
    for rel, text in FILES.items():
        (root / rel).write_text(text)
    on, wrapped_on = _record(root, "on")
    off, wrapped_off = _record(root, "off", "-p", "keep_rewrite_traced")
    try:
        assert wrapped_on and not wrapped_off
        assert _evidence(on) == _evidence(off)
        ev = on.evidence_of_test("test_a.py::test_squares")
        # What ran while pytest imported (and rewrote) the test modules is there.
        assert {"helpers.py::<module>", "helpers.py::table", "test_a.py::<module>",
                "conftest.py::pytest_collection_modifyitems", "lib.py::order"} <= set(ev)
        assert any("factor=4" in c for c in on.units_of_test("test_b.py::test_float")["lib.py::scale"])
    finally:
        on.close()
        off.close()
