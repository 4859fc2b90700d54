"""``fastci plan``'s summary counts a test under every reason it has (issue 11 item 6)."""

from __future__ import annotations

from fastci.plan.analysis import Analysis
from fastci.plan.summary import summarize
from fastci.plan.model import Plan
from fastci.select.decisions import Decision, DecisionKind, Reason, Selection

K = DecisionKind


def _reason(kind: DecisionKind) -> Reason:
    return Reason(kind, f"because {kind.name}")


def _summary(*decisions: Decision) -> list[str]:
    sel = Selection(tuple(decisions), summary="test")
    return summarize(Analysis(sel, Plan(mode="selective"), None, 0.0))


def test_every_reason_of_a_test_is_counted() -> None:
    lines = _summary(
        Decision("//t:a", (_reason(K.CHANGED_UNIT), _reason(K.FAILED_LAST))),
        Decision("//t:b", (_reason(K.CHANGED_UNIT), _reason(K.CHANGED_UNIT))),  # same kind twice
        Decision("//t:c", (_reason(K.NO_EVIDENCE),)),
        Decision("//t:d", (_reason(K.NOT_AFFECTED),)),
    )
    counts = {line.split(None, 1)[1]: int(line.split(None, 1)[0])
              for line in lines if line[:6].strip().isdigit()}
    assert counts == {K.CHANGED_UNIT.value: 2, K.FAILED_LAST.value: 1,
                      K.NO_EVIDENCE.value: 1, K.NOT_AFFECTED.value: 1}
    assert "  tests by reason (1 with several reasons count under each):" in lines


def test_single_reason_tests_need_no_note() -> None:
    lines = _summary(Decision("//t:a", (_reason(K.NEW_TEST),)))
    assert f"     1  {K.NEW_TEST.value}" in lines
    assert not any("several reasons" in line for line in lines)


# --- issue 12 item 7: a CPU-only suite reports its measured test time ---------------

from fastci.plan.analysis import Timing  # noqa: E402


def _timed(decisions: list[Decision], timing: dict[str, Timing],
           runner: str | None = None, why: str = "") -> list[str]:
    sel = Selection(tuple(decisions), summary="test")
    return summarize(Analysis(sel, Plan(mode="selective"), None, 0.0, runner=runner,
                              runner_why=why, timing=timing))


def _cost(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("  estimated ")]


def test_cpu_only_suite_reports_measured_test_time_not_gpu_seconds() -> None:
    lines = _timed([Decision("t.py::a", (_reason(K.CHANGED_UNIT),), 0.0),
                    Decision("t.py::b", (_reason(K.NOT_AFFECTED),), 0.0),
                    Decision("t.py::c", (_reason(K.NOT_AFFECTED),), 0.0)],
                   {"t.py::a": Timing(12.3, 0), "t.py::b": Timing(60.0, 0),
                    "t.py::c": Timing(7.8, 0)},
                   runner="pytest", why="no Bazel workspace")
    assert _cost(lines) == ["  estimated test time: 12.3 s of 80.1 s (CPU)"]
    assert "  runner: pytest (no Bazel workspace)" in lines


def test_mixed_suite_reports_gpu_seconds_and_test_time() -> None:
    lines = _timed([Decision("//g:a", (_reason(K.CHANGED_UNIT),), 20.0),
                    Decision("t.py::cpu", (_reason(K.CHANGED_UNIT),), 0.0),
                    Decision("//g:b", (_reason(K.NOT_AFFECTED),), 80.0),
                    Decision("t.py::new", (_reason(K.NEW_TEST),))],  # never ran
                   {"//g:a": Timing(10.0, 2), "t.py::cpu": Timing(1.5, 0),
                    "//g:b": Timing(20.0, 4), "t.py::new": Timing(None, 0)})
    assert _cost(lines) == [
        "  estimated GPU-seconds: 20.0 of 100.0 for all (+1 tests never timed)",
        "  estimated test time: 11.5 s of 31.5 s (GPU and CPU tests) (+1 tests never timed)"]
    assert not any(line.startswith("  runner:") for line in lines)  # the caller chose


