"""``fastci calibrate`` for pytest (issue 13 item 1): a tiny project run at each rung for real.

The project's test declares ``steps`` (full 8, floor 2); the code takes a branch only
when ``steps > 4`` and sleeps in proportion to ``steps``, so the rungs differ in what
they execute and in what they cost. One calibration is shared by the tests of this
module (each rung is two pytest processes).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from fastci.changes.versions import Versions
from fastci.cli import app
from fastci.run.collect import collect
from fastci.errors import StoreError
from plan_support import tie
from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.plan.reduce import choose
from fastci.run.calibration_runs import CalibrationError, CalibrationReport, calibrate, calibrate_with
from fastci.select import DecisionKind, DeclaredTest
from fastci.select.decisions import Decision, Reason
from calibrate_support import TRAIN_TESTS, work_source
from selection_support import Repo
from fastci.plan.inputs import Given, KnownFingerprint

# Lines 5-6 run at every rung, lines 14-15 only when steps > 4 (calibrate_support).
WORK = work_source(0.03)
TEST = TRAIN_TESTS + '''

@pytest.mark.fastci_workload(workload={"steps": 8}, floors={"steps": 9})
def test_bad_floor():
    pass


@pytest.mark.fastci_workload(workload={"steps": 8}, bogus=1)
def test_malformed():
    pass
'''
ID = "tests/test_w.py::test_train"
BRANCH = {14, 15}


class Project:
    """The tiny project, committed (calibration rungs name a commit the history holds)."""

    def __init__(self, root: Path) -> None:
        self.repo = Repo(root)
        self.root = root
        self.commit = self.repo.commit({
            "pkg/__init__.py": "", "pkg/work.py": WORK, "tests/__init__.py": "",
            "tests/test_w.py": TEST, ".gitignore": "__pycache__/\n.fastci/\n"})
        self.store = root / ".fastci" / "calibration.db"
        self.lines: list[str] = []
        self._declared: dict[str, Any] | None = None

    def declarations(self) -> dict[str, Any]:
        if self._declared is None:
            self._declared = collect(self.root, [], python=sys.executable)
        return self._declared

    def calibrate(self, tests: list[str] | None = None) -> CalibrationReport:
        decls = self.declarations()
        return calibrate(self.root, tests or [ID], decls, self.store, python=sys.executable,
                         commit=self.commit, echo=self.lines.append)

    def rungs(self) -> dict[str, Rung]:
        with CalibrationStore.open(self.store) as store:
            return {r.rung: r for r in store.rungs(ID)}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    p = Project(tmp_path_factory.mktemp("calibrate") / "repo")
    report = p.calibrate()
    assert report.ran == 3 and report.resumed == 0 and not report.failed, p.lines
    return p


def test_collect_reads_every_marker(project: Project) -> None:
    decls = project.declarations()
    train = decls[ID]
    assert isinstance(train, DeclaredTest)
    assert dict(train.workload or {}) == {"steps": 8} and dict(train.floors) == {"steps": 2}
    assert decls["tests/test_w.py::test_plain"] is None
    assert "bogus" in str(decls["tests/test_w.py::test_malformed"])
    assert isinstance(decls["tests/test_w.py::test_bad_floor"], DeclaredTest)


def test_each_rung_is_stored_with_its_cost_outcome_and_lines(project: Project) -> None:
    rungs = project.rungs()
    assert set(rungs) == {"full", "steps=2", "steps=5"}  # the floor, the midpoint
    full, floor = rungs["full"], rungs["steps=2"]
    assert full.overrides == {} and floor.overrides == {"steps": 2}
    for r in rungs.values():
        assert r.usable and r.outcome == "passed" and r.duration_s > 0 and r.gpus == 0
        assert r.commit == project.commit
        assert r.declaration == declaration_digest(project.declarations()[ID])
        assert r.digests["pkg/work.py"] == full.digests["pkg/work.py"]
        assert "pkg/work.py::prepare" in r.units and r.units["pkg/work.py::prepare"][0]
    assert floor.gpu_s < rungs["steps=5"].gpu_s < full.gpu_s  # sleeps 0.03 s per step
    # The branch runs only at steps > 4: in the full rung, not in the floor's.
    assert BRANCH <= full.lines["pkg/work.py"] and BRANCH <= rungs["steps=5"].lines["pkg/work.py"]
    assert not BRANCH & floor.lines["pkg/work.py"]
    assert {5, 6} <= floor.lines["pkg/work.py"]
    assert (13, 14) in full.arcs["pkg/work.py"] and (13, 14) not in floor.arcs["pkg/work.py"]
    assert any("steps=2: passed" in line for line in project.lines)


def test_a_second_call_resumes_and_runs_nothing(project: Project) -> None:
    before = {n: r.recorded_at for n, r in project.rungs().items()}
    project.lines.clear()
    report = project.calibrate([ID, "tests/test_w.py::test_plain",
                                "tests/test_w.py::test_bad_floor",
                                "tests/test_w.py::test_malformed"])
    assert report.ran == 0 and report.resumed == 3 and report.tests == [ID]
    assert {n: r.recorded_at for n, r in project.rungs().items()} == before
    why = dict(report.skipped)
    assert "no fastci_workload marker" in why["tests/test_w.py::test_plain"]
    assert "floor 9 is above the full value 8" in why["tests/test_w.py::test_bad_floor"]
    assert "malformed" in why["tests/test_w.py::test_malformed"]
    assert sum("resumed" in line for line in project.lines) == 3
    summary = report.summary()
    assert "0 rung(s) run, 3 resumed" in summary and "one full run" in summary
    assert report.full_gpu_s < report.cost_gpu_s


def test_choose_picks_the_floor_for_a_line_both_rungs_run(project: Project) -> None:
    decl = project.declarations()[ID]
    assert isinstance(decl, DeclaredTest)
    work = project.root / "pkg" / "work.py"

    def pick(old: str, new: str) -> Any:
        work.write_text(WORK.replace(old, new))
        reason = Reason(DecisionKind.CHANGED_UNIT, "executes a changed unit",
                        unit="pkg/work.py::" + ("prepare" if "seed" in old else "train"),
                        path="pkg/work.py")
        with CalibrationStore.open(project.store) as store:
            versions = Versions(Git(project.root), WORKTREE)
            return choose([Decision(ID, (reason,))], {ID: decl}, store, versions,
                          project.commit, history=lambda t: [])[ID]

    try:
        c = pick("base = seed * 3", "base = seed * 4")  # line 5: every rung runs it
        assert c.overrides == {"steps": 2} and c.rung == "steps=2", c.why
        assert "steps 8\u21922" in c.why
        # Line 14 runs only when steps > 4: the floor does not reach it, the midpoint
        # (steps=5) does, in the full run's context but for steps' own value.
        c = pick("total = total * 2", "total = total * 3")
        assert c.overrides == {"steps": 5} and c.rung == "steps=5", c.why
        assert "lines 14 in contexts {args(steps=8)|caller=tests/test_w.py::test_train}" in c.why
    finally:
        project.repo.git("checkout", "--", "pkg/work.py")


def test_corrupt_store_is_one_line_and_left_intact(project: Project, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cal.db"
    bad.write_bytes(b"this is not a sqlite database" * 40)
    before = bad.read_bytes()
    rc = app.main(["calibrate", ID, "--root", str(project.root), "--store", str(bad)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "calibration store" in err, err
    assert bad.read_bytes() == before
    with pytest.raises(StoreError):
        calibrate(project.root, [ID], project.declarations(), bad, python=sys.executable,
                  commit=project.commit, echo=lambda line: None)
    assert bad.read_bytes() == before


def test_unknown_test_is_one_line_and_creates_nothing(project: Project, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "new.db"
    rc = app.main(["calibrate", "tests/test_w.py::test_nope", "--root", str(project.root),
                   "--store", str(store)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "test_nope" in err, err
    assert not store.exists()
    with pytest.raises(CalibrationError):
        collect(project.root, ["tests/nowhere.py"], python=sys.executable)


def test_sqlite_garbage_row_is_not_a_crash(project: Project, tmp_path: Path) -> None:
    """A rung whose coverage blob is unreadable is not reused: calibration runs it again."""
    copy = tmp_path / "cal.db"
    with CalibrationStore.open(project.store) as src, CalibrationStore.open(copy, create=True) as dst:
        for r in src.rungs(ID):
            dst.put(r)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE rung SET coverage = X'00' WHERE rung = 'steps=5'")
    report = calibrate(project.root, [ID], project.declarations(), copy, python=sys.executable,
                       commit=project.commit, echo=lambda line: None)
    assert report.resumed == 2 and report.ran == 1 and not report.failed


def test_pytest_plan_reduces_from_the_calibrated_declaration(project: Project) -> None:
    # Issue 13 item 4: the pytest runner lists no declarations at plan time; the plan
    # takes the one the test was calibrated under, and the plugin applies the override.
    import json
    import os
    import subprocess

    from fastci.config import Config
    from fastci.evidence.record.environment import current_fingerprint
    from fastci.evidence.store.ingest import find_traces, ingest
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from fastci.plan.model import dump_plan

    root, traces = project.root, project.root.parent / "evidence-traces"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "fastci.pytest.plugin", "--fastci-record",
                          f"--fastci-trace-dir={traces}", ID], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert "1 passed" in res.stdout, res.stdout + res.stderr
    db = root.parent / "evidence.db"
    with EvidenceStore.open(db, create=True) as store:
        ingest(store, find_traces([traces]), source="pytest", commit=project.commit, root=root)
    work = root / "pkg" / "work.py"
    cfg = Config(calibration=str(project.store))
    try:
        for old, new, want in (("    base = seed * 3\n", "    base = 3 * seed\n", {"steps": 2}),
                               ("        total = total - 1\n", "        total -= 1\n", {"steps": 5})):
            work.write_text(WORK.replace(old, new))
            with EvidenceStore.open(db) as store:
                a = analyze(root, cfg, base=project.commit, declared=Given(None),
                            environment=KnownFingerprint(current_fingerprint()), store=store)
            assert a.plan.mode == "selective", a.plan.reason
            (planned,) = a.plan.tests
            assert planned.id == ID and dict(planned.overrides) == want, planned.why
            assert ID in a.choices and (a.choices[ID].reduced == bool(want))
    finally:
        work.write_text(WORK)
    # The first plan (a line every rung runs) at steps=2, applied by the pytest plugin.
    work.write_text(WORK.replace("    base = seed * 3\n", "    base = 3 * seed\n"))
    try:
        with EvidenceStore.open(db) as store:
            a = analyze(root, cfg, base=project.commit, declared=Given(None),
                        environment=KnownFingerprint(current_fingerprint()), store=store)
        plan = root.parent / "plan.json"
        dump_plan(tie(a.plan, root), plan)  # tied to the tree, as `fastci plan` does
        ran = root.parent / "plan-traces"
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-p", "fastci.pytest.plugin", f"--fastci-plan={plan}",
                              "--fastci-record", f"--fastci-trace-dir={ran}", "tests"],
                             cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        from fastci.evidence.record import trace
        (t,) = [m for m in (trace.decode(b.data) for b in find_traces([ran]))
                if m.role == "main" and m.test_id == ID]
        assert json.loads(t.overrides_json) == {"steps": 2}
    finally:
        work.write_text(WORK)


# --- Rungs left out: a smaller rung already reaches all the full run does ------------------

TWO_DIMS = DeclaredTest("t::x", 1, {"steps": 8, "layers": 4}, floors={"steps": 2, "layers": 1},
                        reference="relational")


def fake_runner(reaches_all: Any, ran: list[str], cost: Any = None, fails: Any = None) -> Any:
    """Runs nothing: each wanted rung 'executes' lines 1-3 (as the full one does) when
    ``reaches_all(overrides)``, else lines 1-2, at a cost of steps x layers (or
    ``cost(workload)``), and fails when ``fails(overrides)``."""
    def run(items: Any, wanted: Any) -> Any:
        for item in items:
            if not wanted(item):
                continue
            ran.append(item.name)
            o = {"steps": 8, "layers": 4, **item.overrides}
            lines = {1, 2, 3} if not item.overrides or reaches_all(item.overrides) else {1, 2}
            failed = fails is not None and fails(item.overrides)
            yield item, Rung(test=item.test, rung=item.name, declaration=item.declaration,
                             overrides=item.overrides, commit="c1",
                             duration_s=float(cost(o) if cost else o["steps"] * o["layers"]),
                             gpus=1, outcome="failed" if failed else "passed", complete=True,
                             recorded_at=1.0,
                             lines={"m.py": frozenset(lines)},
                             units={"m.py::f": ("x", frozenset({"fp32"}))},
                             digests={"m.py": "d" * 64}), ""
    return run


@pytest.mark.parametrize("reaches_all, learned, every_rung, want_ran, want_spared", [
    # floors reaches everything: no other reduced rung is needed.
    (lambda o: True, None, False, ["full", "floors"],
     {"steps=2": "floors", "layers=1": "floors", "steps=5": "floors", "layers=2": "floors"}),
    # ... unless asked for every rung.
    (lambda o: True, None, True,
     ["full", "floors", "layers=1", "steps=2", "layers=2", "steps=5"], {}),
    # Only the steps floor reaches everything: it stands in for the steps midpoint alone.
    (lambda o: o == {"steps": 2}, None, False,
     ["full", "floors", "layers=1", "steps=2", "layers=2"], {"steps=5": "steps=2"}),
    # A floor learned from an escape (steps must stay above 2): no rung at steps=2 stands in.
    (lambda o: True, {"steps": 2}, False, ["full", "floors", "layers=1", "steps=2", "steps=5"],
     {"layers=2": "layers=1"}),
    # Nothing smaller reaches everything: the whole ladder runs.
    (lambda o: False, None, False,
     ["full", "floors", "layers=1", "steps=2", "layers=2", "steps=5"], {}),
])
def test_rungs_a_smaller_one_stands_in_for_are_not_run(
        tmp_path: Path, reaches_all: Any, learned: Any, every_rung: bool, want_ran: list[str],
        want_spared: dict[str, str]) -> None:
    ran: list[str] = []
    lines: list[str] = []
    store = tmp_path / "cal.db"
    report = calibrate_with(["t::x"], {"t::x": TWO_DIMS}, store, fake_runner(reaches_all, ran),
                            commit="c1", echo=lines.append, every_rung=every_rung,
                            learned={"t::x": learned} if learned else None)
    assert ran == want_ran
    assert {rung: by for _t, rung, by in report.not_needed} == want_spared
    assert report.ran == len(want_ran) and len(lines) == len(want_ran) + len(want_spared)
    assert sum("not run: " in line for line in lines) == len(want_spared)
    with CalibrationStore.open(store) as cal:
        assert sorted(r.rung for r in cal.rungs("t::x")) == sorted(want_ran)
    if want_spared:
        assert f"{len(want_spared)} not needed" in report.summary()
        # Resumed: the measured rungs are reused and still stand in; nothing runs.
        again: list[str] = []
        report = calibrate_with(["t::x"], {"t::x": TWO_DIMS}, store,
                                fake_runner(reaches_all, again), commit="c1",
                                echo=lambda line: None,
                                learned={"t::x": learned} if learned else None)
        assert again == [] and report.resumed == len(want_ran)
        assert {rung: by for _t, rung, by in report.not_needed} == want_spared
    else:
        assert "not needed" not in report.summary()


def test_a_test_named_twice_is_calibrated_once(tmp_path: Path) -> None:
    ran: list[str] = []
    report = calibrate_with(["t::x", "t::x"], {"t::x": TWO_DIMS}, tmp_path / "cal.db",
                            fake_runner(lambda o: False, ran), commit="c1",
                            echo=lambda line: None)
    assert ran == ["full", "floors", "layers=1", "steps=2", "layers=2", "steps=5"]
    assert report.ran == len(ran)


def test_a_midpoint_is_not_run_when_its_floor_did_not_cut_the_cost(tmp_path: Path) -> None:
    # Fewer layers cost as much as the full workload (say, more and smaller steps): the
    # layers midpoint is not expected to be cheaper, so no plan would take it.
    def cost(o: dict[str, int]) -> int:
        return o["steps"] * 4

    ran: list[str] = []
    lines: list[str] = []
    report = calibrate_with(["t::x"], {"t::x": TWO_DIMS}, tmp_path / "cal.db",
                            fake_runner(lambda o: False, ran, cost), commit="c1",
                            echo=lines.append)
    assert ran == ["full", "floors", "layers=1", "steps=2", "steps=5"]
    assert [(rung, by) for _t, rung, by in report.not_needed] == [("layers=2", "layers=1")]
    assert any("layers=2: not run: layers=1 cost 32.0 GPU-s, no less than the full run's 32.0"
               in line for line in lines), lines
    # A floor that failed says nothing of the cost: the midpoint runs.
    ran.clear()
    report = calibrate_with(["t::x"], {"t::x": TWO_DIMS}, tmp_path / "cal2.db",
                            fake_runner(lambda o: False, ran, cost,
                                        fails=lambda o: o == {"layers": 1}),
                            commit="c1", echo=lambda line: None)
    assert "layers=2" in ran and not report.not_needed


FLAT = '''def train(steps):
    total = 0
    for i in range(steps):
        total += i
    return total + 1
'''
FLAT_TEST = '''import json
import os

import pytest

from pkg.flat import train


@pytest.mark.fastci_workload(workload={"steps": 8}, floors={"steps": 2}, reference="relational")
def test_flat():
    steps = json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}").get("steps", 8)
    assert train(steps) > 0
'''


def test_a_floor_that_runs_everything_spares_the_midpoint(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # Through the command, with real recorded runs: train runs the same lines, arcs and contexts (steps' own value
    # aside) at steps=2 as at steps=8, so the midpoint (steps=5) is not run.
    repo = Repo(tmp_path / "repo")
    repo.commit({"pkg/__init__.py": "", "pkg/flat.py": FLAT, "tests/__init__.py": "",
                 "tests/test_flat.py": FLAT_TEST, ".gitignore": "__pycache__/\n.fastci/\n"})
    store = tmp_path / "cal.db"
    test = "tests/test_flat.py::test_flat"
    rc = app.main(["calibrate", test, "--root", str(repo.root), "--store", str(store),
                   "--no-bazel"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "steps=5: not run: steps=2" in out and "1 not needed" in out, out
    with CalibrationStore.open(store) as cal:
        rungs = {r.rung: r for r in cal.rungs(test)}
    assert set(rungs) == {"full", "steps=2"}
    assert rungs["steps=2"].lines["pkg/flat.py"] == rungs["full"].lines["pkg/flat.py"]
    rc = app.main(["calibrate", test, "--root", str(repo.root), "--store", str(store),
                   "--no-bazel", "--every-rung"])
    out = capsys.readouterr().out
    assert rc == 0 and "1 rung(s) run, 2 resumed" in out, out
    with CalibrationStore.open(store) as cal:
        assert {r.rung for r in cal.rungs(test)} == {"full", "steps=2", "steps=5"}


#: ``train`` hangs below 5 steps: the floor rung (steps=2) never ends on its own.
HANGS = WORK.replace("    total = prepare(7)\n",
                     "    total = prepare(7)\n    if steps < 5:\n        time.sleep(600)\n")


def test_a_hanging_rung_times_out_and_is_stored_failed(tmp_path: Path) -> None:
    """Reported: a rung that hangs had no timeout, so ``fastci calibrate`` never ended.
    The rung is stopped at its timeout and stored as failed (never chosen)."""
    root = tmp_path / "repo"
    commit = Repo(root).commit({
        "pkg/__init__.py": "", "pkg/work.py": HANGS, "tests/__init__.py": "",
        "tests/test_w.py": TRAIN_TESTS, ".gitignore": "__pycache__/\n.fastci/\n"})
    store = root / ".fastci" / "calibration.db"
    lines: list[str] = []
    decls = collect(root, [ID], python=sys.executable)
    report = calibrate(root, [ID], decls, store, python=sys.executable, commit=commit,
                       echo=lines.append, rung_timeout_s=8.0)
    with CalibrationStore.open(store) as cal:
        rungs = {r.rung: r for r in cal.rungs(ID)}
    hung = rungs["steps=2"]
    assert rungs["full"].outcome == "passed"
    assert hung.outcome != "passed" and not hung.usable and hung.duration_s < 30
    assert any(t == ID and r == "steps=2" and "timed out after 8 s" in what
               for t, r, what in report.failed), report.failed


def test_rung_timeouts_follow_the_full_rung_within_a_floor_and_the_cap() -> None:
    from fastci.run.calibration_runs import RUNG_TIMEOUT_FLOOR_S, rung_timeout

    assert rung_timeout(None, 7200) == 7200  # the full rung: the cap
    assert rung_timeout(1.0, 7200) == RUNG_TIMEOUT_FLOOR_S
    assert rung_timeout(600.0, 7200) == 1800.0
    assert rung_timeout(3000.0, 7200) == 7200
