"""Run history keeps the declared workload and the overrides apart (issue 9 item 13).

"Failed last" is kept per workload (a reduced pass never clears a full-workload
failure) and "modified test" compares the declaration with the workload a run
was *declared* with, never the reduced one it ran at. Selection runs on a real
store (tests/selection_support.py); ``fastci run``'s recording (``run._record``)
on a fake ``bazel-testlogs``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from fastci.integrations.bazel import bep
from fastci.errors import StoreError
from fastci.evidence.store.schema import SCHEMA, SCHEMA_VERSION
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, PlannedTest
from fastci.run.runner import _record
from fastci.select import DeclaredTest, DecisionKind, Selection
from selection_support import World, world  # noqa: F401 (fixture)
from fastci.plan.inputs import Given

A = "//t:a"
DECLARED = {"train_iters": 8, "hidden_size": 64}
REDUCED = {"train_iters": 2}


def result(w: World, outcome: str, overrides: dict[str, Any] | None) -> None:
    """Record a result of //t:a now (after every earlier one)."""
    w.store.record_result(A, outcome=outcome, duration_s=1.0, commit=w.base, gpus=1,
                          workload=DECLARED, overrides=overrides, source="bazel",
                          recorded_at=time.time())


def reasons(sel: Selection, kind: DecisionKind, test: str = A) -> list[str]:
    return [r.sentence for d in sel.decisions if d.test == test for r in d.reasons
            if r.kind == kind]


@pytest.fixture
def hist(world: World) -> World:
    """The world with //t:a declared at DECLARED, its evidence recorded at full workload."""
    world.declared[A] = DeclaredTest(A, 1, DECLARED, ())
    result(world, "passed", {})
    return world


def test_reduced_pass_does_not_clear_a_full_failure(hist: World) -> None:
    result(hist, "failed", {})
    result(hist, "passed", REDUCED)
    why = reasons(hist.plan(), DecisionKind.FAILED_LAST)
    assert why == ["its last full-workload run ended 'failed'; the later pass was at reduced "
                   "workload train_iters=2, which does not clear it"]


def test_pass_at_an_unknown_workload_does_not_clear_a_full_failure(hist: World) -> None:
    result(hist, "failed", {})
    result(hist, "passed", None)
    assert "not known to be the full one" in reasons(hist.plan(), DecisionKind.FAILED_LAST)[0]


def test_full_pass_clears_a_full_failure(hist: World) -> None:
    result(hist, "failed", {})
    result(hist, "passed", REDUCED)
    result(hist, "passed", {})
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == []


def test_reduced_failure_is_failed_last_and_says_its_workload(hist: World) -> None:
    result(hist, "failed", REDUCED)
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == [
        "its last run ended 'failed' at reduced workload train_iters=2"]


def test_full_failure_says_full_workload(hist: World) -> None:
    result(hist, "failed", {})
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == [
        "its last run ended 'failed' at full workload"]


def test_reduced_run_is_not_a_modified_test(hist: World) -> None:
    result(hist, "passed", REDUCED)
    sel = hist.plan()
    assert reasons(sel, DecisionKind.MODIFIED_TEST) == []
    assert A not in {d.test for d in sel.selected}


def test_declared_workload_change_is_a_modified_test(hist: World) -> None:
    result(hist, "passed", REDUCED)
    hist.declared[A] = DeclaredTest(A, 1, {**DECLARED, "train_iters": 16}, ())
    assert reasons(hist.plan(), DecisionKind.MODIFIED_TEST) == [
        "its declared workload differs from the one declared at its last run (train_iters)"]


