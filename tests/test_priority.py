"""Risk prioritization (issue 14 item 3): strategies and APFDc."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.select.decisions import Decision, DecisionKind, Reason
from fastci.select.priority import (STRATEGIES, RiskFacts, apfdc, input_rarity, input_tokens,
                                    order, risk)
from fastci.plan.inputs import Given, KnownFingerprint


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
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from fastci.select import DeclaredTest
    from selection_support import MODEL, env_now, ingest, model_repo

    repo, base, units = model_repo(tmp_path / "repo")
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
            plan = analyze(repo.root, Config(priority=strategy), base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store).plan
            return [t.id for t in plan.tests]

        assert ids("reasons") == ["//t:narrow", "//t:broad"]  # same kind: cheaper first
        assert ids("risk") == ["//t:broad", "//t:narrow"]  # two changed units beat one
    finally:
        store.close()


def test_input_tokens_read_nested_values_and_blank_per_call_data() -> None:
    contexts = ["args(x=T(f32,3d,cpu,s);pos=0;cfg=Cfg(tp=2,layers=4))|caller=m.py::step|grad=1",
                "args(x=T(f32,3d,cpu,s);pos=17;cfg=Cfg(tp=2,layers=4))|caller=m.py::step|grad=1"]
    got = input_tokens(contexts)
    assert {"x=T(f32,3d,cpu,s)", "tp=2", "layers=4", "caller=m.py::step", "grad=1"} <= got
    # pos takes two values within this one run: per-call data, not an input.
    assert "pos=#" in got and not any(t.startswith("pos=0") or t == "pos=17" for t in got)
    assert input_tokens([]) == frozenset()


def test_input_rarity_weighs_what_few_tests_give_the_changed_unit() -> None:
    common = frozenset({"cache=None", "tp=1"})
    facts = [RiskFacts(unit(f"//t:{i}"), inputs={"u0": common}) for i in range(3)]
    odd = RiskFacts(unit("//t:decode"), inputs={"u0": frozenset({"cache=KVCache", "tp=1"})})
    blind = RiskFacts(unit("//t:blind"))  # no contexts known: no rarity, not an error
    got = input_rarity([*facts, odd, blind])
    assert got[:3] == [pytest.approx(got[0])] * 3
    # tp=1 is everyone's input (weight 0); cache=None is 3 of 4, cache=KVCache 1 of 4.
    assert got[3] == pytest.approx(math.log(4 / 1)) and got[0] == pytest.approx(math.log(4 / 3))
    assert got[4] == 0.0
    # Several changed units add up.
    two = [RiskFacts(unit("//t:a"), inputs={"u0": frozenset({"a"}), "u1": frozenset({"b"})}),
           RiskFacts(unit("//t:b"), inputs={"u0": frozenset({"c"}), "u1": frozenset({"b"})})]
    assert input_rarity(two) == [pytest.approx(math.log(2)), pytest.approx(math.log(2))]


def test_rare_inputs_runs_the_test_on_the_unusual_path_first() -> None:
    """Many tests drive the changed unit the common way, one through a path no other
    takes: that one runs first though it costs 4x as much (per square root of cost), not
    at 30x; history and directness still count."""
    tests = [unit(f"//t:common{i}") for i in range(4)] + [unit("//t:decode")]
    inputs = {d.test: {"u0": frozenset({"q_offset=0", "cache=None"})} for d in tests}
    inputs["//t:decode"] = {"u0": frozenset({"q_offset=0", "cache=None", "cache=KVCache(length=#)"})}
    cost = {d.test: 1.0 for d in tests} | {"//t:decode": 4.0}
    got = order(tests, lambda d: RiskFacts(d, cost[d.test], inputs=inputs[d.test]),
                STRATEGIES["rare_inputs"])
    assert got[0].test == "//t:decode"
    assert [d.test for d in got[1:]] == [f"//t:common{i}" for i in range(4)]  # ties: by id
    # (0.6 + log 5) / sqrt(30) < (0.6 + log 5/4) / 1: at 30x the cost it runs last.
    costly = {**cost, "//t:decode": 30.0}
    got = order(tests, lambda d: RiskFacts(d, costly[d.test], inputs=inputs[d.test]),
                STRATEGIES["rare_inputs"])
    assert got[-1].test == "//t:decode"
    # Without contexts the strategy is risk's order (cheaper first among equals).
    plain = order(tests, lambda d: RiskFacts(d, cost[d.test]), STRATEGIES["rare_inputs"])
    assert plain[-1].test == "//t:decode"
    # The test's own state comes first: a test that failed last time, then one the
    # change edits, lead an unusual input; recent failures add to the risk.
    failed = Decision("//t:common3", (Reason(DecisionKind.FAILED_LAST, "failed"),
                                      *unit("//t:common3").reasons))
    edited = Decision("//t:common2", (Reason(DecisionKind.MODIFIED_TEST, "edited"),
                                      *unit("//t:common2").reasons))
    swapped = [failed if d.test == "//t:common3" else edited if d.test == "//t:common2" else d
               for d in tests]
    got = order(swapped, lambda d: RiskFacts(d, cost[d.test], inputs=inputs[d.test]),
                STRATEGIES["rare_inputs"])
    assert [d.test for d in got[:3]] == ["//t:common3", "//t:common2", "//t:decode"]
    recent = {d.test: ("failed", "failed") if d.test == "//t:common0" else () for d in tests}
    got = order(tests, lambda d: RiskFacts(d, cost[d.test], recent[d.test], inputs=inputs[d.test]),
                STRATEGIES["rare_inputs"])
    assert [d.test for d in got[:2]] == ["//t:decode", "//t:common0"]


def test_a_plan_orders_by_rare_inputs_from_the_stores_contexts(tmp_path: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from fastci.config import Config
    from fastci.plan import prioritize
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from fastci.select import DeclaredTest
    from selection_support import MODEL, env_now, ingest, model_repo

    repo, base, scale = model_repo(tmp_path / "repo", "::scale", "::<module>")
    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    try:
        common = ("args(x=int;mode='train')|caller=pkg/model.py::<module>",)
        for t in ("//t:a", "//t:b", "//t:c"):
            ingest(store, t, scale, commit=base, duration_s=1.0, contexts=common)
        ingest(store, "//t:z_odd", scale, commit=base, duration_s=20.0,
               contexts=common + ("args(x=float;mode='eval')|caller=pkg/model.py::<module>",))
        declared = {t: DeclaredTest(t, 1, {}) for t in ("//t:a", "//t:b", "//t:c", "//t:z_odd")}
        repo.write({"pkg/model.py": MODEL.replace("return x * 2", "return x * 3")})

        def ids(strategy: str) -> list[str]:
            plan = analyze(repo.root, Config(priority=strategy), base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store).plan
            return [t.id for t in plan.tests]

        assert ids("reasons")[-1] == "//t:z_odd"  # same kind: cheaper first
        assert ids("rare_inputs") == ["//t:z_odd", "//t:a", "//t:b", "//t:c"]
        # strategy_orders (fastci eval) reads once what every strategy reads: the same orders.
        analysis = analyze(repo.root, Config(), base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store)
        assert prioritize.strategy_orders(analysis, store) == {n: ids(n) for n in STRATEGIES}
        # Above the bound on selected tests nothing per test is read: reasons' order.
        monkeypatch.setattr(prioritize, "INPUTS_MAX_TESTS", 3)
        assert ids("rare_inputs") == ids("reasons") == ["//t:a", "//t:b", "//t:c", "//t:z_odd"]
    finally:
        store.close()


def test_the_config_default_is_the_default_strategy() -> None:
    from fastci.config import PRIORITY_STRATEGIES, Config
    from fastci.select.priority import DEFAULT

    assert Config().priority == DEFAULT and DEFAULT in STRATEGIES
    assert set(PRIORITY_STRATEGIES) == set(STRATEGIES)


def test_cofailure_is_the_smoothed_failure_rate_when_the_same_files_changed() -> None:
    from fastci.select.priority import cofailure

    files_of = {"c1": frozenset({"pkg/model.py"}), "c2": frozenset({"pkg/data.py"}),
                "c3": frozenset({"pkg/model.py", "README.md"})}
    changed = frozenset({"pkg/model.py"})
    assert cofailure([("failed", "c1")], files_of, changed) == 0.5
    assert cofailure([("failed", "c1"), ("error", "c3")], files_of, changed) == pytest.approx(2 / 3)
    assert cofailure([("failed", "c1"), ("passed", "c3")], files_of, changed) == pytest.approx(1 / 3)
    # Failures where other files changed, unknown commits and no commit say nothing.
    assert cofailure([("failed", "c2"), ("failed", "c9"), ("failed", None)], files_of, changed) == 0
    more = RiskFacts(unit("//t:a"), recent=("passed", "failed"), cofailure=0.5)
    less = RiskFacts(unit("//t:a"), recent=("passed", "failed"))
    assert risk(more) == pytest.approx(risk(less) + 0.5)


def test_a_plan_runs_first_the_test_that_failed_when_the_same_file_changed(tmp_path: Any) -> None:
    from fastci.config import Config
    from fastci.evidence.store.db import EvidenceStore
    from fastci.integrations.git.repository import Git
    from fastci.plan import prioritize
    from fastci.plan.planner import analyze
    from fastci.select import DeclaredTest
    from selection_support import MODEL, env_now, ingest, model_repo

    repo, base, scale = model_repo(tmp_path / "repo", "::scale", "::<module>")
    # Two commits after base, then back to base (git keeps them): one changed the model,
    # one only a README. Both tests failed once and passed since; //t:cheap failed where
    # the README changed, //t:costly where the model changed.
    at_model = repo.commit({"pkg/model.py": MODEL.replace("return x * 2", "return x * 5")})
    at_readme = repo.commit({"README.md": "notes\n"})
    later = repo.commit({"README.md": "more notes\n"})
    repo.git("reset", "-q", "--hard", base)
    assert Git(repo.root).files_of_commits([at_model, at_readme, "0" * 40, "--all"]) == {
        at_model: frozenset({"pkg/model.py"}), at_readme: frozenset({"README.md"})}
    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    try:
        ingest(store, "//t:cheap", scale, commit=base, duration_s=1.0)
        ingest(store, "//t:costly", scale, commit=base, duration_s=1.2)
        for test, failed_at in (("//t:cheap", at_readme), ("//t:costly", at_model)):
            for i, (outcome, commit) in enumerate((("failed", failed_at), ("passed", later))):
                store.record_result(test, outcome=outcome, duration_s=1.0, commit=commit, gpus=1,
                                    workload={}, source="test", recorded_at=1000.0 + i)
        # Newest first: the recording, then the two results.
        assert store.recent_runs(["//t:costly"]) == {"//t:costly": (
            ("passed", base), ("passed", later), ("failed", at_model))}
        declared = {t: DeclaredTest(t, 1, {}) for t in ("//t:cheap", "//t:costly")}
        repo.write({"pkg/model.py": MODEL.replace("return x * 2", "return x * 3")})

        def ids(strategy: str) -> list[str]:
            plan = analyze(repo.root, Config(priority=strategy), base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store).plan
            return [t.id for t in plan.tests]

        assert ids("reasons") == ["//t:cheap", "//t:costly"]  # same kind: cheaper first
        assert ids("risk") == ids("rare_inputs") == ["//t:costly", "//t:cheap"]
        analysis = analyze(repo.root, Config(), base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store)
        assert prioritize.strategy_orders(analysis, store, Git(repo.root))["risk"] == ids("risk")
    finally:
        store.close()


def test_words_split_identifiers_and_paths() -> None:
    from fastci.select.priority import words

    assert words("//examples/llm/tests:checkpoint_resume_test") == {
        "examples", "llm", "checkpoint", "resume"}
    assert words("pkg/optim.py::AdamW.lrAt") == {"pkg", "optim", "adam", "lr", "at"}


def test_name_match_weighs_the_words_a_test_shares_with_the_changed_code() -> None:
    from fastci.select.priority import name_match

    def reached(test: str, unit: str, scope: tuple[str, ...] = ()) -> RiskFacts:
        return RiskFacts(Decision(test, (Reason(DecisionKind.CHANGED_UNIT, "x", unit=unit),)),
                         scope=scope)

    u = "lib/checkpoint.py::load"
    facts = [reached("//t:checkpoint_resume_test", u), reached("//t:smoke_test", u),
             reached("//t:other_test", u, scope=("checkpointing",)),  # a prefix match
             reached("//t:loss_test", "lib/loss.py::f")]
    got = name_match(facts)
    assert got[0] == got[2] > 0 and got[1] == 0 and got[3] > 0
    # A word every selected test carries says nothing.
    same = [reached("//t:checkpoint_a_test", u), reached("//t:checkpoint_b_test", u)]
    assert name_match(same) == [pytest.approx(math.log(3 / 2))] * 2


def test_rare_named_prefers_the_named_test_and_the_stricter_check() -> None:
    u = "lib/checkpoint.py::load"

    def f(test: str, check: str | None, cost: float = 10.0) -> RiskFacts:
        return RiskFacts(Decision(test, (Reason(DecisionKind.CHANGED_UNIT, "x", unit=u),)),
                         cost=cost, check=check)

    facts = {x.decision.test: x for x in (
        f("//t:smoke_test", "completes"), f("//t:parity_test", "tolerance"),
        f("//t:bitwise_test", "exact"), f("//t:undeclared_test", None),
        f("//t:checkpoint_resume_test", "tolerance", cost=40.0))}
    ranked = [d.test for d in order([x.decision for x in facts.values()],
                                    lambda d: facts[d.test], STRATEGIES["rare_named"])]
    # Its name reaches the changed file: first though 4x dearer; then by check strength
    # (an undeclared check counts as a tolerance one; ties run cheaper first, then by id).
    assert ranked == ["//t:checkpoint_resume_test", "//t:bitwise_test", "//t:parity_test",
                      "//t:undeclared_test", "//t:smoke_test"]
    # rare_inputs reads neither: cost, then id.
    assert [d.test for d in order([x.decision for x in facts.values()], lambda d: facts[d.test],
                                  STRATEGIES["rare_inputs"])][-1] == "//t:checkpoint_resume_test"
