"""Choosing each selected test's workload from its calibration (issue 13 item 2).

A selected test may run at a calibrated rung (:mod:`fastci.evidence.store.calibrations`)
cheaper than its full workload only when the rung provably exercises the change
the way the full run does. For every reason the test was selected:

* it must be a changed function or method the test executes (``executes a changed
  unit``): a changed data file, a new test, a failure last time, an environment
  change... name nothing a rung can be shown to reach, and neither does import-time
  code (a module's or class's body, a rebound name: a *value* the run uses, whose
  effect may show only at some workloads), so the test runs at full workload;
* the calibration's version of the unit's file must be in the history (found by
  digest): the changed lines are the lines of that version that the change
  replaces or deletes, or that border an insertion, inside the unit (for a unit
  that only uses a rebound name: every line of it);
* the rung executed every such line the full-workload rung executed, every arc
  touching them, and ran the unit in every context the full rung did, the reduced
  dimensions' own values set aside (:func:`without_reduced_values`: a context that
  differs only in ``num_layers=4`` vs ``num_layers=1`` is the same context for a rung
  that reduces ``num_layers``; a derived value under another name is not) and the
  numbers that already vary within the full run set aside (:func:`varying_numbers`:
  per-call data such as indices and step counters; a number constant over the full
  run must match), and a number that moved exactly as a reduced dimension did
  accepted (:func:`same_but_moved`: ``hidden=64`` → ``hidden=32`` when ``hidden_size``
  goes 64 → 32).

The calibration must describe the plan's tree: every other unit the rungs ran, and the
import-time code of every file they ran, unchanged since the calibration's commit
(:func:`fastci.changes.since.drift`: a caller changed on main since may no longer take
the changed code at a small workload). And the change must not insert, remove or change
control flow (:attr:`fastci.changes.semantic_diff.UnitChange.control`): retention is
checked against the old code, and new code under ``if layer >= 2:`` sits among lines
every rung runs.

The rung must also have passed, be of the test's current declaration, keep every
dimension within its floor and constraints (frozen and scope-validated dimensions
never move: :func:`fastci.plan.workload.reducible_dims`), respect the floors learned
from escapes (:func:`learned_floors`), and cost less than the full rung. The
cheapest such rung wins. A test with an absolute reference (goldens, thresholds
recorded at one workload) is not reduced: no reference exists at another
workload. Anything unknown means full workload, and the reason says why.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from fastci.changes.since import drift
from fastci.changes.versions import Versions
from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.workload import (override_problems, reducible_dims, resolve_reduction)
from fastci.select.contexts import TOKEN, varying_numbers, without_data_values
from fastci.select.decisions import Decision, DecisionKind, Reason
from fastci.select.test_rules import DeclaredTest
from fastci.types import RelPath, TestId, UnitId
from fastci.units.index import FileUnits, UnitKind, index_source, split_unit_id
from fastci.units.lines import changed_hunks, line_ranges, source_lines

LOG = logging.getLogger(__name__)

#: Reasons a rung can be shown to reach (lines and contexts of a unit).
CODE_KINDS = frozenset({DecisionKind.CHANGED_UNIT, DecisionKind.USES_CHANGED_NAME})


@dataclass(frozen=True)
class Choice:
    """The workload chosen for one selected test.

    Attributes:
        overrides: what the test changes of its full workload (``{}``: full workload).
        why: the reduction and the evidence behind it, or why it runs at full workload.
        est_gpu_s: the chosen rung's measured cost (None: keep the selector's estimate).
        rung: the calibrated rung chosen (None: full workload).
    """

    overrides: Mapping[str, Any]
    why: str
    est_gpu_s: float | None = None
    rung: str | None = None

    @property
    def reduced(self) -> bool:
        """Whether the test runs below its full workload."""
        return bool(self.overrides)


@dataclass(frozen=True)
class Escape:
    """A test that failed at full workload on a commit where a reduced run of it passed."""

    test: TestId
    commit: str
    overrides: Mapping[str, Any]


def escapes(runs: Iterable[Any]) -> list[Escape]:
    """The escapes in a test's run history (``RunRecord``\\ s, oldest first).

    Per commit: a reduced run (known overrides, not empty) that passed, and a run at
    full workload (overrides ``{}``) that failed, in either order.
    """
    by_commit: dict[str, list[Any]] = {}
    for r in runs:
        if r.commit:
            by_commit.setdefault(r.commit, []).append(r)
    out = []
    for commit, rs in by_commit.items():
        if not any(r.full and r.outcome in ("failed", "error", "timeout") for r in rs):
            continue
        for r in rs:
            if r.overrides and r.outcome == "passed":
                out.append(Escape(r.test, commit, dict(r.overrides)))
    return out


def learned_floors(found: Sequence[Escape], decl: DeclaredTest) -> dict[str, tuple[Any, str]]:
    """Dimension -> (the value a rung must exceed, why), raised by escapes.

    A reduced run that passed where the full run failed shows that its workload was
    too small to catch the failure: every dimension it reduced must stay above the
    value it had. Declared floors are never lowered (the values are at or above them).
    """
    out: dict[str, tuple[Any, str]] = {}
    for e in found:
        for dim, value in sorted(e.overrides.items()):
            if dim not in (decl.workload or {}):
                continue
            if dim not in out or value > out[dim][0]:
                out[dim] = (value, f"escape at {e.commit[:12]}: passed at "
                                   f"{_overrides_text(e.overrides)}, failed at full workload")
    return out


def learned_floors_at(store_path: Path,
                      declared: Mapping[TestId, DeclaredTest]) -> dict[TestId, dict[str, tuple[Any, str]]]:
    """Test -> the floors its escapes raised (:func:`learned_floors`), from the run
    history in the evidence store at ``store_path``, for the tests that have any.

    No store: nothing was learned (``{}``). A store that cannot be read raises
    :class:`~fastci.errors.StoreError`: the caller decides whether to go on without
    the floors (``fastci targets`` only shows them) or stop (``fastci calibrate``).
    """
    if not store_path.is_file():
        return {}
    out: dict[TestId, dict[str, tuple[Any, str]]] = {}
    with EvidenceStore.open(store_path) as store:
        for test, decl in declared.items():
            found = learned_floors(escapes(store.runs_of_test(test)), decl)
            if found:
                out[test] = found
    return out


def choose(decisions: Sequence[Decision], declared: Mapping[TestId, DeclaredTest],
           calibration: CalibrationStore | None, versions: Versions | None,
           base: str | None, history: Callable[[TestId], Iterable[Any]] | None = None,
           calibration_error: str | None = None) -> dict[TestId, Choice]:
    """The workload of each selected test that declares something reducible (see the
    module docstring); tests whose declaration lets nothing shrink are left out.

    Args:
        decisions: the selected tests' decisions.
        declared: declarations by test (a test missing here runs at full workload).
        calibration: the calibration store (None: not calibrated; ``calibration_error``
            says why, e.g. the file is corrupt).
        versions: file versions of the change (head side and history lookups).
        base: the change's base commit (where calibrated versions are looked up too).
        history: a test's run history (for escapes); None: no escapes known.
    """
    out: dict[TestId, Choice] = {}
    for d in decisions:
        decl = declared.get(d.test)
        if decl is None or decl.workload is None or not reducible_dims(decl):
            continue  # nothing of it may shrink (frozen, performance, no declaration)
        try:
            out[d.test] = _choose_one(d, decl, calibration, versions, base,
                                      history, calibration_error)
        except Exception as exc:  # noqa: BLE001 - any doubt runs the full workload
            LOG.warning("workload of %s not reduced: %s: %s", d.test, type(exc).__name__, exc)
            out[d.test] = Choice({}, f"full workload: choosing a reduction failed ({exc})")
    return out


def _choose_one(d: Decision, decl: DeclaredTest, calibration: CalibrationStore | None,
                versions: Versions | None, base: str | None,
                history: Callable[[TestId], Iterable[Any]] | None,
                calibration_error: str | None) -> Choice:
    """The workload of one selected test: its cheapest usable calibrated rung that reaches
    the change the way the full run does, else full workload and why."""
    assert decl.workload is not None and reducible_dims(decl)
    why = _not_reducible(d, decl, calibration, versions, calibration_error)
    if why is not None:
        return Choice({}, f"full workload: {why}")
    assert calibration is not None and versions is not None
    rungs = _current_rungs(d.test, decl, calibration)
    if isinstance(rungs, str):
        return Choice({}, f"full workload: {rungs}")
    current, full = rungs
    needs = _needs_of(d, full, versions, base)
    if isinstance(needs, str):
        return Choice({}, f"full workload: {needs}")
    learned = learned_floors(escapes(history(d.test)) if history else [], decl)
    return _cheapest(current, full, decl, needs, learned, versions, base)


def _not_reducible(d: Decision, decl: DeclaredTest, calibration: CalibrationStore | None,
                   versions: Versions | None, calibration_error: str | None) -> str | None:
    """Why no rung can be considered for ``d`` whatever the calibration holds (None: one can)."""
    if resolve_reduction(decl).reference == "absolute":
        return ("its reference is absolute (recorded at its full workload); no reference "
                "was recorded at a reduced workload")
    other = [r for r in d.reasons if r.kind not in CODE_KINDS]
    if other:
        return (f"selected for a reason that names no changed code ({other[0].kind.value}); "
                "nothing shows a reduced run reaches it")
    if calibration is None:
        return calibration_error or "not calibrated (`fastci calibrate`)"
    if versions is None:
        return "no file versions to compare the calibration with"
    return None


def _current_rungs(test: TestId, decl: DeclaredTest, calibration: CalibrationStore
                   ) -> tuple[list[Rung], Rung] | str:
    """The test's rungs calibrated under its declaration as it is now, and the passing
    full-workload one among them; or why there are none."""
    rungs = calibration.rungs(test)
    if not rungs:
        return "not calibrated (`fastci calibrate`)"
    digest = declaration_digest(decl)
    current = [r for r in rungs if r.declaration == digest]
    if not current:
        return "its calibration is stale (the declaration changed since); calibrate it again"
    full = next((r for r in current if r.rung == "full" and not r.overrides), None)
    if full is None or not full.usable:
        return "no passing full-workload calibration rung"
    return current, full


def _needs_of(d: Decision, full: Rung, versions: Versions, base: str | None
              ) -> list[_Need] | str:
    """What a rung must reach for each of ``d``'s reasons; or why no rung can."""
    needs: list[_Need] = []
    for reason in d.reasons:
        need = _need(reason, full, versions, base)
        if isinstance(need, str):
            return need
        needs.append(need)
    # The rungs describe the tree they were calibrated at: every other unit they ran (a
    # caller, a config class) must be as it was then (issue 34: a caller changed on main
    # since made a one-layer rung reach the change zero times).
    stale = drift(full, versions, frozenset(n.unit for n in needs), base)
    if stale is not None:
        return f"{stale}: the calibration may not describe this tree; calibrate again"
    return needs


