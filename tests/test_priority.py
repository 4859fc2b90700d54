"""Risk prioritization (issue 14 item 3): strategies and APFDc."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.select.decisions import Decision, DecisionKind, Reason
from fastci.select.priority import STRATEGIES, RiskFacts, apfdc, order, risk


def unit(test: str, n: int = 1) -> Decision:
    return Decision(test, tuple(Reason(DecisionKind.CHANGED_UNIT, f"executes u{i}", unit=f"u{i}")
                                for i in range(n)))


def test_apfdc_matches_the_textbook_values() -> None:
    cost = {"a": 1.0, "b": 1.0}
    assert apfdc(["a", "b"], cost, {"a"}) == pytest.approx(0.75)  # 1 - 1/2 + 1/4
    assert apfdc(["a", "b"], cost, {"b"}) == pytest.approx(0.25)
    # Costs count: a cheap failing test first is worth more than an expensive one.
    assert apfdc(["a", "b"], {"a": 1.0, "b": 9.0}, {"a"}) == pytest.approx(0.95)
    assert apfdc(["a", "b"], {"a": 9.0, "b": 1.0}, {"a"}) == pytest.approx(0.55)
    assert apfdc(["a", "b"], cost, set()) is None
    assert apfdc(["a"], {"a": 0.0}, {"a"}) is None


def test_apfdc_with_the_change_as_one_fault_counts_the_first_failure() -> None:
    cost = {"a": 1.0, "b": 1.0, "c": 8.0}
    # Two failing tests: per test, the later one drags the value down; as one fault,
    # only the first red test counts.
    assert apfdc(["a", "b", "c"], cost, {"a", "c"}, one_fault=True) == pytest.approx(0.95)
    assert apfdc(["a", "b", "c"], cost, {"a", "c"}) == pytest.approx((0.95 + 0.4) / 2)
    assert apfdc(["c", "a", "b"], cost, {"a", "c"}, one_fault=True) == pytest.approx(0.6)
    assert apfdc(["a", "b"], cost, set(), one_fault=True) is None


def test_line_evidence_sharpens_risk() -> None:
    """A test that ran changed lines outranks one that only entered the function, which
    falls behind everything else selected (it behaves as before the change)."""
    ran = RiskFacts(unit("//t:a"), changed_lines_ran=3)
    entered = RiskFacts(unit("//t:a"), changed_lines_ran=0)
    unknown = RiskFacts(unit("//t:a"))
    imported = RiskFacts(Decision("//t:a", (Reason(DecisionKind.IMPORTS_CHANGED_MODULE, "x"),)))
    assert risk(ran) > risk(unknown) > risk(imported) > risk(entered) > 0
    tests = [unit("//t:cheap_entered"), unit("//t:costly_ran")]
    cost = {"//t:cheap_entered": 1.0, "//t:costly_ran": 50.0}
    lines = {"//t:cheap_entered": 0, "//t:costly_ran": 5}
    got = order(tests, lambda d: RiskFacts(d, cost[d.test], changed_lines_ran=lines[d.test]),
                STRATEGIES["risk_per_cost"])
    assert [d.test for d in got] == ["//t:costly_ran", "//t:cheap_entered"]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(costs=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=8),
       data=st.data())
def test_failing_tests_first_never_scores_lower(costs: list[float], data: st.DataObject) -> None:
    tests = [f"t{i}" for i in range(len(costs))]
    cost = dict(zip(tests, costs))
    failing = set(data.draw(st.sets(st.sampled_from(tests), min_size=1)))
    shuffled = data.draw(st.permutations(tests))
    best = sorted(tests, key=lambda t: (t not in failing, cost[t]))
    got, top = apfdc(shuffled, cost, failing), apfdc(best, cost, failing)
    assert got is not None and top is not None and 0.0 <= got <= top <= 1.0


def test_risk_grows_with_directness_breadth_and_recent_failures() -> None:
    one, three = RiskFacts(unit("//t:a")), RiskFacts(unit("//t:a", 3))
    imported = RiskFacts(Decision("//t:a", (Reason(DecisionKind.IMPORTS_CHANGED_MODULE, "x"),)))
    assert risk(three) > risk(one) > risk(imported)
    failing = RiskFacts(unit("//t:a"), recent=("failed", "failed", "passed"))
    flaky = RiskFacts(unit("//t:a"), recent=("failed", "passed", "failed", "passed"))
    steady = RiskFacts(unit("//t:a"), recent=("passed",) * 4)
    assert risk(failing) > risk(flaky) > risk(steady) == risk(one)


def test_order_assigns_priorities_by_strategy() -> None:
    tests = [unit("//t:cheap"), unit("//t:broad", 4), unit("//t:costly")]
    cost = {"//t:cheap": 1.0, "//t:broad": 150.0, "//t:costly": 100.0}
    facts = {d.test: RiskFacts(d, cost[d.test]) for d in tests}
    by_risk = order(tests, lambda d: facts[d.test], STRATEGIES["risk"])
    assert [d.test for d in by_risk] == ["//t:broad", "//t:cheap", "//t:costly"]
    assert [d.priority for d in by_risk] == [1.0, pytest.approx(0.6667), pytest.approx(0.3333)]
    per_cost = order(tests, lambda d: facts[d.test], STRATEGIES["risk_per_cost"])
    assert [d.test for d in per_cost] == ["//t:cheap", "//t:broad", "//t:costly"]
    legacy = order(tests, lambda d: facts[d.test], STRATEGIES["reasons"])
    assert [d.test for d in legacy] == ["//t:cheap", "//t:costly", "//t:broad"]


def test_a_plan_lists_its_tests_in_the_configured_order(tmp_path: Any) -> None:
    from fastci.config import Config
    from fastci.evidence.store import EvidenceStore
    from fastci.plan.build import analyze
    from fastci.select import DeclaredTest
    from selection_support import MODEL, Repo, env_now, ingest, units_of

    repo = Repo(tmp_path / "repo")
    base = repo.commit({"pkg/model.py": MODEL})
    units = units_of(repo.root, ["pkg/model.py"])
    scale = {u: c for u, c in units.items() if u.endswith(("::scale", "::<module>"))}
    both = {u: c for u, c in units.items() if u.endswith(("::scale", "::shift", "::<module>"))}
    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    try:
        ingest(store, "//t:narrow", scale, commit=base, duration_s=1.0)
        ingest(store, "//t:broad", both, commit=base, duration_s=50.0)
        declared = {t: DeclaredTest(t, 1, {}) for t in ("//t:narrow", "//t:broad")}
        repo.write({"pkg/model.py": MODEL.replace("return x * 2", "return x * 3")
                    .replace("return x + HIDDEN", "return x - HIDDEN")})

        def ids(strategy: str) -> list[str]:
            plan = analyze(repo.root, Config(priority=strategy), base=base, declared=declared,
                           env_fingerprint=env_now(), store=store).plan
            return [t.id for t in plan.tests]

        assert ids("reasons") == ["//t:narrow", "//t:broad"]  # same kind: cheaper first
        assert ids("risk") == ["//t:broad", "//t:narrow"]  # two changed units beat one
    finally:
        store.close()
