"""The sys.monitoring recorder engine (fastci.evidence.record.monitor, Python 3.12+).

What it must do: the same evidence as the coverage.py engine (units, contexts, lines
and arcs where those are collected) in the same trace format, and code on every
thread counts — threads started before recording, ``_thread`` threads and threads
that C code starts, none of which coverage.py's ``sys.settrace`` tracer follows.
Runs in the Python 3.12 CI leg (tests/py312_leg.txt); on 3.11 only the choice of
engine is testable, and the rest says why it does not run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastci.evidence.record import monitor

NEEDS_MONITORING = pytest.mark.skipif(
    not monitor.available(),
    reason="sys.monitoring needs Python 3.12+ (the py312 CI leg runs these: make test-py312)")

WORK = textwrap.dedent('''
    import _thread
    import ctypes
    import threading
    from dataclasses import dataclass

    from fastci.evidence.record.contexts import annotate


    @dataclass
    class Cfg:
        layers: int
        name: str


    class Model:
        def __init__(self, cfg):
            self.cfg = cfg

        def forward(self, xs):
            return [helper(x) for x in xs]


    def helper(v):
        if v > 0:
            return v * 2
        return -v


    def gen(n):
        for i in range(n):
            yield i


    def called_with(kind, n=1):
        return kind * n


    def hot(i):
        return i + 1


    def in_segment():
        return 7


    def lam():
        f = lambda y: y + 1
        return f(1)


    def on_pre_thread(x):
        return x + 1


    def on_raw_thread(x):
        return x * 3


    def on_c_thread(x):
        return x - 1


    def hot_then_eval():
        for i in range(40):
            hot(i)
        with annotate(phase="eval"):
            hot(0)


    # A thread that exists before recording starts and calls on_pre_thread when told.
    GO = threading.Event()
    DONE = threading.Event()


    def _waiter():
        GO.wait()
        on_pre_thread(1)
        DONE.set()


    def start_pre_thread():
        threading.Thread(target=_waiter, daemon=True).start()


    def run_pre_thread():
        GO.set()
        assert DONE.wait(10)


    def run_raw_thread():
        """_thread.start_new_thread: no threading.Thread bootstrap, no settrace hook."""
        done = threading.Event()

        def body():
            on_raw_thread(2)
            done.set()

        _thread.start_new_thread(body, ())
        assert done.wait(10)


    def run_c_thread():
        """A thread pthread_create starts (C code), running a ctypes callback."""
        libc = ctypes.CDLL(None)
        START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)

        def body(_arg):
            on_c_thread(5)
            return None

        fn = START(body)
        tid = ctypes.c_ulong()
        libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p,
                                        START, ctypes.c_void_p]
        assert libc.pthread_create(ctypes.byref(tid), None, fn, None) == 0
        libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
        assert libc.pthread_join(tid, None) == 0


    def main_work():
        m = Model(Cfg(layers=2, name="tiny"))
        m.forward([1, -2, 3])
        list(gen(3))
        called_with("a")
        called_with(3, n=2)
        lam()
        hot_then_eval()
''')

DRIVE = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    root, out, what = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    sys.path[:0] = [str(root), sys.argv[4]]
    import pkg.work as w
    from fastci.evidence.record import trace
    from trace_support import file_units
    from fastci.evidence.record.recorder import Recorder
    w.start_pre_thread()
    rec = Recorder("t", out, repo_root=root, workload={}, gpus=0, children=False,
                   contexts=what != "nocontexts")
    rec.start()
    engine = type(rec._cov).__name__
    w.main_work()
    rec.begin_segment("seg")
    w.in_segment()
    w.helper(4)
    rec.end_segment()
    if what == "threads":
        w.run_pre_thread()
        w.run_raw_thread()
        w.run_c_thread()
    msg = trace.read(rec.stop("passed"))
    def files(fts):
        return {ft.path: {"units": {q: sorted(c) for q, _, c in file_units(msg, ft)},
                          "lines": trace.delta_decode(list(ft.line_deltas)),
                          "arcs": len(ft.arcs) // 2} for ft in fts}
    print(json.dumps({"engine": engine, "files": files(msg.files),
                      "segments": {s.key: files(s.files) for s in msg.segments},
                      "reads": sorted(r.path for r in msg.reads)}))
''')


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()  # the repository root for the path mapper
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "work.py").write_text(WORK)
    (root / "drive.py").write_text(DRIVE)
    return root


def _drive(root: Path, tmp: Path, backend: str, what: str = "main",
           lines: bool = False) -> dict[str, Any]:
    out = tmp / f"traces-{backend}-{what}-{int(lines)}"
    env = dict(os.environ, FASTCI_RECORDER=backend)
    env.pop("FASTCI_RECORD_LINES", None)
    if lines:
        env["FASTCI_RECORD_LINES"] = "1"
    res = subprocess.run([sys.executable, str(root / "drive.py"), str(root), str(out), what,
                          str(Path(__file__).resolve().parent)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    got: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def _units(got: dict[str, Any], path: str = "pkg/work.py") -> set[str]:
    return set(got["files"].get(path, {}).get("units", {}))


# --------------------------------------------------------------------------- the choice

def test_the_engine_is_chosen_in_one_place(monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    auto = "monitoring" if monitor.available() else "coverage"
    assert monitor.backend({}) == auto
    assert monitor.backend({"FASTCI_RECORDER": "auto"}) == auto
    assert monitor.backend({"FASTCI_RECORDER": "coverage"}) == "coverage"
    assert monitor.backend({"FASTCI_RECORDER": " Monitoring "}) == auto
    caplog.set_level(logging.WARNING)
    monitor._WARNED.clear()
    assert monitor.backend({"FASTCI_RECORDER": "settrace"}) == auto
    assert "FASTCI_RECORDER='settrace' is not one of auto, monitoring, coverage" in caplog.text
    monkeypatch.delattr(sys, "monitoring", raising=False)  # a Python before 3.12
    assert monitor.backend({"FASTCI_RECORDER": "monitoring"}) == "coverage"
    assert "FASTCI_RECORDER=monitoring needs Python 3.12+" in caplog.text
    with pytest.raises(monitor.MonitorUnavailable, match="no sys.monitoring"):
        monitor.acquire(None, None, lines=False, arcs=False, exact=False)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- equivalence

@NEEDS_MONITORING
def test_both_engines_record_the_same_units_and_contexts(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    mon, cov = _drive(root, tmp_path, "monitoring"), _drive(root, tmp_path, "coverage")
    assert (mon["engine"], cov["engine"]) == ("MonitorEngine", "_Coverage")
    # (The module ran, and the waiting thread started, before the recording did.)
    want = {"Model.__init__", "Model.forward", "helper", "gen", "called_with", "hot",
            "hot_then_eval", "lam", "main_work"}
    assert want <= _units(mon) and "<module>" not in _units(mon)
    assert _units(mon) == _units(cov)
    units_m, units_c = mon["files"]["pkg/work.py"]["units"], cov["files"]["pkg/work.py"]["units"]
    # Units called at most FULL_CALLS times: every call sampled by both engines.
    for q in want - {"hot"}:
        assert units_m[q] == units_c[q], q
    assert any("cfg=Cfg(layers=2,name='tiny')" in s for s in units_m["Model.__init__"])
    assert {s.split("|")[0] for s in units_m["called_with"]} == {"args(kind='a';n=1)",
                                                                 "args(kind=3;n=2)"}
    # The hot unit (41 calls): both sample its first FULL_CALLS calls. Then coverage.py's
    # engine samples calls 16 and 32 (it sees every call); sys.monitoring's sees no call
    # until a new sampling period, here the labels changing (phase=eval, call 41).
    first = {s for s in units_c["hot"] if "args(i=" in s and int(s[7:s.index(")")]) < 9}
    assert len(first) == 8 and first <= set(units_m["hot"])
    assert [s for s in units_m["hot"] if "phase=eval" in s] == [
        "args(i=0)|caller=pkg/work.py::hot_then_eval|phase=eval"]
    assert not any("phase=eval" in s for s in units_c["hot"])  # call 41: not a power of two
    # Segments: the same units, contexts and no lines (contexts mode records call events).
    assert mon["segments"] == cov["segments"]
    assert set(mon["segments"]["seg"]["pkg/work.py"]["units"]) == {"in_segment", "helper"}
    assert mon["files"]["pkg/work.py"]["lines"] == cov["files"]["pkg/work.py"]["lines"] == []
    assert mon["reads"] == cov["reads"]


@NEEDS_MONITORING
@pytest.mark.parametrize("what", ["nocontexts", "lines"])
def test_lines_where_the_coverage_engine_collects_them(tmp_path: Path, what: str) -> None:
    """Without contexts (units by line ownership) and in line mode (calibration: lines,
    arcs and contexts) both engines name the same units and executed lines."""
    root = _repo(tmp_path)
    lines = what == "lines"
    drive = "nocontexts" if what == "nocontexts" else "main"
    mon = _drive(root, tmp_path, "monitoring", drive, lines=lines)
    cov = _drive(root, tmp_path, "coverage", drive, lines=lines)
    assert _units(mon) == _units(cov)
    got_m, got_c = mon["files"]["pkg/work.py"], cov["files"]["pkg/work.py"]
    assert got_m["lines"] and set(got_m["lines"]) == set(got_c["lines"])
    if lines:  # branches taken: helper's `if` both ways, gen's loop
        assert got_m["arcs"] >= 4 and got_c["arcs"] > 0
        assert got_m["units"] == got_c["units"]
    for key in ("seg",):
        seg_m, seg_c = mon["segments"][key]["pkg/work.py"], cov["segments"][key]["pkg/work.py"]
        assert set(seg_m["units"]) == set(seg_c["units"])
        assert set(seg_m["lines"]) == set(seg_c["lines"])


# --------------------------------------------------------------------------- threads

@NEEDS_MONITORING
def test_every_thread_counts(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    mon = _drive(root, tmp_path, "monitoring", "threads")
    threaded = {"on_pre_thread", "on_raw_thread", "on_c_thread"}
    assert threaded <= _units(mon)
    # coverage.py's tracer (sys.settrace) sees none of them: why the engine exists.
    cov = _drive(root, tmp_path, "coverage", "threads")
    assert not threaded & _units(cov)


# --------------------------------------------------------------------------- tool ids

@NEEDS_MONITORING
def test_a_taken_tool_id_falls_back_to_coverage_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fastci.evidence.record.recorder import Recorder

    mon = sys.monitoring
    taken = [t for t in monitor.TOOL_IDS if mon.get_tool(t) is None]
    for t in taken:
        mon.use_tool_id(t, "someone-else")
    try:
        caplog.set_level(logging.WARNING)
        rec = Recorder("t", tmp_path / "out", repo_root=tmp_path, workload={}, gpus=0,
                       children=False)
        rec.start()
        try:
            assert type(rec._cov).__name__ == "_Coverage"
        finally:
            rec.stop("passed")
        assert "every sys.monitoring tool id FastCI may use is taken" in caplog.text
        assert "held by 'someone-else'" in caplog.text
    finally:
        for t in taken:
            mon.free_tool_id(t)
    # Free again: the next recording uses sys.monitoring and gives its id back.
    rec = Recorder("t", tmp_path / "out", repo_root=tmp_path, workload={}, gpus=0,
                   children=False)
    rec.start()
    try:
        assert type(rec._cov).__name__ == "MonitorEngine"
        assert mon.get_tool(rec._cov.tool) == monitor.TOOL_NAME
    finally:
        rec.stop("passed")
    assert all(mon.get_tool(t) is None for t in monitor.TOOL_IDS)


# --------------------------------------------------------------------------- end to end

NATIVE_LIB = '''def scale(x):
    return x * 2


def other(x):
    return x + 1
'''
NATIVE_TESTS = '''import ctypes

from lib import other, scale


def _on_c_thread(fn, arg):
    """Run fn(arg) on a thread that C code (pthread_create) starts."""
    libc = ctypes.CDLL(None)
    START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    box = []
    cb = START(lambda _p: box.append(fn(arg)))
    tid = ctypes.c_ulong()
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p,
                                    START, ctypes.c_void_p]
    assert libc.pthread_create(ctypes.byref(tid), None, cb, None) == 0
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    assert libc.pthread_join(tid, None) == 0
    return box[0]


def test_native():
    assert _on_c_thread(scale, 3) == 6


def test_plain():
    assert other(1) == 2
'''


@NEEDS_MONITORING
def test_a_function_run_only_on_a_native_thread_selects_its_test(tmp_path: Path) -> None:
    from record_support import edited, plan_now, record

    root = tmp_path / "repo"
    _repo_obj, store, base = record(root, {"lib.py": NATIVE_LIB, "test_native.py": NATIVE_TESTS},
                                    "test_native.py", passed=2)
    try:
        users = store.tests_for_units(["lib.py::scale", "lib.py::other"])
        assert users == {"lib.py::scale": {"test_native.py::test_native"},
                         "lib.py::other": {"test_native.py::test_plain"}}
        with edited(root / "lib.py", "return x * 2", "return x * 3"):
            a = plan_now(root, base, store)
        assert a.plan.mode == "selective", a.plan.reason
        assert {d.test for d in a.selection.selected} == {"test_native.py::test_native"}
    finally:
        store.close()


# --------------------------------------------------------------------------- the 3.12 leg

def test_the_py312_leg_lists_existing_modules_that_need_no_torch() -> None:
    """tests/py312_leg.txt (make test-py312) names test modules that exist, this one
    first among them, and none imports torch (the leg's venv has none)."""
    repo = Path(__file__).resolve().parents[1]
    lines = [ln.split("#", 1)[0].strip() for ln in
             (repo / "tests" / "py312_leg.txt").read_text().splitlines()]
    listed = [ln for ln in lines if ln]
    assert "tests/test_monitor.py" in listed and len(listed) == len(set(listed))
    for rel in listed:
        text = (repo / rel).read_text()
        assert not re.search(r"^\s*(import|from) torch\b|importorskip\(.torch.\)", text,
                             re.MULTILINE), rel
    assert "tests/py312_leg.txt" in (repo / "tools" / "py312_leg.sh").read_text()
    assert "make test-py312" in (repo / ".ci" / "run").read_text()
