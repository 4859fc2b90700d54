"""End-to-end: record, change, `fastci plan`, `fastci run` with the real Bazel.

One copy of tests/selection_fixture in a temporary git repository and one Bazel
server for the whole module; the tests build on each other in order (record ->
plan -> run a passing change -> run a breaking change).
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci import cli
from fastci.plan.planner import analyze
from fastci.plan.inputs import bazel_declared
from fastci.plan.inputs import Query
from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.bazel.runner import Bazel
from fastci.integrations.git.tree import plan_tree
from fastci.evidence.fill import record
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.run.runner import RunReport, execute
from plan_support import tie
from selection_support import Repo
from bazel_support import remove_tree, require_bazel

REPO = Path(__file__).resolve().parents[1]
ALPHA, BETA = "//pkg:alpha_test", "//pkg:beta_test"

require_bazel()  # skips without bazel; fails under CI


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
                        declared=Query(lambda root, cfg: bazel_declared(root, cfg, bazel=self.bazel)),
                        store=store)
        plan = dataclasses.replace(a.plan, tree=plan_tree(self.root))  # as `fastci plan` does
        dump_plan(plan, self.root / ".fastci/plan.json")
        return plan

    def run(self, plan: Plan) -> tuple[list[str], RunReport]:
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
        remove_tree(base)


def test_record_then_nothing_changed_plans_nothing(ws: Ws) -> None:
    out = record(ws.root, ["//pkg/..."], ws.store_path, bazel=ws.bazel)
    assert out.splitlines()[0] == "2 passed, 0 failed"
    plan = ws.plan()
    assert plan.mode == "selective" and plan.tests == (), plan.reason
    assert {s.id for s in plan.skipped} == {ALPHA, BETA}
    lines, report = ws.run(plan)
    # Bazel still runs: it would run a test declared after the plan was made.
    assert "the plan selects no tests: running only tests it does not list" in lines[0]
    assert report.report is not None and set(report.report.skipped) == {ALPHA, BETA}
    assert report.warning is None and report.mode == "selective"
    assert "fastci run: 2 test(s) skipped as the plan says" in lines
    assert lines[-1] == "0 passed, 0 failed"


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


def test_planned_targets_are_the_universe_plus_planned_labels_outside_it() -> None:
    from fastci.run.runner import planned_targets

    plan = Plan(mode="selective", tests=(
        PlannedTest("//a:t"), PlannedTest("tests/x.py::test_y"), PlannedTest("//examples/llm:t"),
        PlannedTest("@//examples/llm/sub:u"), PlannedTest("//examplesx:v"), PlannedTest("//tools"),
        PlannedTest("@other//x:w")), skipped=(SkippedTest("//b:t"),))
    assert planned_targets(plan, Config()) == (["//...", "@other//x:w"], ["tests/x.py::test_y"])
    # Only labels the pattern does not name are added (a label twice would be harmless).
    assert planned_targets(plan, Config(targets="//examples/...")) == (
        ["//examples/...", "//a:t", "//examplesx:v", "//tools", "@other//x:w"], ["tests/x.py::test_y"])
    assert planned_targets(plan, Config(targets="//examples/llm:all"))[0] == [
        "//examples/llm:all", "//a:t", "@//examples/llm/sub:u", "//examplesx:v", "//tools", "@other//x:w"]
    assert planned_targets(plan, Config(targets="//tools:tools"))[0][:2] == ["//tools:tools", "//a:t"]
    assert "//tools" not in planned_targets(plan, Config(targets="//tools:tools"))[0]
    # An empty selective plan still runs the universe: the rules skip what it skips.
    assert planned_targets(Plan(mode="selective"), Config(targets="//examples/...")) == \
        (["//examples/..."], [])
    assert planned_targets(Plan.run_all("why"), Config(targets="//examples/...")) == \
        (["//examples/..."], [])


def test_run_cli_with_malformed_plan_runs_everything_loudly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".fastci").mkdir()
    (tmp_path / ".fastci/plan.json").write_text("{not json")
    (tmp_path / "WORKSPACE").write_text("")  # a Bazel workspace: Bazel is a runner here
    # A bazel that does not exist: what matters is what `fastci run` decided before running it.
    monkeypatch.setenv("FASTCI_BAZEL", str(tmp_path / "no-bazel"))
    rc = cli.main(["run", "--root", str(tmp_path), "--no-record"])
    captured = capsys.readouterr()
    assert "not valid JSON" in captured.out and "running every test at full workload" in captured.out
    assert "bazel test //... --config=fastci (plan mode all" in captured.out
    assert rc == 2 and "not found" in captured.err


def test_run_cli_with_unreadable_store_runs_without_recording_and_keeps_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".fastci").mkdir()
    store = tmp_path / ".fastci/evidence.db"
    store.write_bytes(b"not a database at all")
    (tmp_path / "WORKSPACE").write_text("")
    monkeypatch.setenv("FASTCI_BAZEL", str(tmp_path / "no-bazel"))
    rc = cli.main(["run", "--root", str(tmp_path)])
    captured = capsys.readouterr()
    assert "running the plan without recording results" in captured.out
    assert "bazel test //... --config=fastci (plan mode all" in captured.out  # no plan: everything
    assert rc == 2 and "not found" in captured.err
    assert store.read_bytes() == b"not a database at all"


def test_shadow_runs_everything_and_reports_what_the_plan_would_have_missed(ws: Ws) -> None:
    from fastci.plan.model import PlannedTest, SkippedTest

    ws.repo.write({"pkg/alpha.py": "def step(x):\n    return x + 2\n"})  # alpha_test now fails
    try:
        # A deliberately wrong plan: it would skip the failing test.
        plan = tie(Plan(mode="shadow", reason="shadow check", tests=(PlannedTest(BETA),),
                        skipped=(SkippedTest(ALPHA, "pretend: not affected"),)), ws.root)
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



def test_a_failure_runs_the_pruned_tests_through_bazel(ws: Ws) -> None:
    # A hand-written plan, tied to the tree: beta runs, alpha is pruned with beta as
    # its stand-in. While beta passes, alpha stays skipped.
    plan = tie(Plan(mode="selective", reason="prune check", tests=(PlannedTest(BETA),),
                    skipped=(SkippedTest(ALPHA, "pruned: same contexts as beta", (BETA,)),)),
               ws.root)
    lines, report = ws.run(plan)
    assert report.pruned_run is None and lines[-1] == "1 passed, 0 failed", lines
    # Plain `bazel test --config=fastci` cannot run alpha after a failure: it runs it
    # (the prune is conditional; only fastci run passes FASTCI_PRUNES=rerun).
    bep = ws.root / ".fastci/runs/bep-plain.json"
    bep.parent.mkdir(parents=True, exist_ok=True)
    ws.bazel.test(["//pkg/..."], flags=["--config=fastci"], bep_path=bep)
    assert set(parse_bep(bep).outcomes) == {ALPHA, BETA}
    original = (REPO / "tests/selection_fixture/pkg/beta.py").read_text()
    ws.repo.write({"pkg/beta.py": original.replace("return", "return 1 +", 1)})  # beta fails
    try:
        lines, report = ws.run(tie(plan, ws.root))  # the same plan, for the edited tree
        assert report.pruned_run is not None and report.pruned_run.report is not None, lines
        assert {t: o.status for t, o in report.pruned_run.report.outcomes.items()} == \
            {ALPHA: "PASSED"}, lines
        assert any(line.startswith("fastci run: 1 test(s) failed: the plan's prunes do not hold")
                   for line in lines), lines
        assert lines[-1] == "1 passed, 1 failed", lines
        with EvidenceStore.open(ws.store_path) as store:
            latest = store.latest_runs()
        assert latest[ALPHA].outcome == "passed" and latest[ALPHA].full
    finally:
        ws.repo.write({"pkg/beta.py": original})


def test_run_cli_with_a_plan_for_another_tree_runs_everything_loudly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repo(tmp_path)
    repo.commit({"m.py": "x = 1\n", "WORKSPACE": ""})  # .fastci/ (plan, runs) is never part of the tree
    tree = plan_tree(tmp_path)
    plan = Plan(mode="selective", reason="m only", tree=tree, tests=(PlannedTest("//p:m_test"),),
                skipped=(SkippedTest("//p:other_test", "not affected"),))
    dump_plan(plan, tmp_path / ".fastci/plan.json")
    monkeypatch.setenv("FASTCI_BAZEL", str(tmp_path / "no-bazel"))
    assert cli.main(["run", "--root", str(tmp_path), "--no-record"]) == 2
    out = capsys.readouterr().out
    assert "WARNING" not in out and "bazel test //... --config=fastci (1 planned, 1 skipped by the plan)" in out
    repo.write({"m.py": "x = 2\n"})  # edited after the plan was made
    assert cli.main(["run", "--root", str(tmp_path), "--no-record"]) == 2
    out = capsys.readouterr().out
    assert (f"fastci run: WARNING: plan made for tree {tree}, this tree is {plan_tree(tmp_path)}: "
            "running every test at full workload") in out
    assert "bazel test //... --config=fastci (plan mode all: stale plan: plan made for tree" in out


def test_a_test_declared_after_the_plan_was_made_is_run(ws: Ws) -> None:
    build = ws.root / "pkg/BUILD.bazel"
    original = build.read_text()
    # A hand-written plan (tied to the tree with gamma_test in it) that knows nothing of
    # gamma_test.
    ws.repo.write({"pkg/gamma_test.py": "import sys\n\nsys.exit(0)\n",
                   "pkg/BUILD.bazel": original + (
                       '\ngpu_test(\n    name = "gamma_test",\n    srcs = ["gamma_test.py"],\n'
                       '    gpus = 1,\n    workload = {"steps": 1},\n)\n')})
    plan = tie(Plan(mode="selective", reason="beta only", tests=(PlannedTest(BETA),),
                    skipped=(SkippedTest(ALPHA, "not affected"),)), ws.root)
    try:
        lines, report = ws.run(plan)
        assert report.report is not None
        assert set(report.report.outcomes) == {BETA, "//pkg:gamma_test"}
        assert report.report.skipped == (ALPHA,) and report.not_run == ()
        assert any(line.startswith("  PASSED     //pkg:gamma_test") and
                   line.endswith("(not in the plan: full workload)") for line in lines)
        assert report.warning is None
        assert lines[-1] == "2 passed, 0 failed"
    finally:
        ws.repo.write({"pkg/gamma_test.py": None, "pkg/BUILD.bazel": original})