def _cheapest(current: list[Rung], full: Rung, decl: DeclaredTest, needs: list[_Need],
              learned: Mapping[str, tuple[Any, str]], versions: Versions,
              base: str | None) -> Choice:
    """The first (cheapest) rung of ``current`` that keeps the floors, constraints and
    learned floors and reaches every need; else full workload, with the first rejection."""
    assert decl.workload is not None
    dims = reducible_dims(decl)
    allowed = frozenset(n.unit for n in needs)
    workload = dict(decl.workload)
    rejected: list[str] = []
    for rung in current:
        if not _of_calibration(rung, full) or rung.gpu_s >= full.gpu_s:
            continue
        if override_problems(workload, decl.floors, decl.constraints, rung.overrides):
            continue
        if any(dim in dims and {**workload, **rung.overrides}[dim] <= value
               for dim, (value, _) in learned.items()):
            continue
        missing = next((m for n in needs if (m := n.missing(rung, workload))), None) \
            or drift(rung, versions, allowed, base)
        if missing:
            rejected.append(f"{rung.rung}: {missing}")
            continue
        return Choice(dict(rung.overrides), _why(rung, full, workload, needs, learned),
                      rung.gpu_s, rung.rung)
    detail = f" ({rejected[0]})" if rejected else ""
    floors = ("; learned floors " + ", ".join(f"{k} > {v}" for k, (v, _) in sorted(learned.items()))
              if learned else "")
    return Choice({}, f"full workload: no cheaper calibrated rung reaches the change the way the "
                      f"full run does{detail}{floors}", full.gpu_s)


