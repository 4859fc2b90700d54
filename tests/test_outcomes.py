"""Test outcomes are recorded as pytest reports them (issue 12 items 2 and 7).

Real inner pytest runs of a suite with every kind of outcome, through the
plugin's result lines (``--fastci-results``) and its recording mode
(``--fastci-record``), plus the one vocabulary in :mod:`fastci.types`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plan_support import tie
from fastci.plan.model import Plan, PlannedTest, SkippedTest
from fastci.types import FAILURE_OUTCOMES, OUTCOMES, Outcome, is_failure
from fastci.plan.inputs import Given, KnownFingerprint

SUITE = textwrap.dedent('''
    import sys
    import pytest

    @pytest.fixture
    def broken_setup():
        raise RuntimeError("setup fails")

    @pytest.fixture
    def broken_teardown():
        yield
        raise RuntimeError("teardown fails")

    def test_passes():
        pass

    def test_fails():
        assert 1 == 2

    @pytest.mark.skip(reason="not here")
    def test_skip_marker():
        pass

    @pytest.mark.skipif(sys.version_info > (2,), reason="py3")
    def test_skipif():
        pass

    def test_skip_call():
        pytest.skip("decided at run time")

    @pytest.mark.xfail(reason="known bug")
    def test_xfail():
        assert 1 == 2

    @pytest.mark.xfail(reason="known bug", strict=True)
    def test_xfail_strict_fails():
        assert 1 == 2

    @pytest.mark.xfail(reason="fixed?")
    def test_xpass():
        pass

    @pytest.mark.xfail(reason="fixed?", strict=True)
    def test_xpass_strict():
        pass

    @pytest.mark.xfail(run=False, reason="would hang")
    def test_xfail_not_run():
        pass

    def test_xfail_call():
        pytest.xfail("imperative")

    @pytest.mark.xfail(raises=KeyError, reason="only a KeyError is expected")
    def test_xfail_wrong_exception():
        raise ValueError("not the expected one")

    def test_setup_error(broken_setup):
        pass

    def test_teardown_error(broken_teardown):
        pass

    def test_deselected_by_plan():
        pass
''')

EXPECTED = {
    "test_passes": "passed",
    "test_fails": "failed",
    "test_skip_marker": "skipped",
    "test_skipif": "skipped",
    "test_skip_call": "skipped",
    "test_xfail": "xfailed",
    "test_xfail_strict_fails": "xfailed",
    "test_xpass": "xpassed",
    "test_xpass_strict": "failed",  # pytest: [XPASS(strict)] is a failure
    "test_xfail_not_run": "xfailed",
    "test_xfail_call": "xfailed",
    "test_xfail_wrong_exception": "failed",
    "test_setup_error": "error",
    "test_teardown_error": "error",  # passed, then its teardown failed: pytest counts an error
}

#: Records what the plugin hands the recorder (the recorder itself may narrow the label).
SPY = textwrap.dedent('''
    import json, os
    from fastci.evidence.record import recorder

    _stop = recorder.Recorder.stop

    def stop(self, outcome):
        if self.test_id:
            with open(os.environ["OUTCOME_SPY"], "a") as out:
                out.write(json.dumps([self.test_id, outcome]) + "\\n")
        return _stop(self, outcome)

    recorder.Recorder.stop = stop
''')


def _project(tmp_path: Path, conftest: str | None = None) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "test_outcomes_suite.py").write_text(SUITE)
    if conftest is not None:
        (root / "conftest.py").write_text(conftest)
    plan = Plan(mode="selective",
                tests=tuple(PlannedTest(f"test_outcomes_suite.py::{n}") for n in EXPECTED),
                skipped=(SkippedTest("test_outcomes_suite.py::test_deselected_by_plan",
                                     "not affected by the change"),))
    (root / "plan.json").write_text(
        tie(plan, root, root / "plan.json", root / "results.jsonl").to_json())
    return root


def _pytest(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "fastci.pytest_plugin", "-q", "-rA", "--fastci-plan", "plan.json",
                           *args, "test_outcomes_suite.py"],
                          cwd=root, env=base, capture_output=True, text=True, timeout=300)


def _names(pairs: list[tuple[str, str]]) -> dict[str, str]:
    out = {}
    for test_id, outcome in pairs:
        path, _, name = test_id.partition("::")
        assert path == "test_outcomes_suite.py", test_id
        assert name not in out, f"{test_id} recorded twice"
        out[name] = outcome
    return out


def _pytest_counts(stdout: str) -> dict[str, int]:
    """pytest's own final tally (``3 failed, 2 passed, ...``)."""
    last = [line for line in stdout.splitlines() if re.search(r"\d+ \w+.* in [\d.]+s", line)][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last.split(" in ")[0])}


