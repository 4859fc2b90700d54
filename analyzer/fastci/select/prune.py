"""Equivalent-context pruning (issue 14 item 2, issue 34 item 4): skip a selected test
that only repeats what other selected tests run.

Each selected test reaches the change through changed units; its evidence says in which
contexts it ran each of them (:mod:`fastci.evidence.record.contexts`), with per-call data set
aside *per test*: a number that varies within a test's own run of a unit is data in
that test's contexts (``tp=#``), and stays a value in every other test's
(:func:`fastci.select.contexts.varying_numbers`; blanking it everywhere made a tp=1 vs
tp=2 parity test look like a tp=4 test). A test stands in for a context with its
contexts as recorded and as blanked. A test whose every (changed unit, context) pair is
also run by other tests of the plan that can *stand in* for it is pruned: it is listed
in the plan's ``skipped`` with the stand-ins and the shared pairs.

It is a weighted set cover, solved greedily: candidates are tried most expensive
first (cost: the GPU-seconds expected at the workload the plan gives them), and one is
pruned only if each of its pairs keeps a running stand-in, and so does each pair of
every test pruned before it.

``safe``:

* A stand-in observes what the test checks: its declared ``scope`` (what it validates)
  includes the test's, and a test without a declared scope is never pruned. Check
  strength alone ranks the kind of check, not what it observes (an exact loss check
  cannot stand in for a tolerance gradient-parity check).
* A stand-in's check is at least as strong as the test's (``exact`` > ``tolerance``
  > ``threshold`` > ``completes``; :data:`fastci.plan.workload.CHECKS`), and a test
  whose check is not declared is never pruned (its strength is unknown).
* A relational check (two arms of the same code compared, e.g. tp=2 vs tp=1) cannot
  see a bug symmetric on both arms: it stands in only for relational tests, and never
  for a test whose scope holds a dimension its arms vary (a number varying within the
  stand-in's run of the unit, named like one of the test's frozen workload
  dimensions: what the test's scope freezes).
* Never pruned: a test selected for any reason but a changed unit it executes (its
  file or declaration changed, it failed last time, it has no or incomplete evidence,
  a changed data file, an environment change...), a performance test, a test whose
  contexts of a changed unit are unknown or capped (the recorder keeps at most
  :data:`fastci.evidence.record.contexts.MAX_CONTEXTS` per unit: more may have run).

* Nothing is pruned while a selected test failed its last run (the branch is red): a
  prune holds only while its stand-ins pass. ``fastci run`` runs the pruned tests in the
  same run after any failure or flaky pass (:func:`fastci.run.runner.execute`).
* A prune is conditional: where no runner enforces that rule, pruned tests run (at full
  workload). The Bazel rules skip them only under ``--repo_env=FASTCI_PRUNES=rerun``
  (``conditional_prunes`` in ``rules/private/plan_model.bzl``), the pytest plug-in only
  with ``--fastci-prunes-rerun``; ``fastci run`` passes both.

``aggressive`` drops the scope, check and relational rules (any test stands in for
any) and prunes undeclared tests; the other rules stay. ``off`` prunes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from fastci.select.contexts import varying_numbers, without_data_values
from fastci.select.decisions import Decision, DecisionKind, Reason, Selection
from fastci.select.test_rules import DeclaredTest, EvidenceReader
from fastci.types import TestId, UnitId

__all__ = ["MODES", "Pruned", "frozen_dims", "prune"]

MODES = ("off", "safe", "aggressive")
#: The reasons a pruned test can be shown to share with its stand-ins.
UNIT_KINDS = frozenset({DecisionKind.CHANGED_UNIT, DecisionKind.USES_CHANGED_NAME})
#: ``exact`` strongest; ``performance`` is never pruned and stands in for nothing.
_STRENGTH = {"exact": 4, "tolerance": 3, "threshold": 2, "completes": 1}
#: Contexts the recorder keeps per unit and run (fastci.evidence.record.contexts.MAX_CONTEXTS).
CONTEXT_CAP = 16

Pair = tuple[UnitId, str]


@dataclass(frozen=True)
class Pruned:
    """A pruned test: who stands in for it, and an example of what they share."""

    test: TestId
    stand_ins: tuple[TestId, ...]
    pairs: int
    example: Pair


@dataclass(frozen=True)
class _Test:
    test: TestId
    pairs: frozenset[Pair]  # what it runs: its contexts, its own per-call data blanked
    strength: int | None  # None: unknown (undeclared) or performance
    relational: bool
    cost: float
    prunable: bool
    #: What it can stand in for: ``pairs`` and its contexts as recorded (a context it
    #: ran with ``tp=2`` covers another test's ``tp=2``).
    held: frozenset[Pair] = frozenset()
    scope: frozenset[str] = frozenset()  # what it validates (declared ``scope``)
    dims: frozenset[str] = frozenset()  # the workload dimensions its scope freezes
    #: Per changed unit, the numbers that varied within its own run of it (for a
    #: relational test: what its arms vary).
    varying: Mapping[UnitId, frozenset[str]] = field(default_factory=dict)


def _kind(decl: DeclaredTest | None, aggressive: bool) -> tuple[int | None, bool]:
    """(strength, relational) of a test's check; strength None when it cannot be
    compared (a performance check, or, in safe mode, an undeclared one)."""
    if decl is None:
        return None, False
    check, reference = decl.check, decl.reference
    if check == "performance":
        return None, reference == "relational"
    if check is None or "check" in decl.defaulted:
        return (0 if aggressive else None), reference == "relational"
    return _STRENGTH.get(check), reference == "relational"


def prune(selection: Selection, store: EvidenceReader, declared: Mapping[TestId, DeclaredTest],
          cost: Mapping[TestId, float | None], mode: str = "safe",
          import_time: frozenset[UnitId] = frozenset()) -> tuple[Selection, list[Pruned]]:
    """Prune ``selection`` (see the module docstring); returns it and what was pruned.

    Args:
        selection: the selection (a widened one is returned as it is).
        store: the evidence (contexts per test and unit).
        declared: declarations by test (a test missing here has an unknown check).
        cost: expected GPU-seconds per test at the workload the plan gives it.
        mode: ``off``, ``safe`` or ``aggressive``.
        import_time: changed units whose change acts at import time (a class or module
            body, a default, a constant): every importer runs them in the same context,
            while the value's effect differs from test to test, so a test reaching one is
            never pruned (measured: a changed config default failed only in tests that
            such pairs had "covered").
    """
    if mode not in MODES:
        raise ValueError(f"prune mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "off" or selection.widen:
        return selection, []
    red = sum(1 for d in selection.selected
              if any(r.kind is DecisionKind.FAILED_LAST for r in d.reasons))
    if red:
        note = f"nothing pruned: {red} selected test(s) failed their last run"
        return replace(selection, summary=_noted(selection.summary, note)), []
    aggressive = mode == "aggressive"
    recorded = changed_unit_contexts(selection, store)
    tests = [_facts(d, recorded.get(d.test, {}), declared.get(d.test),
                    cost.get(d.test), aggressive, import_time) for d in selection.selected]
    pruned = _cover(tests, aggressive)
    if not pruned:
        return selection, []
    by_test = {p.test: p for p in pruned}
    decisions = tuple(_pruned_decision(d, by_test[d.test]) if d.test in by_test else d
                      for d in selection.decisions)
    note = (f"{len(pruned)} pruned (their changed units run in the same contexts in other "
            "planned tests)")
    return replace(selection, decisions=decisions, summary=_noted(selection.summary, note)), pruned


def _noted(summary: str, note: str) -> str:
    """``summary`` with ``note`` after it (the note alone when there is no summary: what
    pruning did is never left out of the plan's reason)."""
    return f"{summary}; {note}" if summary else note


def changed_unit_contexts(selection: Selection, store: EvidenceReader
                          ) -> dict[TestId, Mapping[UnitId, Sequence[str]]]:
    """Per selected test that reached changed units (:data:`UNIT_KINDS`), the contexts
    its evidence recorded for each of those units (a unit it has none for is left out):
    in one read for all the tests when the store has ``contexts_of_units``
    (EvidenceStore), else from each test's evidence (``units_of_test``)."""
    reached = {d.test: {r.unit for r in d.reasons if r.kind in UNIT_KINDS and r.unit}
               for d in selection.selected}
    reached = {t: units for t, units in reached.items() if units}
    batch = getattr(store, "contexts_of_units", None)
    if batch is not None:  # one query per chunk of changed units
        found = batch(set().union(*reached.values())) if reached else {}
    else:
        found = {t: store.units_of_test(t) for t in reached}
    return {t: {u: found[t][u] for u in units if u in found.get(t, {})}
            for t, units in reached.items()}


def frozen_dims(decl: DeclaredTest) -> frozenset[str]:
    """The workload dimensions ``decl``'s scope freezes: its declared ``frozen``, or,
    undeclared, every dimension without a floor (what a plan never reduces)."""
    if decl.frozen is not None:
        return frozenset(decl.frozen)
    return frozenset(d for d in (decl.workload or {}) if d not in decl.floors)


def _facts(d: Decision, recorded: Mapping[UnitId, Sequence[str]], decl: DeclaredTest | None,
           cost: float | None, aggressive: bool,
           import_time: frozenset[UnitId] = frozenset()) -> _Test:
    strength, relational = _kind(decl, aggressive)
    units = {r.unit for r in d.reasons if r.kind in UNIT_KINDS and r.unit}
    scope = frozenset(decl.scope) if decl is not None else frozenset()
    prunable = (strength is not None and bool(units)
                and (aggressive or bool(scope))  # what it observes must be declared
                and all(r.kind is DecisionKind.CHANGED_UNIT and r.unit for r in d.reasons)
                and not units & import_time
                and not any(u.endswith("::<module>") for u in units))
    pairs: set[Pair] = set()
    held: set[Pair] = set()
    varying: dict[UnitId, frozenset[str]] = {}
    for unit in sorted(units):
        contexts = recorded.get(unit)
        if not contexts or len(set(contexts)) >= CONTEXT_CAP:
            prunable = False  # unknown or capped: more may have run than is known
            continue
        # Per-call data is what varies within *this* test's run of the unit: another
        # test's tp=1 vs tp=2 arms say nothing about this test's tp=4.
        varying[unit] = varying_numbers(contexts)
        own = {(unit, c) for c in without_data_values(contexts, varying[unit])}
        pairs.update(own)
        held.update(own)
        held.update((unit, c) for c in contexts)
    return _Test(d.test, frozenset(pairs), strength, relational,
                 float(cost) if cost is not None else 0.0, prunable, frozenset(held), scope,
                 frozen_dims(decl) if decl is not None else frozenset(), varying)


def _stands_in(s: _Test, t: _Test, aggressive: bool, unit: UnitId | None = None) -> bool:
    """Whether ``s`` can stand in for ``t`` (on ``unit``'s pairs, when given)."""
    if aggressive:
        return True
    if s.strength is None or t.strength is None or s.strength < t.strength:
        return False
    if not t.scope or not t.scope <= s.scope:
        return False  # s does not observe what t checks
    if s.relational and not t.relational:
        return False
    # s's arms vary a dimension t's scope holds (tp=1 vs tp=2 against a test of tp):
    # both arms may carry a bug that only t's comparison sees.
    return not (s.relational and unit is not None and s.varying.get(unit, frozenset()) & t.dims)


def _cover(tests: Sequence[_Test], aggressive: bool) -> list[Pruned]:
    running = {t.test: t for t in tests}
    holders: dict[Pair, set[TestId]] = {}
    for t in tests:
        for pair in t.held | t.pairs:
            holders.setdefault(pair, set()).add(t.test)
    pruned: dict[TestId, _Test] = {}
    # Most expensive first; ties by id, so plans are reproducible.
    for t in sorted((t for t in tests if t.prunable), key=lambda t: (-t.cost, t.test)):
        del running[t.test]
        ok = _covered(t, holders, running, aggressive) and all(
            _covered(q, holders, running, aggressive) for q in pruned.values()
            if q.pairs & t.held)
        if ok:
            pruned[t.test] = t
            for pair in t.held | t.pairs:
                holders[pair].discard(t.test)
        else:
            running[t.test] = t
    out = []
    for t in pruned.values():
        stand_ins: set[TestId] = set()
        for pair in sorted(t.pairs):
            stand_ins.add(min(s for s in holders[pair]
                              if _stands_in(running[s], t, aggressive, pair[0])))
        out.append(Pruned(t.test, tuple(sorted(stand_ins)), len(t.pairs), min(t.pairs)))
    return sorted(out, key=lambda p: p.test)


def _covered(t: _Test, holders: Mapping[Pair, set[TestId]], running: Mapping[TestId, _Test],
             aggressive: bool) -> bool:
    return all(any(s in running and _stands_in(running[s], t, aggressive, pair[0])
                   for s in holders.get(pair, ()))
               for pair in t.pairs)


def _pruned_decision(d: Decision, p: Pruned) -> Decision:
    unit, context = p.example
    shown = ", ".join(p.stand_ins[:3]) + (f" and {len(p.stand_ins) - 3} more"
                                          if len(p.stand_ins) > 3 else "")
    sentence = (f"pruned: each of its {p.pairs} (changed unit, context) pair(s) also runs in "
                f"{shown}, whose check{'s are' if len(p.stand_ins) > 1 else ' is'} at least "
                f"as strong and observe{'' if len(p.stand_ins) > 1 else 's'} its scope "
                f"(e.g. {unit} in {context}); skipped only by fastci run, which runs it "
                "after any failure")
    reason = Reason(DecisionKind.PRUNED, sentence, unit=unit,
                    via="stand-ins: " + ", ".join(p.stand_ins), stand_ins=p.stand_ins)
    return Decision(d.test, (reason,) + tuple(d.reasons), d.est_gpu_s, 0.0)
