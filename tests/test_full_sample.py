"""Escapes learned from reality (issue 34 item 3): `fastci run --full-sample` re-runs a
seeded sample of the plan's reduced tests that passed at full workload, on the same tree,
and records both runs, so a full-workload failure raises the test's learned floors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci import cli
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, PlannedTest
from fastci.plan.reduce import escapes, learned_floors
from fastci.run.sample import draw, sample
from fastci.select import DeclaredTest
from test_fast_feedback_pytest import RAN, ordered_project, run_plan

TESTS = RAN + '''
import json

import pytest

FULL = {"steps": 8}


def steps():
    return {**FULL, **json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}")}["steps"]


@pytest.mark.fastci_workload(workload=FULL, floors={"steps": 2}, reference="relational")
def test_w():
    _ran(f"w{steps()}")
    # A bug that shows only past 4 steps: the reduced run at 2 steps passes.
    assert steps() <= 4 or os.environ.get("BUG") != "1"


@pytest.mark.fastci_workload(workload=FULL, floors={"steps": 2}, reference="relational")
def test_v():
    _ran(f"v{steps()}")
    assert os.environ.get("BREAK_V") != "1"
'''
F = "pkg/tests/bar_test.py::"
DECL = DeclaredTest(F + "test_w", 0, {"steps": 8}, floors={"steps": 2})


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, bug: bool = True,
         break_v: bool = False) -> tuple[int, list[str], Path]:
    root = ordered_project(tmp_path, TESTS)
    plan = Plan("selective", tests=(PlannedTest(F + "test_w", {"steps": 2}),
                                    PlannedTest(F + "test_v", {"steps": 2})))
    monkeypatch.setenv("BUG", "1" if bug else "0")
    monkeypatch.setenv("BREAK_V", "1" if break_v else "0")
    rc, ran = run_plan(root, plan, *flags)
    return rc, ran, root


def test_a_sampled_reduced_test_that_fails_at_full_workload_raises_its_floors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The reported case: a reduced pass and nothing at full workload at the same commit
    taught nothing. With the sample, the full run fails there, and the history holds an
    escape: later plans keep the test above 2 steps."""
    rc, ran, root = _run(tmp_path, monkeypatch, "--full-sample", "1")
    out = capsys.readouterr().out
    assert sorted(ran[:2]) == ["v2", "w2"] and sorted(ran[2:]) == ["v8", "w8"], out
    assert rc == 1, out  # a failure at full workload on main is a failure
    # Every sampled test has its reason, and what its full run showed.
    assert f"  SAMPLED    {F}test_w (full-workload sample: drawn " in out, out
    assert "its reduced run at steps=2 passed): running at full workload" in out
    assert (f"  {F}test_w: full-workload sample: ESCAPE: failed at full workload, passed at "
            "steps=2 on the same tree; its learned floors rise: steps > 2") in out
    assert f"  {F}test_v: full-workload sample: passed, as its reduced run at steps=2 did" in out
    assert out.rstrip().splitlines()[-1] == "3 passed, 1 failed", out
    with EvidenceStore.open(root / ".fastci/evidence.db") as store:
        history = store.runs_of_test(F + "test_w")
    found = escapes(history)
    assert [e.overrides for e in found] == [{"steps": 2}]
    assert {k: v for k, (v, _) in learned_floors(found, DECL).items()} == {"steps": 2}


def test_the_rate_comes_from_the_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FASTCI_FULL_SAMPLE", "1")
    rc, ran, _ = _run(tmp_path, monkeypatch, "--full-sample", bug=False)
    out = capsys.readouterr().out
    assert rc == 0 and sorted(ran) == ["v2", "v8", "w2", "w8"], out
    assert "full-workload sample (rate 1, seed " in out, out


def test_without_the_flag_nothing_is_sampled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FASTCI_FULL_SAMPLE", "1")  # the rate alone samples nothing: a PR job
    rc, ran, root = _run(tmp_path, monkeypatch)
    out = capsys.readouterr().out
    assert rc == 0 and sorted(ran) == ["v2", "w2"], out
    assert "full-workload sample" not in out
    with EvidenceStore.open(root / ".fastci/evidence.db") as store:
        assert escapes(store.runs_of_test(F + "test_w")) == []


def test_a_reduced_failure_is_not_rerun_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rc, ran, _ = _run(tmp_path, monkeypatch, "--full-sample", "1", bug=False, break_v=True)
    out = capsys.readouterr().out
    assert sorted(ran) == ["v2", "w2", "w8"], out
    assert (f"  SAMPLED    {F}test_v (drawn ") in out and (
        "not run at full workload: its reduced run did not pass (no escape to find)") in out
    assert rc == 1 and out.rstrip().splitlines()[-1] == "2 passed, 1 failed", out


def test_a_bad_rate_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["run", "--root", str(tmp_path), "--full-sample", "2"])
    err = capsys.readouterr().err
    assert rc != 0 and "full_sample: expected a share of tests between 0 and 1" in err, err
    assert "Traceback" not in err


def test_the_sample_is_seeded_by_the_commit() -> None:
    tests = [PlannedTest(f"//t:{i}", {"steps": 2}) for i in range(400)] + [PlannedTest("//t:full")]
    a = sample(tests, 0.1, "c" * 40)
    assert a == sample(tests, 0.1, "c" * 40)  # a rerun draws the same tests
    assert a != sample(tests, 0.1, "d" * 40)  # another commit, another sample
    assert 20 <= len(a) <= 60 and "//t:full" not in {s.test for s in a}  # reduced only
    # A test's draw does not depend on the rest of the plan.
    assert {s.test for s in sample(tests[:100], 0.1, "c" * 40)} == \
        {s.test for s in a if s.test in {t.id for t in tests[:100]}}
    assert all(0.0 <= draw("c", t.id) < 1.0 for t in tests)
    assert sample(tests, 0.0, "c") == [] and len(sample(tests, 1.0, "c")) == 400