def test_gpu_only_suite_keeps_gpu_seconds_alone() -> None:
    lines = _timed([Decision("//g:a", (_reason(K.CHANGED_UNIT),), 20.0),
                    Decision("//g:b", (_reason(K.NOT_AFFECTED),), 80.0)],
                   {"//g:a": Timing(10.0, 2), "//g:b": Timing(20.0, 4)})
    assert _cost(lines) == ["  estimated GPU-seconds: 20.0 of 100.0 for all"]


# --- issue 38 item 8: the summary says what the selection came from -------------------

from pathlib import Path  # noqa: E402

from fastci.config import Config  # noqa: E402
from fastci.evidence.store.db import EvidenceStore  # noqa: E402
from fastci.plan.planner import analyze  # noqa: E402
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.plan.reduce import Choice  # noqa: E402
from selection_support import Repo, env_now, ingest, units_of  # noqa: E402

LIB = 'def f():\n    """Doc."""\n    return 1\n\n\ndef g():\n    return 2\n'


def test_the_header_names_each_tests_own_baseline_and_docs_only_files(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    old = repo.commit({".gitignore": ".fastci/\n", "pkg/a.py": LIB, "pkg/b.py": LIB})
    store = EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True)
    units = units_of(tmp_path, ["pkg/a.py", "pkg/b.py"])
    ingest(store, "t_a", {u: c for u, c in units.items() if u.startswith("pkg/a.py")},
           commit=old)
    ingest(store, "t_b", {u: c for u, c in units.items() if u.startswith("pkg/b.py")},
           commit=old)
    # Merged since the tests were recorded: a change to what t_a runs; no re-record.
    base = repo.commit({"pkg/a.py": LIB.replace("return 1", "return 11")})
    # The change under review: docstrings only, in two files.
    repo.write({p: (tmp_path / p).read_text().replace('"""Doc."""', '"""Docs."""')
                for p in ("pkg/a.py", "pkg/b.py")})
    analysis = analyze(tmp_path, Config(), base=base, declared=Given(None), environment=KnownFingerprint(env_now()),
                       store=store)
    header = summarize(analysis)[0]
    assert [d.test for d in analysis.selection.selected] == ["t_a"]
    # Two files changed, none semantically: not "0 files".
    assert "0 units changed in 0 of 2 changed files" in header, header
    assert "comments, docstrings or formatting only" in header, header
    # The selection came from the tests' own baselines, not from --base alone.
    assert "2 tests were recorded at 1 commit other than the base" in header, header
    assert "each compared with its own (2 files changed since)" in header, header
    assert "recorded at 1 commit other than the base" in analysis.plan.reason
    store.close()


def test_the_cost_is_at_the_planned_workloads_and_reduced_tests_are_counted() -> None:
    decisions = [Decision("//g:a", (_reason(K.CHANGED_UNIT),), 100.0),
                 Decision("//g:b", (_reason(K.CHANGED_UNIT),), 50.0),
                 Decision("//g:c", (_reason(K.NOT_AFFECTED),), 40.0)]
    sel = Selection(tuple(decisions), summary="test")
    choices = {"//g:a": Choice({"steps": 2}, "reduced", est_gpu_s=10.0, rung="r1"),
               "//g:b": Choice({}, "full workload")}
    lines = summarize(Analysis(sel, Plan(mode="selective"), None, 0.0, choices=choices,
                               timing={t: Timing(1.0, 1) for t in ("//g:a", "//g:b", "//g:c")}))
    assert _cost(lines) == [
        "  estimated GPU-seconds: 60.0 of 190.0 for all (at the planned workloads; 150.0 at "
        "full workload)"]
    assert "  reduced: 1 of 2 selected tests run at a reduced workload" in lines