@dataclass(frozen=True)
class _Need:
    """What a rung must reach for one reason: lines, arcs and contexts of one unit."""

    unit: UnitId
    path: RelPath
    digest: str
    lines: frozenset[int]
    arcs: frozenset[tuple[int, int]]
    contexts: frozenset[str]

    def missing(self, rung: Rung, workload: Mapping[str, Any]) -> str | None:
        """What ``rung`` does not reach (None: everything); ``workload`` is the full one.

        Contexts are compared with the reduced dimensions' own values set aside
        (:func:`without_reduced_values`): a rung that shrinks ``num_layers`` runs a unit
        with ``num_layers=1`` where the full run had ``num_layers=4``, by construction;
        with the numbers that already vary within the full run set aside
        (:func:`varying_numbers`): per-call data such as an index or a step counter;
        and accepting a number that moved exactly as a reduced dimension did
        (:func:`same_but_moved`: the dimension under another name).
        """
        if rung.digests.get(self.path) != self.digest:
            return f"calibrated another version of {self.path}"
        lines = self.lines - rung.lines.get(self.path, frozenset())
        if lines:
            return f"does not execute {self.unit} lines {line_ranges(lines)}"
        arcs = self.arcs - rung.arcs.get(self.path, frozenset())
        if arcs:
            a, b = min(arcs)
            return f"does not take {self.unit}'s arc {a}->{b}"
        got = rung.units.get(self.unit)
        if got is None:
            return f"does not run {self.unit} in contexts {_contexts(self.contexts)}"
        reduced = {d: v for d, v in rung.overrides.items() if d in workload}
        want = without_reduced_values(self.contexts, {d: workload[d] for d in reduced})
        data = varying_numbers(want)
        have = without_data_values(without_reduced_values(got[1], reduced), data)
        moved = moved_values(workload, reduced)
        ctx = {c for c in without_data_values(want, data) - have
               if not any(same_but_moved(c, h, moved) for h in have)}
        if ctx:
            return f"does not run {self.unit} in contexts {_contexts(ctx)}"
        return None


