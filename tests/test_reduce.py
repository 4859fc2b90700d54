"""Choosing reduced workloads from calibration (issue 13 item 2): the safety rules, each a test.

The calibration rungs are built by hand here (what ``fastci calibrate`` stores: lines,
contexts, digests, cost), the file versions are real git history, and the chooser is
:func:`fastci.plan.reduce.choose`.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastci.changes.versions import Versions
from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
from fastci.evidence.store.db import RunRecord
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.plan.reduce import (choose, escapes, reaches_all_of, superseding_rung, varying_numbers,
                               without_data_values, without_reduced_values)
from fastci.select import DeclaredTest, DecisionKind
from fastci.select.decisions import Decision, Reason
from selection_support import Repo
from fastci.plan.inputs import Given, KnownFingerprint

# Line numbers matter: f's body is lines 2-7.
M = '''def f(x, steps):
    y = x + 1
    if steps > 4:
        y = y * 2
    if steps > 1:
        y = y - 3
    return y


def g():
    return 0
'''
UNIT = "pkg/m.py::f"
DECL = DeclaredTest("//t:a", 1, {"steps": 8, "layers": 4, "tp": 2},
                    floors={"steps": 1, "layers": 1}, frozen=("tp",), scope=("parity",),
                    constraints=("layers <= steps * 4",), check="exact", reference="relational")


class World:
    def __init__(self, tmp: Path) -> None:
        self.repo = Repo(tmp / "repo")
        self.base = self.repo.commit({"pkg/m.py": M})
        self.digest = hashlib.sha256(M.encode()).hexdigest()
        self.store = CalibrationStore.open(tmp / "cal.db", create=True)

    def rung(self, name: str, overrides: dict[str, Any], cost: float, lines: set[int],
             contexts: set[str] = frozenset({"fp32"}), decl: DeclaredTest = DECL,
             **kw: Any) -> Rung:
        r = Rung(**{**dict(
            test="//t:a", rung=name, declaration=declaration_digest(decl), overrides=overrides,
            commit=self.base, duration_s=cost, gpus=1, outcome="passed", complete=True,
            recorded_at=1.0, lines={"pkg/m.py": frozenset(lines | {1, 10})},
            units={UNIT: ("c", frozenset(contexts)), "pkg/m.py::<module>": ("m", frozenset())},
            digests={"pkg/m.py": self.digest}), **kw})
        self.store.put(r)
        return r

    def choose(self, reasons: tuple[Reason, ...] | None = None, decl: DeclaredTest = DECL,
               history: list[RunRecord] | None = None) -> Any:
        reasons = reasons or (Reason(DecisionKind.CHANGED_UNIT, "executes f", unit=UNIT,
                                     path="pkg/m.py"),)
        d = Decision("//t:a", reasons)
        got = choose([d], {"//t:a": decl}, self.store, Versions(Git(self.repo.root), WORKTREE),
                     self.base, history=(lambda t: history or []))
        return got["//t:a"]

    def edit(self, line: int, text: str) -> None:
        lines = M.splitlines(keepends=True)
        lines[line - 1] = text + "\n"
        self.repo.write({"pkg/m.py": "".join(lines)})


def full_ladder(w: World) -> None:
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7})
    w.rung("steps=4", {"steps": 4}, 5.0, {2, 3, 5, 6, 7})   # skips line 4
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 5, 7})      # skips lines 4 and 6
    w.rung("layers=1", {"layers": 1}, 6.0, {2, 3, 4, 5, 6, 7})


def test_the_cheapest_rung_that_reaches_the_changed_lines_is_chosen(tmp_path: Path) -> None:
    w = World(tmp_path)
    full_ladder(w)
    w.edit(2, "    y = x + 2")  # every rung runs line 2
    c = w.choose()
    assert c.overrides == {"steps": 1} and c.est_gpu_s == 2.0
    assert "steps 8\u21921" in c.why and "pkg/m.py::f lines 2" in c.why and "{fp32}" in c.why
    w.edit(6, "        y = y - 4")  # steps=1 does not run line 6: a bigger rung
    c = w.choose()
    assert c.overrides == {"steps": 4}
    w.edit(4, "        y = y * 3")  # only full and layers=1 run line 4
    assert w.choose().overrides == {"layers": 1}


def test_missing_contexts_keep_a_bigger_rung(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7}, contexts={"fp32", "tp=2"})
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7}, contexts={"fp32"})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert c.overrides == {} and "contexts {tp=2}" in c.why


def test_a_reduced_dimension_s_own_value_is_not_a_new_context(tmp_path: Path) -> None:
    # The unit takes the workload itself (an argument, a config's field, a kwargs entry):
    # at steps=1 it necessarily sees steps=1. Anything else in the context must match.
    full = {"args(x=2;steps=8)|caller=pkg/t.py::run|grad=1",
            "args(cfg=Cfg(steps=8,tp=2);flat={layers=4,steps=8})|caller=c|grad=1"}
    w = World(tmp_path)
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7}, contexts=full)
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7},
           contexts={c.replace("steps=8", "steps=1") for c in full})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert c.overrides == {"steps": 1}, c.why


@pytest.mark.parametrize("rung_ctx, why", [
    # A value derived from steps under another name still differs: not the same context.
    ("args(x=2;steps=1;warmup=0)|grad=1", "warmup=4"),
    # Another field happens to be named like the dimension but holds another value.
    ("args(x=2;steps=1;warmup=4)|grad=1|steps=1", "steps=3"),
    # The reduction changed something else too (grad mode).
    ("args(x=2;steps=1;warmup=4)|grad=0", "grad=1"),
])
def test_other_differences_still_keep_the_full_workload(tmp_path: Path, rung_ctx: str,
                                                        why: str) -> None:
    w = World(tmp_path)
    full_ctx = "args(x=2;steps=8;warmup=4)|grad=1" + ("|steps=3" if why == "steps=3" else "")
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7}, contexts={full_ctx})
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7}, contexts={rung_ctx})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert c.overrides == {} and "does not run pkg/m.py::f in contexts" in c.why, c.why
    assert why in c.why, c.why


@pytest.mark.parametrize("full_ctx, rung_ctx, reduced", [
    # index varies within the full run: per-call data; the rung's other indices match.
    ({"args(i=1;tp=2)|grad=1", "args(i=2;tp=2)|grad=1"}, {"args(i=1;tp=2)|grad=1"}, True),
    ({"args(idx=list(3,4);tp=2)", "args(idx=list(9,1);tp=2)"}, {"args(idx=list(5,5);tp=2)"},
     True),
    # tp is constant over the full run: configuration, it must match.
    ({"args(i=1;tp=2)", "args(i=2;tp=2)"}, {"args(i=1;tp=1)"}, False),
    # Varying in the rung only does not make a number data.
    ({"args(tp=2)"}, {"args(tp=1)", "args(tp=4)"}, False),
    # A string that varies is never data: each dtype is a context.
    ({"args(dt='bf16')", "args(dt='f32')"}, {"args(dt='f32')"}, False),
    # Nor is a tensor's abstraction.
    ({"args(x=T(f32,2d,cpu,s))", "args(x=T(bf16,2d,cpu,s))"}, {"args(x=T(f32,2d,cpu,s))"},
     False),
])
def test_numbers_that_vary_within_the_full_run_are_data(tmp_path: Path, full_ctx: set[str],
                                                        rung_ctx: set[str],
                                                        reduced: bool) -> None:
    w = World(tmp_path)
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7}, contexts=full_ctx)
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7}, contexts=rung_ctx)
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert (c.overrides == {"steps": 1}) is reduced, c.why


@pytest.mark.parametrize("rung_ctx, reduced", [
    # iters=8 at full, iters=1 at steps=1: steps under another name.
    ("args(iters=1;tp=2)|grad=1", True),
    # Moved, but not as steps did.
    ("args(iters=2;tp=2)|grad=1", False),
    # Moved as steps did, and something else changed too.
    ("args(iters=1;tp=1)|grad=1", False),
    # Another name holds the value.
    ("args(loops=1;tp=2)|grad=1", False),
])
def test_a_number_that_moved_as_the_dimension_did_is_the_dimension(tmp_path: Path, rung_ctx: str,
                                                                   reduced: bool) -> None:
    w = World(tmp_path)
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7}, contexts={"args(iters=8;tp=2)|grad=1"})
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7}, contexts={rung_ctx})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert (c.overrides == {"steps": 1}) is reduced, c.why


def test_varying_numbers_and_their_blanking() -> None:
    ctx = ["args(self=S(n=4096,pos=0);e=0)|grad=1", "args(self=S(n=4096,pos=16);e=0)|grad=1",
           "args(op='<=';a=40;b=1.5)", "args(op='%';a=4;b=1.5)", "args(k='x');r=2", "args(k='y')"]
    names = varying_numbers(ctx)
    assert names == {"pos", "a"}
    assert without_data_values(ctx, names) == {
        "args(self=S(n=4096,pos=#);e=0)|grad=1", "args(op='<=';a=#;b=1.5)",
        "args(op='%';a=#;b=1.5)", "args(k='x');r=2", "args(k='y')"}


def test_without_reduced_values_replaces_whole_tokens_only() -> None:
    got = without_reduced_values(
        ["args(steps=8;max_steps=8;s=Cfg(steps=8,lr=0.5))|steps=8",
         "args(steps=80;steps_x=8)|grad=1", "args(lr=0.5;steps='8')"],
        {"steps": 8, "lr": 0.5})
    assert got == {"args(steps=*;max_steps=8;s=Cfg(steps=*,lr=*))|steps=*",
                   "args(steps=80;steps_x=8)|grad=1", "args(lr=*;steps='8')"}
    assert without_reduced_values(["a=1"], {}) == {"a=1"}


def test_frozen_dimensions_and_floors_are_never_crossed(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7})
    w.rung("tp=1", {"tp": 1}, 1.0, {2, 3, 4, 5, 6, 7})          # frozen (scope)
    w.rung("steps=0", {"steps": 0}, 1.0, {2, 3, 4, 5, 6, 7})    # below the floor
    w.rung("layers=8", {"layers": 8, "steps": 2}, 1.0, {2, 3, 4, 5, 6, 7})  # above full, constraint
    w.edit(2, "    y = x + 2")
    assert w.choose().overrides == {}


def test_no_stale_or_failed_calibration_means_full_workload(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.edit(2, "    y = x + 2")
    assert "not calibrated" in w.choose().why
    w.rung("full", {}, 10.0, {2, 3, 4, 5, 6, 7})
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7}, outcome="failed")
    assert w.choose().overrides == {}  # the cheap rung failed at calibration
    w.rung("steps=1", {"steps": 1}, 2.0, {2, 3, 4, 5, 6, 7})
    assert w.choose().overrides == {"steps": 1}
    # The declaration changed since calibration: stale, whatever the rungs say.
    moved = DeclaredTest(**{**DECL.__dict__, "floors": {"steps": 2, "layers": 1}})
    assert "stale" in w.choose(decl=moved).why and w.choose(decl=moved).overrides == {}
    # The calibrated version of the file is not in the history (a modified tree).
    w.store.put(Rung(**{**w.store.rungs("//t:a")[0].__dict__}))
    for r in w.store.rungs("//t:a"):
        w.store.put(Rung(**{**r.__dict__, "digests": {"pkg/m.py": "0" * 64}}))
    assert "not in the history" in w.choose().why


def test_only_code_reasons_and_relational_references_are_reduced(tmp_path: Path) -> None:
    w = World(tmp_path)
    full_ladder(w)
    w.edit(2, "    y = x + 2")
    data = Reason(DecisionKind.READ_CHANGED_FILE, "read data.json", path="data.json")
    code = Reason(DecisionKind.CHANGED_UNIT, "executes f", unit=UNIT, path="pkg/m.py")
    c = w.choose((code, data))
    assert c.overrides == {} and "read a changed file" in c.why
    absolute = DeclaredTest(**{**DECL.__dict__, "reference": "absolute"})
    c = w.choose(decl=absolute)
    assert c.overrides == {} and "absolute" in c.why
    # A unit that only uses a rebound name: the change is a value it uses, whose effect
    # may show only at some workloads (measured: a changed config default escaped).
    uses = Reason(DecisionKind.USES_CHANGED_NAME, "uses N", unit=UNIT, path="pkg/m.py")
    c = w.choose((uses,))
    assert c.overrides == {} and "changed at import time" in c.why


def test_a_change_to_a_class_or_module_body_runs_full(tmp_path: Path) -> None:
    # Import-time code runs once, identically at every rung: a changed default value in
    # a class body is reached by every rung's lines, yet its effect depends on workload.
    w = World(tmp_path)
    full_ladder(w)
    lines = M.splitlines(keepends=True)
    w.repo.write({"pkg/m.py": "".join(lines) + "\n\nclass Cfg:\n    eps = 1e-5\n"})
    base = w.repo.commit()
    w.base = base
    import hashlib as _h
    text = (w.repo.root / "pkg/m.py").read_bytes()
    for r in w.store.rungs("//t:a"):
        w.store.put(Rung(**{**r.__dict__, "commit": base,
                            "digests": {"pkg/m.py": _h.sha256(text).hexdigest()}}))
    w.repo.write({"pkg/m.py": text.decode().replace("eps = 1e-5", "eps = 1e-6")})
    cls = Reason(DecisionKind.CHANGED_UNIT, "executes Cfg", unit="pkg/m.py::Cfg", path="pkg/m.py")
    c = w.choose((cls,))
    assert c.overrides == {} and "pkg/m.py::Cfg changed at import time" in c.why


def run(commit: str, overrides: dict[str, Any] | None, outcome: str) -> RunRecord:
    return RunRecord("//t:a", commit, "e", dict(DECL.workload or {}), 1.0, 1, outcome, True, 1.0,
                     overrides)


def test_an_escape_raises_the_learned_floor(tmp_path: Path) -> None:
    w = World(tmp_path)
    full_ladder(w)
    w.edit(2, "    y = x + 2")
    history = [run("c9", {"steps": 1}, "passed"), run("c9", {}, "failed"),
               run("c8", {"steps": 4}, "passed"), run("c8", {}, "passed")]
    assert [e.overrides for e in escapes(history)] == [{"steps": 1}]
    c = w.choose(history=history)
    assert c.overrides == {"steps": 4} and "learned floors steps > 1" in c.why
    # A reduced failure with a full pass is no escape; nor is a reduced pass alone.
    assert escapes([run("c7", {"steps": 1}, "failed"), run("c7", {}, "passed")]) == []


LINES = [2, 3, 4, 5, 6, 7]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(full=st.sets(st.sampled_from(LINES), min_size=1),
       rungs=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 5, 6, 7]),
                                st.sets(st.sampled_from(LINES)),
                                st.sets(st.sampled_from(["a", "own", "other"]), min_size=1)),
                      min_size=1, max_size=5, unique_by=lambda r: r[0]),
       edited=st.sampled_from(LINES))
def test_every_chosen_rung_retains_the_changed_coverage(tmp_path_factory: Any, full: set[int],
                                                        rungs: list[Any], edited: int) -> None:
    # The full run calls f in two contexts: "a", and one that carries the workload
    # itself (steps=8). A rung at steps=s has "a" or not, the second context with its
    # own steps value ("own", the same context for a rung reducing steps), or with
    # another value ("other", a different context).
    def contexts(s: int, picked: set[str]) -> set[str]:
        tokens = {"a": "args(x=1)|grad=1", "own": f"args(x=2;steps={s})|grad=1",
                  "other": f"args(x=2;steps={s + 10})|grad=1"}
        return {tokens[p] for p in picked}

    w = World(tmp_path_factory.mktemp("p"))
    full_rung = w.rung("full", {}, 100.0, full, contexts=contexts(8, {"a", "own"}))
    made = [w.rung(f"steps={s}", {"steps": s}, float(s), lines, contexts=contexts(s, ctx))
            for s, lines, ctx in rungs]
    picked = {s: ctx for s, _, ctx in rungs}
    original = M.splitlines()[edited - 1]
    indent = original[:len(original) - len(original.lstrip())]
    header = original.strip().startswith("if ")
    control = original.strip().startswith(("if ", "return"))  # `return y` -> `pass` too
    w.edit(edited, indent + ("if steps > 0:  # edited" if header else "pass  # edited"))
    c = w.choose()
    need = {edited} & full

    def retains(r: Rung) -> bool:
        return need <= r.lines["pkg/m.py"] and {"a", "own"} <= picked[r.overrides["steps"]]

    if control:
        # The edit changes an `if` condition or removes the `return`: retention, checked
        # against the old code, proves nothing about the new one (issue 34 item 2).
        assert c.overrides == {}, c.why
    elif c.overrides:
        (chosen,) = [r for r in made if r.overrides == c.overrides]
        assert retains(chosen)
        assert all(r.gpu_s >= chosen.gpu_s for r in made if retains(r))  # the cheapest
    else:
        assert not any(retains(r) for r in made)
    assert need <= full_rung.lines["pkg/m.py"]
    w.store.close()


def test_the_plan_reduces_from_a_real_calibration_file(tmp_path: Path) -> None:
    """Wired into ``analyze``: a selective plan carries the overrides and the reason; a
    calibration the change itself writes is not trusted."""
    from fastci.config import Config
    from fastci.evidence.store.db import EvidenceStore
    from fastci.plan.planner import analyze
    from selection_support import env_now, ingest, units_of

    w = World(tmp_path)
    w.repo.write({".gitignore": ".fastci/\n"})
    base = w.repo.commit()
    w.base = base
    full_ladder(w)
    w.store.close()
    (w.repo.root / ".fastci").mkdir()
    (tmp_path / "cal.db").rename(w.repo.root / ".fastci" / "calibration.db")
    store = EvidenceStore.open(w.repo.root / ".fastci/evidence.db", create=True)
    units = units_of(w.repo.root, ["pkg/m.py"])
    ingest(store, "//t:a", {UNIT: units[UNIT]}, commit=base, workload=DECL.workload)
    w.edit(2, "    y = x + 2")
    a = analyze(w.repo.root, Config(), base=base, declared=Given({"//t:a": DECL}),
                environment=KnownFingerprint(env_now()), store=store)
    (t,) = a.plan.tests
    assert t.overrides == {"steps": 1}, t.why
    assert "reduced: steps 8\u21921" in t.why and t.est_gpu_s == 2.0
    assert a.choices["//t:a"].rung == "steps=1"  # what `fastci explain` prints
    a = analyze(w.repo.root, Config(), base=base, declared=Given({"//t:a": DECL}),
                environment=KnownFingerprint(env_now()), store=store, reduce=False)
    assert a.plan.tests[0].overrides == {}
    # Committed into the repository, the calibration is not trusted.
    w.repo.git("add", "-f", ".fastci/calibration.db")
    a = analyze(w.repo.root, Config(), base=base, declared=Given({"//t:a": DECL}),
                environment=KnownFingerprint(env_now()), store=store)
    assert a.plan.tests[0].overrides == {} and "not trusted" in a.plan.tests[0].why
    store.close()


def test_ladders_are_exercised_in_every_order(tmp_path: Path) -> None:
    """The choice does not depend on the order rungs were stored in."""
    w = World(tmp_path)
    w.edit(6, "        y = y - 4")
    specs = [("full", {}, 10.0, {2, 3, 4, 5, 6, 7}), ("steps=4", {"steps": 4}, 5.0, {2, 3, 5, 6, 7}),
             ("steps=1", {"steps": 1}, 2.0, {2, 3, 5, 7})]
    seen = set()
    for order in itertools.permutations(specs):
        w.store._conn.execute("DELETE FROM rung")
        for name, o, cost, lines in order:
            w.rung(name, o, cost, lines)
        seen.add(tuple(sorted(w.choose().overrides.items())))
    assert seen == {(("steps", 4),)}


def test_targets_shows_learned_floors(tmp_path: Path) -> None:
    """Item 3: ``fastci targets`` reads the escapes from the run history."""
    import time

    from fastci.cli.targets import learned
    from fastci.evidence.store.db import EvidenceStore
    from fastci.integrations.bazel.query import TestDecl

    decl = TestDecl(id="//t:a", gpus=1, workload=dict(DECL.workload or {}),
                    floors=dict(DECL.floors), scope=DECL.scope, constraints=DECL.constraints,
                    srcs=(), frozen=DECL.frozen, check="exact", reference="relational")
    assert learned(tmp_path, [decl]) == {}  # no store: nothing learned
    with EvidenceStore.open(tmp_path / ".fastci/evidence.db", create=True) as store:
        for overrides, outcome in (({"steps": 2, "layers": 1}, "passed"), ({}, "failed")):
            store.record_result("//t:a", outcome=outcome, duration_s=1.0, commit="c" * 40,
                                gpus=1, workload=dict(DECL.workload or {}), overrides=overrides,
                                source="bazel", recorded_at=time.time())
    got = learned(tmp_path, [decl])["//t:a"]
    assert {k: v for k, (v, _) in got.items()} == {"steps": 2, "layers": 1}
    assert "failed at full workload" in got["steps"][1]


def test_a_calibration_from_a_commit_this_clone_lacks_runs_full(tmp_path: Path,
                                                                caplog: Any) -> None:
    # A shallow checkout, or rungs calibrated in another clone: the rungs' commit does not
    # exist here. The version is looked up at the base too; when no revision holds it, the
    # test runs at full workload with a reason, and no lookup error escapes as a warning.
    w = World(tmp_path)
    full_ladder(w)
    for r in w.store.rungs("//t:a"):
        w.store.put(Rung(**{**r.__dict__, "commit": "f" * 40}))
    w.edit(2, "    y = x + 2")
    assert w.choose().overrides == {"steps": 1}  # the base holds the calibrated version
    for r in w.store.rungs("//t:a"):
        w.store.put(Rung(**{**r.__dict__, "digests": {"pkg/m.py": "0" * 64}}))
    with caplog.at_level("WARNING"):
        c = w.choose()
    assert c.overrides == {} and "not in the history" in c.why
    assert "GitError" not in caplog.text




# --- Inserted or changed control flow (issue 34 item 2) ----------------------------------

@pytest.mark.parametrize("line,text,shown", [
    # The reported case: new code under a condition on a reduced dimension. Lines 2 and 3
    # around it run at every rung, so retention of the old code passes at steps=1.
    (2, "    y = x + 1\n    if steps >= 6:\n        y = y + 100", "inserts `if steps >= 6:`"),
    (2, "    y = x + 1 if steps < 6 else x", "`x + 1 if steps < 6 else x`"),
    (2, "    y = x + sum(1 for i in range(steps) if i >= 6)", "for i in range(steps) if i >= 6"),
    (2, "    y = x + 1\n    for _ in range(steps - 6):\n        y = y + 1", "for _ in range(steps - 6):"),
    (2, "    y = x + 1\n    with open(__file__):\n        pass", "with open(__file__):"),
    (2, "    try:\n        y = x + 1\n    except ValueError:\n        y = 0", "try:"),
    (2, "    match steps:\n        case 8:\n            y = x\n        case _:\n            y = x + 1",
     "match steps:"),
    (4, "        y = y * 2\n    elif steps == 8:\n        y = 0", "changes `if steps > 4:`"),
    (3, "    if steps > 6:", "changes `if steps > 6:`"),
    (6, "        y = y - 3\n        return y", "inserts `return`"),
])
def test_inserted_or_changed_control_flow_runs_full(tmp_path: Path, line: int, text: str,
                                                    shown: str) -> None:
    w = World(tmp_path)
    full_ladder(w)
    w.edit(line, text)
    c = w.choose()
    assert c.overrides == {}, c.why
    assert "pkg/m.py::f: control flow changed" in c.why and shown in c.why, c.why
    assert "retention of the old code's lines cannot show" in c.why
    # The same lines edited without touching control flow still reduce.
    w.edit(2, "    y = x + 1 + steps")
    assert w.choose().overrides == {"steps": 1}


# --- A calibration older than the plan's tree (issue 34 item 1) --------------------------

CALLER = """from pkg.m import f


