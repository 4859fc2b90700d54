"""A prune holds only while the plan's tests pass: `fastci run` runs the pruned tests
after a failure (pytest here; Bazel in tests/test_run.py), and the plan carries them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from test_fast_feedback_pytest import RAN, ordered_project, run_plan

TESTS = RAN + '''
import os

def test_a():
    _ran("a")
    assert os.environ.get("BREAK_A") != "1"

def test_b():
    _ran("b")

def test_c():
    _ran("c")
    assert False

def test_d():
    _ran("d")
    assert False
'''
F = "pkg/tests/bar_test.py::"


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str,
         break_a: bool) -> tuple[int, list[str], Path]:
    root = ordered_project(tmp_path, TESTS)
    # a runs; b and c are pruned with a as their stand-in; d is not affected.
    plan = Plan("selective", tests=(PlannedTest(F + "test_a"),),
                skipped=(SkippedTest(F + "test_b", "pruned: same contexts as test_a", (F + "test_a",)),
                         SkippedTest(F + "test_c", "pruned: same contexts as test_a", (F + "test_a",)),
                         SkippedTest(F + "test_d", "not affected")))
    monkeypatch.setenv("BREAK_A", "1" if break_a else "0")
    rc, ran = run_plan(root, plan, *flags)
    return rc, ran, root


def test_pruned_tests_stay_skipped_while_the_plan_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, ran, _ = _run(tmp_path, monkeypatch, break_a=False)
    out = capsys.readouterr().out
    assert rc == 0 and ran == ["a"], out
    assert "pruned test(s)" not in out
    assert out.rstrip().splitlines()[-1] == "1 passed, 0 failed", out


def test_a_failure_runs_the_pruned_tests_and_counts_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, ran, root = _run(tmp_path, monkeypatch, break_a=True)
    out = capsys.readouterr().out
    assert rc == 1, out
    # The stand-in first, then the two pruned tests; never the unaffected one.
    assert ran[0] == "a" and sorted(ran[1:]) == ["b", "c"], out
    assert ("fastci run: 1 test(s) failed: the plan's prunes do not hold for this change; "
            "running the 2 pruned test(s) at full workload") in out
    # c fails: a failure the prune would have hidden is reported and counted.
    assert out.rstrip().splitlines()[-1] == "1 passed, 2 failed", out
    with EvidenceStore.open(root / ".fastci/evidence.db") as store:
        latest = store.latest_runs()
    assert {t: r.outcome for t, r in latest.items()} == {
        F + "test_a": "failed", F + "test_b": "passed", F + "test_c": "failed"}


def test_fail_fast_reports_the_pruned_tests_as_not_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, ran, _ = _run(tmp_path, monkeypatch, "--fail-fast", break_a=True)
    out = capsys.readouterr().out
    assert rc == 1 and ran == ["a"], out
    assert f"NOT RUN    {F}test_b (pruned; a test failed, but --fail-fast stopped the run)" in out
    assert out.rstrip().splitlines()[-1] == "0 passed, 1 failed, 2 not run", out


def test_stand_ins_survive_the_plan_file(tmp_path: Path) -> None:
    plan = Plan("selective", tests=(PlannedTest("//p:a"),),
                skipped=(SkippedTest("//p:b", "pruned: w", ("//p:a", "t.py::x")),
                         SkippedTest("//p:c", "not affected")))
    dump_plan(plan, tmp_path / "plan.json")
    text = (tmp_path / "plan.json").read_text()
    again = Plan.from_json(text)
    assert again.skipped == plan.skipped
    assert '"stand_ins"' in text and text.count('"stand_ins"') == 1  # only where there are some


def test_a_flaky_stand_in_voids_the_prunes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bazel's FLAKY (failed, then passed on a retry) counts as passed, but the stand-in
    # failed once: what it vouched for no longer holds, so the pruned tests run.
    from fastci.config import Config
    from fastci.integrations.bazel.bep import BuildReport, TestOutcome
    from fastci.run import runner

    report = BuildReport({"//p:a": TestOutcome("//p:a", "FLAKY", 2.0, False, 2)}, (), 0, "SUCCESS")
    monkeypatch.setattr(runner, "_execute", lambda *a, **k: runner.RunReport(
        ("//...",), report, mode="selective"))
    monkeypatch.setattr(runner, "current_tree", lambda root: None)
    calls: list[tuple[list[str], str]] = []

    def fake_pruned(root: Path, pruned: list[str], failed: str, *a: object,
                    **k: object) -> runner.RunReport:
        calls.append((pruned, failed))
        return runner.RunReport((), None)

    monkeypatch.setattr(runner, "_run_pruned", fake_pruned)
    plan = Plan("selective", tests=(PlannedTest("//p:a"),),
                skipped=(SkippedTest("//p:b", "pruned: same contexts as //p:a", ("//p:a",)),
                         SkippedTest("//p:c", "not affected")))
    lines: list[str] = []
    rr = runner.execute(tmp_path, plan, Config(), bazel=object(),  # type: ignore[arg-type]
                        echo=lines.append)
    assert rr.flaky == ("//p:a",) and rr.failed == 0
    assert calls == [(["//p:b"], "1 test(s) were flaky (failed, then passed: //p:a)")]
    # A plain pass keeps the prunes.
    calls.clear()
    report.outcomes["//p:a"] = TestOutcome("//p:a", "PASSED", 2.0, False, 1)
    runner.execute(tmp_path, plan, Config(), bazel=object(), echo=lines.append)  # type: ignore[arg-type]
    assert calls == []