def _of_calibration(rung: Rung, full: Rung) -> bool:
    """Whether ``rung`` is a reduced rung that passed and was recorded completely in the
    same calibration as the full-workload rung ``full`` (its commit and declaration).

    The one filter every use of rungs shares (:func:`choose`, :func:`superseding_rung`,
    :func:`no_cheaper_floor`): a rung left out of calibration because of another rung is
    sound only if a plan would have taken that other rung on the same terms. A rung of
    another calibration (a killed one, an older commit) is not comparable."""
    return (rung is not full and rung.usable and bool(rung.overrides)
            and rung.commit == full.commit and rung.declaration == full.declaration)


def reaches_all_of(rung: Rung, full: Rung, workload: Mapping[str, Any]) -> str | None:
    """What of the full-workload rung's coverage ``rung`` misses (None: nothing).

    Everything: each file's version, every line and arc the full rung executed, every
    unit it ran in every context it ran it in (compared as a plan compares them:
    :meth:`_Need.missing`). A rung that misses nothing passes that comparison for any
    change of code the full run executes, so a plan can always take it where it could
    take a rung that reduces less (:func:`superseding_rung`). ``workload`` is the full one.
    """
    for path, digest in full.digests.items():
        if rung.digests.get(path) != digest:
            return f"calibrated another version of {path}"
    for path, lines in full.lines.items():
        missed = lines - rung.lines.get(path, frozenset())
        if missed:
            return f"does not execute {path} lines {line_ranges(missed)}"
    for path, arcs in full.arcs.items():
        missed_arcs = arcs - rung.arcs.get(path, frozenset())
        if missed_arcs:
            a, b = min(missed_arcs)
            return f"does not take {path}'s arc {a}->{b}"
    for unit, (_checksum, contexts) in full.units.items():
        path, _qualname = split_unit_id(unit)
        if path not in full.digests:
            continue  # a plan never reduces for it (``_need``: "never executed")
        missing = _Need(unit, path, full.digests[path], frozenset(), frozenset(),
                        contexts).missing(rung, workload)
        if missing:
            return missing
    return None


def _value(workload: Mapping[str, Any], overrides: Mapping[str, Any], dim: str) -> Any:
    return overrides[dim] if dim in overrides else workload[dim]


def superseding_rung(overrides: Mapping[str, Any], measured: Iterable[Rung], full: Rung,
                     workload: Mapping[str, Any],
                     learned: Mapping[str, Any] | None = None) -> tuple[Rung, str] | None:
    """A measured rung that makes a rung at ``overrides`` useless to every plan, and why;
    None when there is none (the rung must be measured).

    A superseding rung passed and was recorded completely, at the full rung's commit and
    declaration, costs less than the full rung, reduces every dimension at least as
    far as ``overrides`` does (so it is expected to cost no more), keeps above each
    floor in ``learned`` (dimension -> the value a rung must exceed), and reaches all
    the full rung does (:func:`reaches_all_of`). Wherever a plan could choose the rung
    at ``overrides`` for a change, it can choose the superseding one: every check
    :func:`choose` makes of a rung (lines, arcs, contexts, versions, floors,
    constraints, cost) holds for it whatever the change.
    """
    learned = learned or {}
    for f in sorted(measured, key=lambda r: (r.gpu_s, r.rung)):
        if not _of_calibration(f, full) or f.gpu_s >= full.gpu_s:
            continue
        dims = set(f.overrides) | set(overrides)
        try:
            if any(d not in workload or _value(workload, f.overrides, d)
                   > _value(workload, overrides, d) for d in dims):
                continue
            if any(d in workload and _value(workload, f.overrides, d) <= v
                   for d, v in learned.items()):
                continue
        except TypeError:  # values that do not compare: it supersedes nothing
            continue
        if reaches_all_of(f, full, workload) is None:
            return f, (f"{f.rung} ({f.gpu_s:.1f} of {full.gpu_s:.1f} GPU-s) reduces at least "
                       "as far and reaches every line, arc and context the full run does")
    return None