def test_result_lines_carry_the_outcome_pytest_reports(tmp_path: Path) -> None:
    root = _project(tmp_path)
    results = root / "results.jsonl"
    res = _pytest(root, f"--fastci-results={results}")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    got = _names([(d["id"], d["outcome"]) for d in lines])
    # The deselected test did not run: it has no result at all.
    assert got == EXPECTED
    assert all(d["duration_s"] >= 0 for d in lines)
    # pytest's own tally agrees (its extra "error" is the passed test's failed teardown).
    counts = _pytest_counts(res.stdout)
    tally = {o: list(got.values()).count(o) for o in set(got.values())}
    assert counts["xfailed"] == tally["xfailed"] and counts["xpassed"] == tally["xpassed"]
    assert counts["skipped"] == tally["skipped"] and counts["failed"] == tally["failed"]
    assert counts["deselected"] == 1
    assert counts["passed"] == tally["passed"] + 1 and counts["errors"] == tally["error"]


def test_recording_hands_the_recorder_the_outcome_pytest_reports(tmp_path: Path) -> None:
    root = _project(tmp_path, conftest=SPY)
    spy = tmp_path / "spy.jsonl"
    traces = tmp_path / "traces"
    res = _pytest(root, "--fastci-record", f"--fastci-trace-dir={traces}",
                  env={"OUTCOME_SPY": str(spy)})
    assert res.returncode == 1, res.stdout + res.stderr
    got = _names([tuple(json.loads(line)) for line in spy.read_text().splitlines()])
    assert got == EXPECTED  # no run, and no trace, for the deselected test
    assert f"fastci: {len(EXPECTED)} test trace(s)" in res.stdout


def test_one_vocabulary() -> None:
    assert OUTCOMES == {"passed", "failed", "error", "skipped", "xfailed", "xpassed"}
    assert set(EXPECTED.values()) == OUTCOMES
    assert FAILURE_OUTCOMES == {"failed", "error"}
    assert [o for o in Outcome if is_failure(o)] == [Outcome.FAILED, Outcome.ERROR]
    assert not any(is_failure(o) for o in ("passed", "skipped", "xfailed", "xpassed"))
    # An outcome nobody knows (empty, misspelt, a newer writer's) is a failure: the safe side.
    for unknown in ("", "PASSED", "deselected", "timeout", "pass"):
        assert is_failure(unknown), unknown
    assert str(Outcome.XFAILED) == f"{Outcome.XFAILED}" == "xfailed"
    assert json.dumps(Outcome.XPASSED) == '"xpassed"'


@pytest.mark.parametrize("phases, folded", [
    (["passed", "passed", "passed"], "passed"),
    (["passed", "xfailed", "passed"], "xfailed"),
    (["passed", "xfailed", "error"], "error"),
    (["skipped", "passed"], "skipped"),
    (["passed", "xpassed", "passed"], "xpassed"),
    (["passed", "failed", "error"], "error"),
    (["error", "passed"], "error"),
])
def test_fold_outcome(phases: list[str], folded: str) -> None:
    from fastci.pytest.plugin import fold_outcome

    out = "passed"
    for phase in phases:
        out = fold_outcome(out, phase)
    assert out == folded


def test_the_store_and_the_plan_hold_the_outcome_pytest_reports(tmp_path: Path) -> None:
    """Issue 38 item 6: the real recorder wrote ``xfailed``/``xpassed`` as ``error``, so a
    strict xfail test was "failed in its last run" in every plan. Recorded, ingested and
    planned for real: the store holds pytest's words, and only real failures are re-run
    for having failed."""
    from fastci.config import Config
    from fastci.evidence.store.ingest import find_traces, ingest
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from fastci.select import DecisionKind
    from fastci.evidence.record.environment import current_fingerprint

    root = _project(tmp_path)
    (root / ".gitignore").write_text("plan.json\ntraces/\n.fastci/\n")
    for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm",
                                 "suite"]):
        subprocess.run(["git", "-C", str(root), *args], check=True)
    traces = root / "traces"
    res = _pytest(root, "--fastci-record", f"--fastci-trace-dir={traces}")
    assert res.returncode == 1, res.stdout + res.stderr
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with EvidenceStore.open(root / ".fastci/evidence.db", create=True) as store:
        ingest(store, find_traces([traces]), source="pytest", commit=head, root=root)
        stored = _names([(t, store.recent_outcomes([t], 1)[t][0])
                         for t in store.recent_outcomes(
                             [f"test_outcomes_suite.py::{n}" for n in EXPECTED], 1)])
        assert stored == EXPECTED
        sel = analyze(root, Config(), base=head, declared=Given(None),
                      environment=KnownFingerprint(current_fingerprint()), store=store).selection
    failed_last = {d.test.partition("::")[2] for d in sel.selected
                   if any(r.kind is DecisionKind.FAILED_LAST for r in d.reasons)}
    assert failed_last == {n for n, o in EXPECTED.items() if o in FAILURE_OUTCOMES}
    assert "test_xfail_strict_fails" not in failed_last and "test_xpass_strict" in failed_last