def forward(x, layers):
    for layer in range(layers):
        x = f(x, 8)
    return x


def unused():
    return 1
"""
CALLER_UNIT = "pkg/model.py::forward"


def _calibrated_with_caller(w: World) -> str:
    """Calibrate //t:a with a caller in pkg/model.py (commit returned): at layers=1 the
    caller runs f once, so the 1-layer rung reaches every line of f the full run does."""
    calibrated = w.repo.commit({"pkg/model.py": CALLER})
    digests = {"pkg/m.py": w.digest,
               "pkg/model.py": hashlib.sha256(CALLER.encode()).hexdigest()}
    units = {UNIT: ("c", frozenset({"fp32"})), "pkg/m.py::<module>": ("m", frozenset()),
             CALLER_UNIT: ("f", frozenset({"fp32"})), "pkg/model.py::<module>": ("n", frozenset())}
    model_lines = {"pkg/model.py": frozenset({1, 4, 5, 6, 7})}
    for name, o, cost in (("full", {}, 10.0), ("layers=1", {"layers": 1}, 3.0)):
        r = w.rung(name, o, cost, {2, 3, 4, 5, 6, 7}, commit=calibrated, digests=digests,
                   units=units)
        w.store.put(Rung(**{**r.__dict__, "lines": {**r.lines, **model_lines}}))
    return calibrated


def test_a_caller_changed_since_calibration_runs_full(tmp_path: Path) -> None:
    """The reported case: main changed the caller since the calibration (f is now called
    from the 2nd layer on only), so the 1-layer rung would reach the change zero times."""
    w = World(tmp_path)
    w.base = _calibrated_with_caller(w)
    w.edit(2, "    y = x + 2")
    assert w.choose().overrides == {"layers": 1}  # the calibration is of this tree
    w.repo.write({"pkg/m.py": M})
    w.base = w.repo.commit({"pkg/model.py": CALLER.replace(
        "        x = f(x, 8)", "        if layer >= 1:\n            x = f(x, 8)")})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert c.overrides == {}, c.why
    assert "pkg/model.py::forward: function body changed" in c.why, c.why
    assert "since the calibration (at " in c.why and "the calibration ran it" in c.why
    assert "calibrate again" in c.why


def test_changes_a_calibration_never_ran_leave_it_usable(tmp_path: Path) -> None:
    """Drift is judged unit by unit: a function the rungs never ran, or a new one, changed
    on main since the calibration; the rungs still describe what they ran."""
    w = World(tmp_path)
    _calibrated_with_caller(w)
    w.base = w.repo.commit({"pkg/model.py": CALLER.replace("return 1", "return 2")
                            + "\n\ndef added():\n    return 3\n"})
    w.edit(2, "    y = x + 2")
    assert w.choose().overrides == {"layers": 1}
    # Import-time code of a file the rungs ran counts whatever the rungs' units say.
    w.repo.write({"pkg/m.py": M})
    w.base = w.repo.commit({"pkg/model.py": "LIMIT = 3\n" + CALLER})
    w.edit(2, "    y = x + 2")
    c = w.choose()
    assert c.overrides == {} and "pkg/model.py::<module>" in c.why, c.why


# --- Rungs a calibration need not run (fastci.plan.reduce.superseding_rung) ---------------------

TWO = DeclaredTest("//t:a", 1, {"steps": 8, "layers": 4, "tp": 2},
                   floors={"steps": 1, "layers": 1}, frozen=("tp",), scope=("parity",),
                   constraints=(), check="exact", reference="relational")
WORKLOAD = dict(TWO.workload or {})
ALL = {2, 3, 4, 5, 6, 7}


def test_a_rung_reaching_all_of_the_full_run_supersedes_bigger_ones(tmp_path: Path) -> None:
    w = World(tmp_path)
    full = w.rung("full", {}, 10.0, ALL, decl=TWO, arcs={"pkg/m.py": frozenset({(2, 3)})})
    floors = w.rung("floors", {"steps": 1, "layers": 1}, 2.0, ALL, decl=TWO,
                    arcs={"pkg/m.py": frozenset({(2, 3), (3, 5)})})
    assert reaches_all_of(floors, full, WORKLOAD) is None
    for bigger in ({"steps": 4}, {"layers": 2}, {"steps": 1}, {"steps": 1, "layers": 1}):
        found = superseding_rung(bigger, [full, floors], full, WORKLOAD)
        assert found is not None and found[0] is floors, bigger
        assert "reaches every line, arc and context" in found[1]
    # A rung reducing less than the candidate supersedes nothing below it.
    steps4 = w.rung("steps=4", {"steps": 4}, 5.0, ALL, decl=TWO,
                    arcs={"pkg/m.py": frozenset({(2, 3)})})
    assert reaches_all_of(steps4, full, WORKLOAD) is None
    assert superseding_rung({"layers": 2}, [full, steps4], full, WORKLOAD) is None
    assert superseding_rung({"steps": 1}, [full, steps4], full, WORKLOAD) is None
    assert superseding_rung({"layers": 1}, [full, steps4], full, WORKLOAD) is None
    # Floors learned from escapes: a rung at or under one supersedes nothing.
    assert superseding_rung({"steps": 4}, [full, floors], full, WORKLOAD, {"steps": 1}) is None
    assert superseding_rung({"steps": 4}, [full, floors], full, WORKLOAD, {"layers": 0}) is not None


@pytest.mark.parametrize("change", [
    dict(lines=ALL - {4}),                                       # a line
    dict(arcs={"pkg/m.py": frozenset()}),                        # an arc
    dict(contexts={"bf16"}),                                     # a context
    dict(outcome="failed"), dict(complete=False),                # not usable
    dict(duration_s=10.0),                                       # no cheaper than full
    dict(commit="0" * 40),                                       # another calibration
    dict(digests={"pkg/m.py": "0" * 64}),                        # another version
])
def test_a_rung_missing_anything_supersedes_nothing(tmp_path: Path, change: dict[str, Any]) -> None:
    w = World(tmp_path)
    full = w.rung("full", {}, 10.0, ALL, decl=TWO, arcs={"pkg/m.py": frozenset({(2, 3)})})
    kw: dict[str, Any] = dict(arcs={"pkg/m.py": frozenset({(2, 3)})}, duration_s=2.0)
    kw.update(change)
    lines = kw.pop("lines", ALL)
    contexts = kw.pop("contexts", {"fp32"})
    floors = w.rung("floors", {"steps": 1, "layers": 1}, kw.pop("duration_s"), lines,
                    contexts=contexts, decl=TWO, **kw)
    assert superseding_rung({"steps": 4}, [full, floors], full, WORKLOAD) is None


# The ladder of TWO in calibration order, each rung's cost its steps x layers.
LADDER = [("floors", {"steps": 1, "layers": 1}), ("steps=1", {"steps": 1}),
          ("layers=1", {"layers": 1}), ("steps=4", {"steps": 4}), ("layers=2", {"layers": 2})]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(measured=st.lists(st.tuples(st.sets(st.sampled_from(sorted(ALL))),
                                   st.sets(st.sampled_from(["fp32", "tp=2"]), min_size=1),
                                   st.booleans()),
                         min_size=len(LADDER), max_size=len(LADDER)),
       edited=st.sampled_from(sorted(ALL)))
def test_leaving_out_stood_in_rungs_never_makes_a_plan_costlier(
        tmp_path_factory: Any, measured: list[Any], edited: int) -> None:
    # Calibrate as `fastci calibrate` does (ladder order, a rung left out when a measured
    # one supersedes it) into one store, and every rung into another: the plan from
    # the first reduces wherever the plan from the second does, and costs no more.
    w = World(tmp_path_factory.mktemp("s"))
    every = CalibrationStore.open(w.store.path.parent / "every.db", create=True)
    full = w.rung("full", {}, 32.0, ALL, decl=TWO, contexts={"fp32", "tp=2"})
    every.put(full)
    kept = [full]
    for (name, overrides), (lines, contexts, passed) in zip(LADDER, measured):
        cost = float(_value_product(overrides))
        rung = Rung(test="//t:a", rung=name, declaration=full.declaration, overrides=overrides,
                    commit=w.base, duration_s=cost, gpus=1,
                    outcome="passed" if passed else "failed", complete=True, recorded_at=1.0,
                    lines={"pkg/m.py": frozenset(lines | {1, 10})}, units={
                        UNIT: ("c", frozenset(contexts)), "pkg/m.py::<module>": ("m", frozenset())},
                    digests={"pkg/m.py": w.digest})
        every.put(rung)
        if superseding_rung(overrides, kept, full, WORKLOAD) is None:
            w.store.put(rung)
            kept.append(rung)
    original = M.splitlines()[edited - 1]
    indent = original[:len(original) - len(original.lstrip())]
    header = original.strip().startswith("if ")
    control = original.strip().startswith(("if ", "return"))  # `return y` -> `pass` too
    w.edit(edited, indent + ("if steps > 0:  # edited" if header else "pass  # edited"))
    lean = w.choose(decl=TWO)
    d = Decision("//t:a", (Reason(DecisionKind.CHANGED_UNIT, "executes f", unit=UNIT,
                                  path="pkg/m.py"),))
    rich = choose([d], {"//t:a": TWO}, every, Versions(Git(w.repo.root), WORKTREE), w.base,
                  history=lambda t: [])["//t:a"]
    assert lean.reduced == rich.reduced, (lean.why, rich.why)
    if rich.reduced:
        assert lean.est_gpu_s <= rich.est_gpu_s, (lean.why, rich.why)
    every.close()
    w.store.close()


def _value_product(overrides: dict[str, int]) -> int:
    return overrides.get("steps", 8) * overrides.get("layers", 4)