def no_cheaper_floor(overrides: Mapping[str, Any], measured: Iterable[Rung], full: Rung,
                     floors: Mapping[str, Any]) -> tuple[Rung, str] | None:
    """For a rung that takes one dimension part of the way to its floor (a midpoint):
    the measured rung at that floor alone, when it passed and cost no less than the full
    rung, and why; else None.

    A plan never takes a rung that costs as much as the full one (:func:`choose`). If
    the floor of a dimension does not cut the cost (``micro_batch_size=1`` at a fixed
    global batch runs more, smaller steps), a point between the floor and the full
    value is not expected to either. This only bets on savings: a rung left out is one
    a plan cannot choose, so the test runs larger, never less covered.
    """
    if len(overrides) != 1:
        return None
    ((dim, value),) = overrides.items()
    if dim not in floors or value == floors[dim]:
        return None
    for f in measured:
        if (_of_calibration(f, full) and dict(f.overrides) == {dim: floors[dim]}
                and f.gpu_s >= full.gpu_s):
            return f, (f"{f.rung} cost {f.gpu_s:.1f} GPU-s, no less than the full run's "
                       f"{full.gpu_s:.1f}: shrinking {dim} does not cut the cost, so a value "
                       "between is not expected to")
    return None


def moved_values(workload: Mapping[str, Any], reduced: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """(full value, reduced value) of each reduced dimension, rendered as contexts render
    numbers (:func:`fastci.evidence.record.contexts.abstract`)."""
    from fastci.evidence.record.contexts import abstract

    return frozenset((abstract(workload[d]), abstract(v)) for d, v in reduced.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))


def same_but_moved(full: str, rung: str, moved: frozenset[tuple[str, str]]) -> bool:
    """Whether two signatures differ only in numeric tokens whose value moved exactly as a
    reduced dimension did: ``hidden=64`` on the full rung, ``hidden=32`` on a rung that
    takes ``hidden_size`` from 64 to 32 (the dimension under another name)."""
    if not moved:
        return False
    a, b = list(TOKEN.finditer(full)), list(TOKEN.finditer(rung))
    if len(a) != len(b) or TOKEN.sub("=", full) != TOKEN.sub("=", rung):
        return False
    return all(x.group(1) == y.group(1) and (x.group(2) == y.group(2)
                                             or (x.group(2), y.group(2)) in moved)
               for x, y in zip(a, b))


def without_reduced_values(contexts: Iterable[str], values: Mapping[str, Any]) -> frozenset[str]:
    """``contexts`` with each ``dim=value`` token of ``values`` written ``dim=*``.

    A token is an argument, a dataclass field, a ``**kwargs`` entry or a label whose
    name is a reduced dimension and whose value is that dimension's value on this side
    (the full value on the full rung, the reduced one on the rung), rendered as
    contexts render scalars (:func:`fastci.evidence.record.contexts.abstract`). Everything
    else must still match exactly: a derived value under another name
    (``layers_per_stage=2``), a tensor's size class, a dtype, a parallel degree. A
    token of the same name holding some other value is kept, so it must match too.
    """
    from fastci.evidence.record.contexts import abstract

    if not values:
        return frozenset(contexts)
    own = {dim: abstract(value) for dim, value in values.items()}

    def star(m: re.Match[str]) -> str:
        return f"{m.group(1)}=*" if own.get(m.group(1)) == m.group(2) else m.group(0)

    return frozenset(TOKEN.sub(star, sig) for sig in contexts)