def test_old_store_is_refused_and_the_plan_widens(tmp_path: Path, world: World) -> None:
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)  # a version-1 store (WAL, as FastCI made it): no run.overrides
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA.replace("    overrides TEXT,", "")
                       + "INSERT INTO meta VALUES ('schema_version', '1');")
    conn.close()
    before = old.read_bytes()
    with pytest.raises(StoreError, match=f"schema version 1, this FastCI needs {SCHEMA_VERSION}"):
        EvidenceStore.open(old)
    assert old.read_bytes() == before
    world.store.close()
    (world.root / ".fastci" / "evidence.db").unlink()
    for suffix in ("-wal", "-shm"):
        (world.root / ".fastci" / f"evidence.db{suffix}").unlink(missing_ok=True)
    (world.root / ".fastci" / "evidence.db").write_bytes(before)
    from fastci.plan.planner import analyze
    from fastci.config import Config

    a = analyze(world.root, Config(), base=world.base, declared=Given(world.declared))
    assert a.plan.mode == "all" and "schema version 1" in a.plan.reason
    world.store = EvidenceStore.open(tmp_path / "fresh.db", create=True)  # for the teardown


# --- fastci run's recording ----------------------------------------------------------------

class FakeBazel:
    def __init__(self, testlogs: Path) -> None:
        self.testlogs = testlogs

    def info(self, key: str) -> str:
        assert key == "bazel-testlogs"
        return str(self.testlogs)


def bazel_run(w: World, tmp_path: Path, files: dict[str, dict[str, Any]],
              plan: Plan | None, status: str = "PASSED") -> None:
    testlogs = tmp_path / "testlogs"
    outcomes = {}
    for label, info in files.items():
        out = testlogs / label[2:].replace(":", "/") / "test.outputs"
        out.mkdir(parents=True, exist_ok=True)
        (out / "fastci_workload.json").write_text(json.dumps(info))
        outcomes[label] = bep.TestOutcome(label, status, 1.0, False, 1)
    report = bep.BuildReport(outcomes, (), 0, "SUCCESS")
    assert _record(w.root, report, w.store, FakeBazel(testlogs), plan) == len(files)  # type: ignore[arg-type]


def launched(workload: dict[str, Any], mode: str = "fastci", **extra: Any) -> dict[str, Any]:
    return {"test": A, "mode": mode, "workload": workload, "gpus": 1, "devices": [],
            "plan_status": "ok: selective plan, 1 tests, 0 skipped", **extra}


@pytest.mark.parametrize("plan_id", [A, "@//t:a"])  # Bazel normalizes the plan's labels
def test_record_reduced_run_under_a_plan(hist: World, tmp_path: Path, plan_id: str) -> None:
    # fastci_workload.json (today) has only the effective workload: the plan says
    # which dims were reduced, the store's last declared run what they replaced.
    plan = Plan(mode="selective", tests=(PlannedTest(plan_id, REDUCED),))
    bazel_run(hist, tmp_path, {A: launched({**DECLARED, **REDUCED})}, plan)
    last = hist.store.latest_runs()[A]
    assert (dict(last.workload), last.overrides, last.full) == (DECLARED, REDUCED, False)
    assert last.last_full is not None and last.last_full.outcome == "passed"
    assert reasons(hist.plan(), DecisionKind.MODIFIED_TEST) == []


def test_record_uses_declared_and_overrides_from_the_launcher(hist: World, tmp_path: Path) -> None:
    info = launched({**DECLARED, **REDUCED}, declared=DECLARED, overrides=REDUCED)
    bazel_run(hist, tmp_path, {A: info}, None, status="FAILED")
    last = hist.store.latest_runs()[A]
    assert (dict(last.workload), last.overrides, last.outcome) == (DECLARED, REDUCED, "failed")


@pytest.mark.parametrize("mode, plan, status", [
    ("full", None, ""),  # plain bazel test: the declared workload as it is
    ("fastci", Plan(mode="selective", tests=(PlannedTest(A),)), ""),  # planned, no overrides
    ("fastci", Plan(mode="selective", tests=(PlannedTest(A, REDUCED),)),
     "ok: selective plan; overrides ignored (x): runs at full workload"),
    ("fastci", Plan.run_all("everything"), ""),
])
def test_record_full_runs(hist: World, tmp_path: Path, mode: str, plan: Plan | None,
                          status: str) -> None:
    info = launched(dict(DECLARED), mode)
    if status:
        info["plan_status"] = status
    bazel_run(hist, tmp_path, {A: info}, plan)
    last = hist.store.latest_runs()[A]
    assert (dict(last.workload), last.overrides, last.full) == (DECLARED, {}, True)


