"""``fastci calibrate`` with the real Bazel 4.2.3 (issue 13 items 1 and 4), end to end.

A copy of tests/bazel_fixture plus a package ``//cal`` whose gpu_test declares
``steps`` (full 8, floor 2). The code takes a branch only when ``steps > 4`` and
sleeps in proportion to ``steps``, so the rungs differ both in what they execute and
in what they cost. The module records the test's evidence, calibrates it with
Bazel (rounds of ``bazel test`` with a stand-in ``@fastci_plan``), then plans an
edit and runs the plan with ``bazel test --config=fastci``. One output base, shut
down at the end.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from fastci.cli.calibrate import gpu_tests
from fastci.config import Config
from fastci.evidence.store.calibrations import CalibrationStore
from fastci.evidence.record.environment import current_fingerprint
from fastci.evidence.fill import record_tests
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.plan_repo import write_plan_repo
from fastci.integrations.bazel.query import list_gpu_tests
from fastci.integrations.bazel.runner import Bazel
from fastci.integrations.git.tree import evidence_commit, plan_tree
from fastci.plan.planner import analyze
from fastci.plan.inputs import declared_test
from fastci.plan.inputs import Given, KnownFingerprint
from plan_support import tie
from fastci.plan.model import dump_plan
from fastci.run.calibration_runs import CalibrationError, CalibrationReport, calibrate_bazel, scrub_traces
from calibrate_support import work_source
from bazel_support import remove_tree, require_bazel

require_bazel()  # skips without bazel; fails under CI

REPO = Path(__file__).resolve().parents[1]
LABEL = "//cal:train_test"
# Lines 5-6 run at every rung, lines 14-15 only when steps > 4 (calibrate_support).
WORK = work_source(0.25)
MAIN = '''import json
import os

from cal.work import train

steps = json.loads(os.environ["FASTCI_WORKLOAD"])["steps"]
assert train(steps) > 0
'''
BUILD = '''load("@fastci//rules:defs.bzl", "gpu_test")

gpu_test(
    name = "train_test",
    srcs = ["train_test.py", "work.py"],
    gpus = 0,
    workload = {"steps": 8},
    floors = {"steps": 2},
    reference = "relational",
)
'''
USER_PLAN = '{"version": 1, "mode": "all", "reason": "the user\'s own plan"}\n'


class Ws:
    def __init__(self, root: Path, bazel: Bazel, commit: str, calibration: Path,
                 report: CalibrationReport, lines: list[str]) -> None:
        self.root, self.bazel, self.commit = root, bazel, commit
        self.calibration, self.report, self.lines = calibration, report, lines


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ws]:
    base = tmp_path_factory.mktemp("calibrate_bazel")
    root = base / "ws"
    shutil.copytree(REPO / "tests" / "bazel_fixture", root)
    (root / "WORKSPACE").write_text((root / "WORKSPACE").read_text().replace(
        'path = "../.."', f'path = "{REPO}"'))
    (root / ".bazelrc").write_text(f"import {REPO}/.bazelrc\n"
                                   f"build --repo_env=FASTCI_PYTHON={sys.executable}\n")
    (root / "cal").mkdir()
    (root / "cal" / "BUILD.bazel").write_text(BUILD)
    (root / "cal" / "work.py").write_text(WORK)
    (root / "cal" / "train_test.py").write_text(MAIN)
    (root / ".gitignore").write_text("bazel-*\n.fastci/*\n!.fastci/BUILD.bazel\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    commit = _git(root, "rev-parse", "HEAD")
    (root / ".fastci" / "plan.json").write_text(USER_PLAN)
    bazel = Bazel(root, startup=[f"--output_base={base / 'output_base'}"], python=sys.executable)
    try:
        recording = record_tests(root, [LABEL], root / ".fastci" / "evidence.db", bazel=bazel)
        assert recording.ok, recording.summary
        declared = gpu_tests(bazel, [LABEL], universe="//...")
        lines: list[str] = []
        store = root / ".fastci" / "calibration.db"
        report = calibrate_bazel(root, [LABEL], declared, store, bazel=bazel,
                                 commit=evidence_commit(root), echo=lines.append)
        yield Ws(root, bazel, commit, store, report, lines)
    finally:
        bazel.shutdown()
        remove_tree(base)


def test_every_rung_is_stored_with_its_lines_and_cost(ws: Ws) -> None:
    assert ws.report.ran == 3 and not ws.report.failed, ws.lines
    with CalibrationStore.open(ws.calibration) as store:
        rungs = {r.rung: r for r in store.rungs(LABEL)}
    assert set(rungs) == {"full", "steps=2", "steps=5"}
    for name, r in rungs.items():
        assert r.usable and r.commit == ws.commit, (name, r.outcome, r.complete)
        assert r.lines["cal/work.py"] >= {5, 6, 10, 11, 12, 13, 16}, name
        assert "cal/work.py::train" in r.units
    assert {14, 15} <= rungs["full"].lines["cal/work.py"]
    assert {14, 15} <= rungs["steps=5"].lines["cal/work.py"]
    assert not {14, 15} & rungs["steps=2"].lines["cal/work.py"]
    assert dict(rungs["steps=2"].overrides) == {"steps": 2}
    assert rungs["steps=2"].duration_s < rungs["full"].duration_s
    assert ws.lines[-1].startswith(f"calibrate [3/3] {LABEL} ")


def test_calibration_leaves_no_plan_and_no_trace_behind(ws: Ws) -> None:
    # The user's plan is untouched (the rungs' overrides went through a stand-in
    # @fastci_plan), and the rung runs' traces are gone from bazel-testlogs, so
    # `fastci ingest bazel-testlogs` cannot take them for evidence.
    assert (ws.root / ".fastci" / "plan.json").read_text() == USER_PLAN
    outputs = testlogs.test_dir(ws.root / "bazel-testlogs", LABEL) / "test.outputs"
    names = [p.name for p in outputs.rglob("*") if p.is_file()]
    if (outputs / "outputs.zip").is_file():
        with zipfile.ZipFile(outputs / "outputs.zip") as zf:
            names += zf.namelist()
    assert outputs.is_dir() and not [n for n in names if n.endswith(".trace")], names
    assert "fastci_workload.json" in names  # the last rung's other outputs stay


def test_a_second_call_resumes_and_runs_nothing(ws: Ws) -> None:
    lines: list[str] = []
    declared = gpu_tests(ws.bazel, ["//cal/..."], universe="//...")
    again = calibrate_bazel(ws.root, [LABEL], declared, ws.calibration, bazel=ws.bazel,
                            commit=evidence_commit(ws.root), echo=lines.append)
    assert (again.ran, again.resumed) == (0, 3), lines


def test_unknown_label_is_one_line(ws: Ws) -> None:
    with pytest.raises(CalibrationError, match=r"//cal:nope: not a gpu_test under //\.\.\."):
        gpu_tests(ws.bazel, ["//cal:nope"], universe="//...")


def test_plan_reduces_and_bazel_runs_the_reduced_workload(ws: Ws) -> None:
    decls = {d.id: declared_test(d) for d in list_gpu_tests(ws.bazel)}
    cfg = Config(calibration=str(ws.calibration), store=".fastci/evidence.db")
    work = ws.root / "cal" / "work.py"
    try:
        # An edit every rung runs: the floor rung reaches it the way the full run does.
        # An edit in the branch only steps > 4 runs: the midpoint rung (steps=5) reaches it.
        for old, new, want in (("    base = seed * 3\n", "    base = 3 * seed\n", {"steps": 2}),
                               ("        total = total - 1\n", "        total -= 1\n", {"steps": 5})):
            work.write_text(WORK.replace(old, new))
            with EvidenceStore.open(ws.root / ".fastci" / "evidence.db") as store:
                a = analyze(ws.root, cfg, base=ws.commit, declared=Given(decls),
                            environment=KnownFingerprint(current_fingerprint()), store=store)
            assert a.plan.mode == "selective", a.plan.reason
            # (The fixture's other gpu_tests have no evidence: they are planned too.)
            (planned,) = [t for t in a.plan.tests if t.id == LABEL]
            assert dict(planned.overrides) == want, planned.why
        work.write_text(WORK.replace("    base = seed * 3\n", "    base = 3 * seed\n"))
        with EvidenceStore.open(ws.root / ".fastci" / "evidence.db") as store:
            a = analyze(ws.root, cfg, base=ws.commit, declared=Given(decls),
                        environment=KnownFingerprint(current_fingerprint()), store=store)
        (planned,) = [t for t in a.plan.tests if t.id == LABEL]
        assert "steps 8→2" in planned.why, planned.why
        plan = ws.root / ".fastci" / "plan.json"
        dump_plan(tie(a.plan, ws.root), plan)  # tied to the tree, as `fastci plan` does
        bep = ws.root.parent / "bep.json"
        res = ws.bazel.test([LABEL], flags=["--config=fastci"], bep_path=bep)
        assert res.returncode == 0, res.stderr[-2000:]
        ran = testlogs.read_output(ws.root / "bazel-testlogs", LABEL, "fastci_workload.json")
        assert ran is not None
        assert json.loads(ran)["workload"]["steps"] == 2, ran
    finally:
        work.write_text(WORK)
        (ws.root / ".fastci" / "plan.json").write_text(USER_PLAN)


def test_a_declaration_changed_since_calibration_runs_full(ws: Ws) -> None:
    # Issue 13's safety list: reduced overrides are not applied once the test's
    # declaration changed since calibration. At plan time nothing is reduced (the BUILD
    # edit runs everything; the calibration is stale); a plan made before the edit is
    # for another tree, and the rules run the test at full workload.
    decls = {d.id: declared_test(d) for d in list_gpu_tests(ws.bazel)}
    cfg = Config(calibration=str(ws.calibration), store=".fastci/evidence.db")
    work, build = ws.root / "cal" / "work.py", ws.root / "cal" / "BUILD.bazel"
    plan = ws.root / ".fastci" / "plan.json"
    try:
        work.write_text(WORK.replace("    base = seed * 3\n", "    base = 3 * seed\n"))
        with EvidenceStore.open(ws.root / ".fastci" / "evidence.db") as store:
            before = analyze(ws.root, cfg, base=ws.commit, declared=Given(decls),
                             environment=KnownFingerprint(current_fingerprint()), store=store)
        (planned,) = [t for t in before.plan.tests if t.id == LABEL]
        assert dict(planned.overrides) == {"steps": 2}, planned.why
        tied = dataclasses.replace(before.plan, tree=plan_tree(ws.root, None))
        build.write_text(BUILD.replace('floors = {"steps": 2}', 'floors = {"steps": 3}'))
        now = {d.id: declared_test(d) for d in list_gpu_tests(ws.bazel)}
        assert now[LABEL].floors == {"steps": 3}
        with EvidenceStore.open(ws.root / ".fastci" / "evidence.db") as store:
            after = analyze(ws.root, cfg, base=ws.commit, declared=Given(now),
                            environment=KnownFingerprint(current_fingerprint()), store=store)
        (planned,) = [t for t in after.plan.tests if t.id == LABEL]
        # A BUILD file is a run-everything path by default: every test at full workload.
        # (Without it, the calibration's declaration digest no longer matches: stale.)
        assert dict(planned.overrides) == {} and LABEL not in after.choices, planned.why
        assert not any(t.overrides for t in after.plan.tests)
        # The plan made before the declaration changed, run after: full workload, because
        # it names another tree; and were it tied to this tree (hand-written, or made
        # before the build file edit and re-tied), because the rules check its overrides
        # against the declaration they see.
        for made, why in ((tied, "not for this tree"), (tie(before.plan, ws.root), "below its floor 3")):
            dump_plan(made, plan)
            res = ws.bazel.test([LABEL], flags=["--config=fastci"],
                                bep_path=ws.root.parent / "bep.json")
            assert res.returncode == 0, res.stderr[-2000:]
            ran = testlogs.read_output(ws.root / "bazel-testlogs", LABEL, "fastci_workload.json")
            assert ran is not None and json.loads(ran)["workload"]["steps"] == 8, ran
            assert why in json.loads(ran)["plan_status"], ran
    finally:
        work.write_text(WORK)
        build.write_text(BUILD)
        plan.write_text(USER_PLAN)


def test_scrub_keeps_other_outputs(tmp_path: Path) -> None:
    outputs = tmp_path / "test.outputs"
    (outputs / "fastci_traces").mkdir(parents=True)
    (outputs / "fastci_traces" / "a.1.2.trace").write_bytes(b"x")
    with zipfile.ZipFile(outputs / "outputs.zip", "w") as zf:
        zf.writestr("fastci_traces/t.9.9.trace", b"y")
        zf.writestr("metrics.json", b"{}")
    assert scrub_traces(outputs) == 2
    with zipfile.ZipFile(outputs / "outputs.zip") as zf:
        assert zf.namelist() == ["metrics.json"] and zf.read("metrics.json") == b"{}"
    assert not list(outputs.rglob("*.trace"))
    only = tmp_path / "only"
    only.mkdir()
    with zipfile.ZipFile(only / "outputs.zip", "w") as zf:
        zf.writestr("fastci_traces/t.9.9.trace", b"y")
    assert scrub_traces(only) == 1 and not (only / "outputs.zip").exists()


def test_plan_repo_is_valid_starlark_for_the_rules(tmp_path: Path) -> None:
    repo = write_plan_repo(tmp_path / "r", {"//p:t": {"steps": 2, "lr": 0.5, "name": 'a"b'}},
                           status="round 1")
    text = (repo / "plan.bzl").read_text()
    assert 'PLAN = {"ok": True, "mode": "select"' in text
    assert '"//p:t": {"steps": 2, "lr": 0.5, "name": "a\\"b"}' in text