def _need(reason: Reason, full: Rung, versions: Versions, base: str | None) -> _Need | str:
    """What a rung must reach for ``reason``, or why nothing can be shown (a string)."""
    if reason.unit is None:
        return f"{reason.sentence}: names no unit"
    path, qualname = split_unit_id(reason.unit)
    digest = full.digests.get(path)
    if digest is None:
        return f"its full-workload calibration never executed {path}"
    revs = [c for c in (full.commit, base) if c and not c.startswith("dirty:")]
    old = versions.find(path, digest, revs)
    if old is None:
        return (f"the version of {path} it was calibrated with is not in the history "
                "(calibrated from a modified tree or another branch)")
    index = index_source(path, old)
    if not isinstance(index, FileUnits):
        return f"{path} as calibrated does not parse"
    unit = index.by_qualname().get(qualname)
    if unit is None:
        return f"{reason.unit} is not in the version of {path} it was calibrated with"
    if unit.kind is not UnitKind.FUNCTION or reason.kind is DecisionKind.USES_CHANGED_NAME:
        # Import-time code (a module's or a class's body: defaults, constants) runs once,
        # the same way at every workload; what changes is a value the rest of the run
        # uses, and whether that shows depends on the workload (an eps that matters only
        # at some sizes). Lines cannot show a rung reaches it. Measured: a changed
        # config default escaped at the floors rung of a tp parity test.
        return (f"{reason.unit} changed at import time (a value the run uses, not code "
                "a rung can be shown to execute the same way)")
    now = versions.now(path)
    change = next((u for u in versions.diff(path, old).units if u.unit == reason.unit), None) \
        if now is not None else None
    if change is not None and change.control:
        # Retention is checked against the old code: new code under a new condition (`if
        # layer >= 2:`), a new loop bound or a `break` sits among lines every rung runs,
        # yet only some workloads take it (issue 34: 1 layer chosen for a change that
        # shows only at 4).
        return (f"{reason.unit}: {change.control}; retention of the old code's lines cannot "
                "show that a reduced run takes the new path")
    span = {ln for ln in range(unit.body_start, unit.end + 1)
            if index.unit_for_line(ln).qualname == qualname}
    changed = _changed_lines(old, now) & span
    executed = full.lines.get(path, frozenset())
    if reason.unit not in full.units:
        return (f"its full-workload calibration did not run {reason.unit}, which its evidence "
                "executes")
    arcs = frozenset(a for a in full.arcs.get(path, frozenset())
                     if a[0] in changed or a[1] in changed)
    return _Need(reason.unit, path, digest, frozenset(changed & executed), arcs,
                 full.units[reason.unit][1])


def _changed_lines(old: bytes, new: bytes | None) -> set[int]:
    """Lines (1-based) of ``old`` that ``new`` replaces or deletes, and both neighbours of
    each insertion."""
    if new is None:
        return set(range(1, len(source_lines(old)) + 1))
    out: set[int] = set()
    for tag, i1, i2 in changed_hunks(old, new):
        if tag in ("replace", "delete"):
            out.update(range(i1 + 1, i2 + 1))
        elif tag == "insert":
            out.update({i1, i1 + 1})
    return out


def _why(rung: Rung, full: Rung, workload: Mapping[str, Any], needs: Sequence[_Need],
         learned: Mapping[str, tuple[Any, str]]) -> str:
    dims = ", ".join(f"{k} {workload[k]}\u2192{v}" for k, v in sorted(rung.overrides.items()))
    reach = "; ".join(
        f"{n.unit}" + (f" lines {line_ranges(n.lines)}" if n.lines else " (no changed line runs "
                                                                      "at full workload)")
        + f" in contexts {_contexts(n.contexts)}" for n in needs)
    text = (f"reduced: {dims}: rung {rung.rung} ({rung.gpu_s:.1f} of {full.gpu_s:.1f} "
            f"GPU-s at calibration) reaches {reach} as the full run does")
    if learned:
        text += "; learned floors " + ", ".join(f"{k} > {v}" for k, (v, _) in sorted(learned.items()))
    return text


def _contexts(ctx: Iterable[str]) -> str:
    xs = sorted(ctx)
    shown = ", ".join(xs[:4]) + (f", +{len(xs) - 4} more" if len(xs) > 4 else "")
    return "{" + shown + "}"


def _overrides_text(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def planned_cost(d: Decision, choices: Mapping[TestId, Choice]) -> float | None:
    """A selected test's expected GPU-seconds at the workload the plan gives it: the chosen
    rung's calibrated cost when reduced, else the selector's estimate (None: unknown)."""
    c = choices.get(d.test)
    return c.est_gpu_s if c is not None and c.reduced and c.est_gpu_s is not None \
        else d.est_gpu_s