def test_record_without_plan_or_declared_is_not_known(hist: World, tmp_path: Path) -> None:
    bazel_run(hist, tmp_path, {A: launched({**DECLARED, **REDUCED})}, None)
    last = hist.store.latest_runs()[A]
    assert (dict(last.workload), last.overrides) == ({**DECLARED, **REDUCED}, None)


# Issue 34 item 5: history by git ancestry, not by the clock.

def at(w: World, commit: str, outcome: str, when: float) -> None:
    w.store.record_result(A, outcome=outcome, duration_s=1.0, commit=commit, gpus=1,
                          workload=DECLARED, overrides={}, source="bazel", recorded_at=when)


def test_a_retried_older_commit_that_passes_does_not_hide_a_newer_failure(hist: World) -> None:
    # Two CI jobs merged: C1 (a child of base) failed; a retried job of base, recorded
    # later by the clock, passed. Ordered by the clock the pass was "last" and a was skipped.
    c1 = hist.repo.commit({"README.md": "r2\n"})
    now = time.time()
    at(hist, c1, "failed", now)
    at(hist, hist.base, "passed", now + 60)
    why = reasons(hist.plan(), DecisionKind.FAILED_LAST)
    assert why == [f"it ended 'failed' at {c1[:10]}; no pass at that commit or a descendant "
                   f"clears it (its newest run passed at {hist.base[:10]}, not a descendant)"]
    # A pass at a descendant of C1 clears it, whatever the clock says.
    c2 = hist.repo.commit({"README.md": "r3\n"})
    at(hist, c2, "passed", now - 600)
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == []


def test_a_pass_on_another_branch_does_not_clear_a_failure(hist: World) -> None:
    c1 = hist.repo.commit({"README.md": "r2\n"})
    hist.repo.git("checkout", "-q", "-b", "side", hist.base)
    side = hist.repo.commit({"docs/x.md": "side\n"})
    now = time.time()
    at(hist, c1, "failed", now)
    at(hist, side, "passed", now + 60)
    assert len(reasons(hist.plan(), DecisionKind.FAILED_LAST)) == 1
    # The same commit retried after the failure (a flaky failure, then a pass) clears it.
    at(hist, c1, "passed", now + 120)
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == []


def test_without_an_answer_from_git_the_failure_stands(hist: World) -> None:
    # A commit the repository does not hold (another clone's, a shallow history).
    unknown, other = "1" * 40, "2" * 40
    now = time.time()
    at(hist, unknown, "failed", now)
    at(hist, other, "passed", now + 60)
    assert reasons(hist.plan(), DecisionKind.FAILED_LAST) == [
        f"it ended 'failed' at {unknown[:10]}; no pass at that commit or a descendant clears it "
        f"(its newest run passed at {other[:10]}, and git could not tell their ancestry)"]


def test_a_reduced_pass_at_a_descendant_does_not_clear_a_full_failure() -> None:
    from fastci.evidence.store.db import HistoryRun
    from fastci.select.history import uncleared

    parents = {"c2": ("c1",), "c1": ("c0",), "c0": ()}
    failed = HistoryRun("failed", "c1", True, 1.0)
    reduced = HistoryRun("passed", "c2", False, 2.0)
    assert uncleared([reduced, failed], parents) is failed
    full = HistoryRun("passed", "c2", True, 0.5)  # older by the clock, still a descendant
    assert uncleared([reduced, failed, full], parents) is None
    # A skipped run is no pass; a failure without a commit is cleared by a later pass.
    assert uncleared([HistoryRun("skipped", "c2", True, 2.0), failed], parents) is failed
    assert uncleared([HistoryRun("passed", None, True, 2.0),
                      HistoryRun("failed", None, True, 1.0)], {}) is None
