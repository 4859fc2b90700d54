"""Equivalent-context pruning (issue 14 item 2): the rules of ``safe``, each a test, and a
property: every pruned test's (changed unit, context) pairs keep a running stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.plan.planner import to_plan
from fastci.select import DecisionKind, DeclaredTest
from fastci.select.decisions import Decision, Reason, Selection
from fastci.select.prune import CONTEXT_CAP, prune
from fastci.plan.inputs import Given, KnownFingerprint

U1, U2 = "pkg/m.py::f", "pkg/m.py::g"


class Store:
    """The one read the pruner makes: contexts per test and unit."""

    def __init__(self, units: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
        self.units = units

    def units_of_test(self, test: str) -> Mapping[str, Sequence[str]]:
        return self.units.get(test, {})


def changed(test: str, *units: str, extra: Sequence[Reason] = ()) -> Decision:
    return Decision(test, tuple(Reason(DecisionKind.CHANGED_UNIT, f"executes {u}", unit=u)
                                for u in units) + tuple(extra))


def decl(test: str, check: str | None = "exact", reference: str = "absolute",
         scope: tuple[str, ...] = ("training",), frozen: tuple[str, ...] | None = None
         ) -> DeclaredTest:
    return DeclaredTest(test, 1, {"steps": 4}, check=check, reference=reference, scope=scope,
                        frozen=frozen)


def run(decisions: Sequence[Decision], units: Mapping[str, Mapping[str, Sequence[str]]],
        decls: Mapping[str, DeclaredTest], cost: Mapping[str, float],
        mode: str = "safe") -> tuple[set[str], Selection]:
    sel = Selection(tuple(decisions), summary="2 changed units")
    out, pruned = prune(sel, Store(units), decls, cost, mode)
    assert {p.test for p in pruned} == {d.test for d in out.decisions if d.pruned}
    return {p.test for p in pruned}, out


CTX = ["args(x=T(f32,2d,cpu,s))|grad=1"]


def test_the_expensive_duplicate_is_pruned_and_names_its_stand_in() -> None:
    pruned, sel = run([changed("//t:a", U1), changed("//t:b", U1)],
                      {"//t:a": {U1: CTX}, "//t:b": {U1: CTX}},
                      {"//t:a": decl("//t:a"), "//t:b": decl("//t:b")},
                      {"//t:a": 50.0, "//t:b": 10.0})
    assert pruned == {"//t:a"}
    (a,) = [d for d in sel.decisions if d.test == "//t:a"]
    assert not a.selected and a.why.startswith("pruned: each of its 1 (changed unit, context) "
                                               "pair(s) also runs in //t:b")
    plan = to_plan(sel, base="B", head="H")
    assert [t.id for t in plan.tests] == ["//t:b"]
    assert [(s.id, s.why) for s in plan.skipped] == [("//t:a", a.why)]
    # The plan names the stand-ins: `fastci run` runs the pruned test when a test fails.
    assert a.stand_ins == ("//t:b",) and plan.skipped[0].stand_ins == ("//t:b",)
    assert "1 pruned" in plan.reason


@pytest.mark.parametrize("mode", ["safe", "aggressive"])
def test_nothing_is_pruned_while_a_selected_test_failed_its_last_run(mode: str) -> None:
    # c failed last time (the branch is red): a prune holds only while its stand-ins
    # pass, and plain `bazel test` cannot run a pruned test after a failure.
    units = {t: {U1: CTX} for t in ("//t:a", "//t:b", "//t:c")}
    decls = {t: decl(t) for t in units}
    red = Decision("//t:c", changed("//t:c", U1).reasons
                   + (Reason(DecisionKind.FAILED_LAST, "failed in its last run"),))
    pruned, sel = run([changed("//t:a", U1), changed("//t:b", U1), red], units, decls,
                      {"//t:a": 50.0, "//t:b": 10.0, "//t:c": 1.0}, mode)
    assert pruned == set() and all(d.selected for d in sel.decisions)
    assert sel.summary == "2 changed units; nothing pruned: 1 selected test(s) failed their last run"
    # Without the failure the same selection prunes.
    pruned, _ = run([changed("//t:a", U1), changed("//t:b", U1), changed("//t:c", U1)], units,
                    decls, {"//t:a": 50.0, "//t:b": 10.0, "//t:c": 1.0}, mode)
    assert pruned


def test_a_weaker_check_never_stands_in_for_a_stronger_one() -> None:
    pruned, _ = run([changed("//t:exact", U1), changed("//t:tol", U1)],
                    {"//t:exact": {U1: CTX}, "//t:tol": {U1: CTX}},
                    {"//t:exact": decl("//t:exact", "exact"), "//t:tol": decl("//t:tol", "tolerance")},
                    {"//t:exact": 50.0, "//t:tol": 10.0})
    assert pruned == {"//t:tol"}  # the exact check stands in for the tolerance one


def test_a_relational_check_stands_in_only_for_relational_ones() -> None:
    tests = {"//t:abs": decl("//t:abs", "exact", "absolute"),
             "//t:rel": decl("//t:rel", "exact", "relational"),
             "//t:rel2": decl("//t:rel2", "exact", "relational")}
    units = {t: {U1: CTX} for t in tests}
    pruned, _ = run([changed("//t:abs", U1), changed("//t:rel", U1)], units, tests,
                    {"//t:abs": 50.0, "//t:rel": 10.0})
    assert pruned == {"//t:rel"}  # absolute stands in for relational, not the reverse
    pruned, _ = run([changed("//t:rel", U1), changed("//t:rel2", U1)], units, tests,
                    {"//t:rel": 50.0, "//t:rel2": 10.0})
    assert pruned == {"//t:rel"}


@pytest.mark.parametrize("case", ["failed_last", "modified", "no_evidence", "undeclared",
                                  "performance", "capped", "other_context", "unit_not_shared"])
def test_tests_that_are_never_pruned(case: str) -> None:
    extra: list[Reason] = []
    units: dict[str, dict[str, list[str]]] = {"//t:a": {U1: CTX}, "//t:b": {U1: CTX}}
    decls = {"//t:a": decl("//t:a"), "//t:b": decl("//t:b")}
    a = changed("//t:a", U1)
    if case == "failed_last":
        extra = [Reason(DecisionKind.FAILED_LAST, "failed in its last run")]
    elif case == "modified":
        extra = [Reason(DecisionKind.MODIFIED_TEST, "the test itself changed")]
    elif case == "no_evidence":
        units["//t:a"] = {}
    elif case == "undeclared":
        decls["//t:a"] = decl("//t:a", None)
    elif case == "performance":
        decls["//t:a"] = decl("//t:a", "performance")
    elif case == "capped":
        units["//t:a"] = {U1: [f"args(mode='{i}')" for i in range(CONTEXT_CAP)]}
        units["//t:b"] = {U1: [f"args(mode='{i}')" for i in range(CONTEXT_CAP)]}
    elif case == "other_context":
        units["//t:a"] = {U1: ["args(x=T(bf16,2d,cpu,s))|grad=1"]}
    elif case == "unit_not_shared":
        a = changed("//t:a", U1, U2)
        units["//t:a"] = {U1: CTX, U2: CTX}
    a = Decision(a.test, a.reasons + tuple(extra))
    pruned, _ = run([a, changed("//t:b", U1)], units, decls, {"//t:a": 50.0, "//t:b": 1.0})
    assert "//t:a" not in pruned


def test_undeclared_checks_are_pruned_only_when_aggressive() -> None:
    units = {"//t:a": {U1: CTX}, "//t:b": {U1: CTX}}
    decls = {"//t:a": decl("//t:a", None), "//t:b": decl("//t:b", "completes", "relational")}
    args: Any = ([changed("//t:a", U1), changed("//t:b", U1)], units, decls,
                 {"//t:a": 50.0, "//t:b": 1.0})
    assert run(*args, mode="safe")[0] == set()
    assert run(*args, mode="aggressive")[0] == {"//t:a"}
    assert run(*args, mode="off")[0] == set()


def test_per_call_data_is_not_a_context() -> None:
    # Both tests ran f at several indices; the indices differ, the configuration does not.
    units = {"//t:a": {U1: ["args(i=1;tp=2)", "args(i=2;tp=2)"]},
             "//t:b": {U1: ["args(i=7;tp=2)", "args(i=9;tp=2)"]}}
    pruned, _ = run([changed("//t:a", U1), changed("//t:b", U1)], units,
                    {"//t:a": decl("//t:a"), "//t:b": decl("//t:b")},
                    {"//t:a": 50.0, "//t:b": 10.0})
    assert pruned == {"//t:a"}


def test_a_stand_in_of_a_pruned_test_is_not_pruned_in_turn() -> None:
    units = {t: {U1: CTX} for t in ("//t:a", "//t:b")}
    decls = {t: decl(t) for t in units}
    pruned, sel = run([changed("//t:a", U1), changed("//t:b", U1)], units, decls,
                      {"//t:a": 50.0, "//t:b": 40.0})
    assert pruned == {"//t:a"} and [d.test for d in sel.selected] == ["//t:b"]


def test_a_widened_selection_is_never_pruned() -> None:
    widen = (Reason(DecisionKind.RUN_ALL_PATH, "WORKSPACE changed"),)
    sel = Selection((changed("//t:a", U1), changed("//t:b", U1)), widen=widen)
    out, pruned = prune(sel, Store({t: {U1: CTX} for t in ("//t:a", "//t:b")}),
                        {t: decl(t) for t in ("//t:a", "//t:b")}, {}, "safe")
    assert out is sel and pruned == []


CHECKS = ["exact", "tolerance", "threshold", "completes", "performance", None]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(tests=st.lists(st.tuples(st.sets(st.sampled_from(["c1", "c2", "c3"]), max_size=3),
                                st.sampled_from(CHECKS), st.booleans(),
                                st.floats(0.0, 100.0), st.booleans()),
                      min_size=1, max_size=7))
def test_every_pruned_pair_keeps_a_running_stand_in(tests: list[Any]) -> None:
    rank = {"exact": 4, "tolerance": 3, "threshold": 2, "completes": 1}
    decisions, units, decls, cost = [], {}, {}, {}
    for i, (ctx, check, relational, c, failed) in enumerate(tests):
        t = f"//t:{i}"
        extra = [Reason(DecisionKind.FAILED_LAST, "failed")] if failed else []
        decisions.append(changed(t, U1, extra=extra))
        units[t] = {U1: [f"args(k='{x}')" for x in sorted(ctx)]}
        decls[t] = decl(t, check, "relational" if relational else "absolute")
        cost[t] = c
    pruned, sel = run(decisions, units, decls, cost)
    running = {d.test for d in sel.selected}
    assert running | pruned == {d.test for d in decisions} and not running & pruned
    for t in pruned:
        i = int(t.split(":")[1])
        ctx, check, relational, _, failed = tests[i]
        assert not failed and check in rank and ctx
        for x in ctx:
            assert any(
                x in tests[j][0] and tests[j][1] in rank and rank[tests[j][1]] >= rank[check]
                and (relational or not tests[j][2])
                for j in (int(s.split(":")[1]) for s in running)), (t, x)


def test_a_plan_prunes_from_real_evidence_with_the_configured_mode(tmp_path: Path) -> None:
    from fastci.config import Config
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from selection_support import MODEL, env_now, ingest, model_repo

    repo, base, scale = model_repo(tmp_path / "repo", "::scale", "::<module>")
    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    try:
        for test, seconds, ctx in (("//t:big", 50.0, ["args(x=2)|grad=1", "args(x=3)|grad=1"]),
                                   ("//t:small", 10.0, ["args(x=7)|grad=1", "args(x=8)|grad=1"])):
            ingest(store, test, scale, commit=base, duration_s=seconds, contexts=ctx)
        declared = {t: DeclaredTest(t, 1, {}, check="exact", reference="absolute",
                                    scope=("training",))
                    for t in ("//t:big", "//t:small")}
        repo.write({"pkg/model.py": MODEL.replace("return x * 2", "return x * 3")})

        def plan(cfg: Config, **kw: Any) -> Any:
            return analyze(repo.root, cfg, base=base, declared=Given(declared),
                           environment=KnownFingerprint(env_now()), store=store, **kw).plan

        assert [t.id for t in plan(Config(prune="off")).tests] == ["//t:small", "//t:big"]
        for p in (plan(Config(prune="safe")), plan(Config(), prune="safe")):
            assert [t.id for t in p.tests] == ["//t:small"]
            (skipped,) = [s for s in p.skipped if s.id == "//t:big"]
            assert skipped.why.startswith("pruned: each of its 1 (changed unit, context) pair(s) "
                                          "also runs in //t:small")
            assert "pkg/model.py::scale in args(x=#)|grad=1" in skipped.why
            # The prune is conditional: only the runner that reruns after a failure skips it.
            assert skipped.why.endswith("skipped only by fastci run, which runs it after any "
                                        "failure")
    finally:
        store.close()


def test_contexts_of_units_equals_units_of_test_restricted(tmp_path: Path) -> None:
    from fastci.evidence.store.db import EvidenceStore
    from selection_support import ingest

    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    try:
        ingest(store, "//t:a", {U1: "c1", U2: "c2"}, commit=None, contexts=["x", "y"])
        ingest(store, "//t:b", {U2: "c2"}, commit=None, contexts=["z"])
        got = store.contexts_of_units([U2, "pkg/none.py::h"])
        assert got == {t: {U2: store.units_of_test(t)[U2]} for t in ("//t:a", "//t:b")}
        assert got["//t:a"][U2] == ["x", "y"] and store.contexts_of_units([]) == {}
    finally:
        store.close()


def test_a_change_at_import_time_is_never_pruned() -> None:
    # Every importer runs a class body in the same context; the changed value's effect
    # differs per test (measured: a config default failed only in "covered" tests).
    units = {t: {U1: CTX} for t in ("//t:a", "//t:b")}
    sel = Selection((changed("//t:a", U1), changed("//t:b", U1)))
    decls = {t: decl(t) for t in units}
    out, pruned = prune(sel, Store(units), decls, {"//t:a": 50.0, "//t:b": 1.0}, "safe",
                        import_time=frozenset({U1}))
    assert pruned == [] and out is sel
    uses = Decision("//t:a", (Reason(DecisionKind.USES_CHANGED_NAME, "uses N", unit=U1),))
    assert "//t:a" not in run([uses, changed("//t:b", U1)], units, decls,
                               {"//t:a": 50.0, "//t:b": 1.0})[0]


# Issue 34 item 4: what a stand-in must share with the test it stands in for.

def test_a_number_varying_in_one_test_is_not_blanked_in_another() -> None:
    # The parity test runs its arms at tp=1 and tp=2; blanking tp in every test made
    # the tp=4 test's context read `tp=#` too, so the parity test stood in for it.
    units = {"//t:tp_parity": {U1: ["args(cfg=Cfg(tp=1;layers=4))", "args(cfg=Cfg(tp=2;layers=4))"]},
             "//t:tp4": {U1: ["args(cfg=Cfg(tp=4;layers=4))"]}}
    decls = {"//t:tp_parity": decl("//t:tp_parity", "exact", "relational"),
             "//t:tp4": decl("//t:tp4", "tolerance", "relational")}
    pruned, _ = run([changed("//t:tp_parity", U1), changed("//t:tp4", U1)], units, decls,
                    {"//t:tp_parity": 1.0, "//t:tp4": 50.0})
    assert pruned == set()
    # A test that ran the very context (tp=2 among its values) still stands in for it.
    units["//t:tp2"] = {U1: ["args(cfg=Cfg(tp=2;layers=4))"]}
    decls["//t:tp2"] = decl("//t:tp2", "tolerance", "relational", frozen=())
    pruned, _ = run([changed("//t:tp_parity", U1), changed("//t:tp2", U1)], units, decls,
                    {"//t:tp_parity": 1.0, "//t:tp2": 50.0})
    assert pruned == {"//t:tp2"}


def test_a_relational_test_never_stands_in_for_a_test_whose_scope_holds_what_its_arms_vary() -> None:
    # Both compare tp arms (tp=1 vs 2, tp=1 vs 4): both read `tp=#`, yet the tp=1 vs 2
    # comparison cannot see a bug that appears only at tp=4, which the other's scope holds.
    units = {"//t:tp12": {U1: ["args(cfg=Cfg(tp=1))", "args(cfg=Cfg(tp=2))"]},
             "//t:tp14": {U1: ["args(cfg=Cfg(tp=1))", "args(cfg=Cfg(tp=4))"]}}
    decls = {"//t:tp12": decl("//t:tp12", "exact", "relational", frozen=("tp",)),
             "//t:tp14": decl("//t:tp14", "exact", "relational", frozen=("tp",))}
    pruned, _ = run([changed("//t:tp12", U1), changed("//t:tp14", U1)], units, decls,
                    {"//t:tp12": 1.0, "//t:tp14": 50.0})
    assert pruned == set()
    # When tp is not what the test's scope freezes (it may shrink), the arms stand in.
    decls["//t:tp14"] = decl("//t:tp14", "exact", "relational", frozen=())
    pruned, _ = run([changed("//t:tp12", U1), changed("//t:tp14", U1)], units, decls,
                    {"//t:tp12": 1.0, "//t:tp14": 50.0})
    assert pruned == {"//t:tp14"}
    # Undeclared `frozen`: every dimension without a floor is what the scope holds.
    loose = DeclaredTest("//t:tp14", 1, {"tp": 4, "steps": 4}, floors={"steps": 1},
                         check="exact", reference="relational", scope=("training",))
    decls["//t:tp14"] = loose
    pruned, _ = run([changed("//t:tp12", U1), changed("//t:tp14", U1)], units, decls,
                    {"//t:tp12": 1.0, "//t:tp14": 50.0})
    assert pruned == set()


def test_a_stand_in_must_observe_what_the_pruned_test_checks() -> None:
    # An exact loss check ran the same contexts as a tolerance gradient-parity check; the
    # kind of check ranks higher, but it does not observe gradients.
    units = {"//t:loss": {U1: CTX}, "//t:grad": {U1: CTX}}
    decls = {"//t:loss": decl("//t:loss", "exact", "relational", scope=("golden_loss",)),
             "//t:grad": decl("//t:grad", "tolerance", "relational", scope=("grad_parity",))}
    args: Any = ([changed("//t:loss", U1), changed("//t:grad", U1)], units, decls,
                 {"//t:loss": 1.0, "//t:grad": 50.0})
    assert run(*args)[0] == set()
    # A stand-in whose scope includes the test's observes it.
    decls["//t:loss"] = decl("//t:loss", "exact", "relational", scope=("golden_loss", "grad_parity"))
    assert run(*args)[0] == {"//t:grad"}
    # A test that does not declare what it validates is never pruned in safe mode.
    decls["//t:grad"] = decl("//t:grad", "tolerance", "relational", scope=())
    assert run(*args)[0] == set()
    assert run(*args, mode="aggressive")[0] == {"//t:grad"}
