"""End-to-end: record, change, `fastci plan`, `fastci run` with the real Bazel.

One copy of tests/selection_fixture in a temporary git repository and one Bazel
server for the whole module; the tests build on each other in order (record ->
plan -> run a passing change -> run a breaking change).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci import cli
from fastci.analyze import analyze, bazel_declared
from fastci.bazel.runner import Bazel
from fastci.commands.record import record
from fastci.config import Config
from fastci.evidence.store import EvidenceStore
from fastci.plan import Plan, dump_plan
from fastci.run import execute
from selection_support import Repo

REPO = Path(__file__).resolve().parents[1]
ALPHA, BETA = "//pkg:alpha_test", "//pkg:beta_test"

pytestmark = pytest.mark.skipif(shutil.which("bazel") is None, reason="bazel is installed by `make setup`")


class Ws:
    def __init__(self, base: Path) -> None:
        self.root = base / "ws"
        shutil.copytree(REPO / "tests" / "selection_fixture", self.root)
        ws = self.root / "WORKSPACE"
        ws.write_text(ws.read_text().replace('path = "../.."', f'path = "{REPO}"'))
        (self.root / ".bazelrc").write_text(
            f"import {REPO}/.bazelrc\nbuild --repo_env=FASTCI_PYTHON={sys.executable}\n")
        (self.root / ".gitignore").write_text("/bazel-*\n/.fastci/evidence.db*\n/.fastci/runs/\n"
                                              "/.fastci/plan.json\n__pycache__/\n")
        self.repo = Repo(self.root)
        self.base = self.repo.commit()
        self.bazel = Bazel(self.root, startup=[f"--output_base={base / 'out'}"],
                           python=sys.executable)
        self.config = Config(targets="//pkg/...")
        self.store_path = self.root / ".fastci/evidence.db"

    def plan(self) -> Plan:
        with EvidenceStore.open(self.store_path) as store:
            a = analyze(self.root, self.config, base=self.base,
                        declared=lambda root, cfg: bazel_declared(root, cfg, bazel=self.bazel),
                        store=store)
        dump_plan(a.plan, self.root / ".fastci/plan.json")
        return a.plan

    def run(self, plan: Plan) -> tuple[list[str], object]:
        lines: list[str] = []
        with EvidenceStore.open(self.store_path) as store:
            report = execute(self.root, plan, self.config, store=store, bazel=self.bazel,
                             echo=lines.append)
        return lines, report


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ws]:
    base = tmp_path_factory.mktemp("run")
    w = Ws(base)
    try:
        yield w
    finally:
        w.bazel.shutdown()
        subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_record_then_nothing_changed_plans_nothing(ws: Ws) -> None:
    out = record(ws.root, ["//pkg/..."], ws.store_path, bazel=ws.bazel)
    assert out.splitlines()[0] == "2 passed, 0 failed"
    plan = ws.plan()
    assert plan.mode == "selective" and plan.tests == (), plan.reason
    assert {s.id for s in plan.skipped} == {ALPHA, BETA}
    lines, report = ws.run(plan)
    assert "the plan selects no tests: nothing to run" in lines[0] and lines[-1] == "0 passed, 0 failed"


def test_change_runs_only_the_affected_test_and_records_it(ws: Ws) -> None:
    ws.repo.write({"pkg/beta.py": '"""Changed."""\n\n\ndef twice(x):\n    return x + x\n'})
    plan = ws.plan()
    assert [t.id for t in plan.tests] == [BETA] and [s.id for s in plan.skipped] == [ALPHA]
    assert plan.tests[0].est_gpu_s is not None and "pkg/beta.py::twice" in plan.tests[0].why
    lines, report = ws.run(plan)
    assert lines[-1] == "1 passed, 0 failed"
    with EvidenceStore.open(ws.store_path) as store:
        runs = store.runs_of_test(BETA)
    assert len(runs) == 2 and runs[-1].outcome == "passed" and runs[-1].gpus == 2


def test_breaking_change_is_planned_and_fails(ws: Ws, capsys: pytest.CaptureFixture[str]) -> None:
    ws.repo.write({"pkg/alpha.py": "def step(x):\n    return x + 2\n"})
    plan = ws.plan()
    assert {t.id for t in plan.tests} == {ALPHA, BETA}
    lines, report = ws.run(plan)
    assert lines[-1] == "1 passed, 1 failed"
    with EvidenceStore.open(ws.store_path) as store:
        assert store.latest_runs()[ALPHA].outcome == "failed"
    # The failure is remembered: with the breaking edit reverted, alpha still runs (failed last).
    ws.repo.write({"pkg/alpha.py": (REPO / "tests/selection_fixture/pkg/alpha.py").read_text()})
    plan = ws.plan()
    assert ALPHA in {t.id for t in plan.tests}
    assert "failed" in next(t.why for t in plan.tests if t.id == ALPHA)


def test_planned_targets_and_empty_plan_without_bazel(tmp_path: Path) -> None:
    from fastci.plan import PlannedTest
    from fastci.run import planned_targets

    plan = Plan(mode="selective", tests=(PlannedTest("//a:t"), PlannedTest("tests/x.py::test_y")))
    assert planned_targets(plan, Config()) == (["//a:t"], ["tests/x.py::test_y"])
    assert planned_targets(Plan.run_all("why"), Config(targets="//examples/...")) == \
        (["//examples/..."], [])
    lines: list[str] = []
    report = execute(tmp_path, Plan(mode="selective"), Config(), bazel=None, echo=lines.append)
    assert lines == ["fastci run: the plan selects no tests: nothing to run", "0 passed, 0 failed"]
    assert report.failed == 0


def test_run_cli_with_malformed_plan_runs_everything_loudly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".fastci").mkdir()
    (tmp_path / ".fastci/plan.json").write_text("{not json")
    # A bazel that does not exist: what matters is what `fastci run` decided before running it.
    monkeypatch.setenv("FASTCI_BAZEL", str(tmp_path / "no-bazel"))
    rc = cli.main(["run", "--root", str(tmp_path), "--no-record"])
    captured = capsys.readouterr()
    assert "not valid JSON" in captured.out and "running every test at full workload" in captured.out
    assert "bazel test 1 target(s)" in captured.out
    assert rc == 2 and "not found" in captured.err


def test_run_cli_with_unreadable_store_runs_without_recording_and_keeps_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".fastci").mkdir()
    store = tmp_path / ".fastci/evidence.db"
    store.write_bytes(b"not a database at all")
    monkeypatch.setenv("FASTCI_BAZEL", str(tmp_path / "no-bazel"))
    rc = cli.main(["run", "--root", str(tmp_path)])
    captured = capsys.readouterr()
    assert "running the plan without recording results" in captured.out
    assert "bazel test 1 target(s)" in captured.out  # no plan file: everything runs
    assert rc == 2 and "not found" in captured.err
    assert store.read_bytes() == b"not a database at all"


def test_shadow_runs_everything_and_reports_what_the_plan_would_have_missed(ws: Ws) -> None:
    from fastci.plan import PlannedTest, SkippedTest

    ws.repo.write({"pkg/alpha.py": "def step(x):\n    return x + 2\n"})  # alpha_test now fails
    try:
        # A deliberately wrong plan: it would skip the failing test.
        plan = Plan(mode="shadow", reason="shadow check", tests=(PlannedTest(BETA),),
                    skipped=(SkippedTest(ALPHA, "pretend: not affected"),))
        lines, report = ws.run(plan)
        assert set(report.report.outcomes) == {ALPHA, BETA}  # type: ignore[attr-defined]
        assert report.misses == ((ALPHA, "pretend: not affected"),)  # type: ignore[attr-defined]
        assert any(line.startswith("fastci shadow: MISSES: 1 of the 1") for line in lines)
        assert f"  MISSED     {ALPHA} (the plan said: pretend: not affected)" in lines
        assert lines[-1] == "1 passed, 1 failed"
        reports = sorted((ws.root / ".fastci/runs").glob("miss-report-*.json"))
        assert reports and '"id": "//pkg:alpha_test"' in reports[-1].read_text()
    finally:
        ws.repo.write({"pkg/alpha.py": (REPO / "tests/selection_fixture/pkg/alpha.py").read_text()})

