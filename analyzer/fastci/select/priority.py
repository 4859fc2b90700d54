"""Risk prioritization (issue 14 item 3): the order a plan's tests run in.

A :class:`Strategy` scores each selected test from :class:`RiskFacts` (its decision:
how directly and how much of the change it reaches; its recent outcomes: failures and
flakiness; its failures at commits that changed the same files; its expected cost);
tests run highest score first, and the plan's ``priority`` is the normalized rank (1.0
first). Strategies:

* ``reasons`` — by the kind of reason (failed last, modified, new, changed unit,
  ...), cheaper first within a kind: the order before prioritization existed.
* ``risk`` — :func:`risk`, ignoring cost.
* ``risk_per_cost`` — :func:`risk` per expected GPU-second (a square root, so a
  cheap, barely affected test does not jump ahead of an expensive, directly
  affected one).
* ``rare_inputs`` — the test's own state first (failed last, modified, new), then
  :func:`risk` plus how unusual the inputs are with which the test drives the changed
  units (:func:`input_rarity`), per square root of its expected GPU-seconds: when a
  bug fails many tests, the cheap ones find it early; when it fails few, it lives on a
  path few tests take, and the contexts those tests recorded for the changed unit
  (arguments, parallel degrees, dtypes, caller) hold values the others do not.
* ``rare_named`` — ``rare_inputs``' terms plus :func:`name_match` (what the test's id
  and declared scope say it is about, against the changed units it reaches), the sum
  scaled by the strength of its declared check.

:func:`apfdc` measures an order on real outcomes: the cost-cognizant average
percentage of faults detected (each failing test a fault of severity 1), 1.0 when
every failure comes first at no cost.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from fastci.select.contexts import NUMERIC, TOKEN, varying_numbers
from fastci.select.decisions import Decision, DecisionKind, Selection
from fastci.types import TestId, UnitId

__all__ = ["STRATEGIES", "DEFAULT", "Strategy", "RiskFacts", "apfdc", "cofailure", "order",
           "reorder", "risk", "input_tokens", "input_rarity", "name_match", "words"]

#: Evidence that a reason's test is affected, in [0, 1): the more direct, the higher.
DIRECTNESS = {
    DecisionKind.FAILED_LAST: 0.9,
    DecisionKind.MODIFIED_TEST: 0.85,
    DecisionKind.CHANGED_UNIT: 0.6,
    DecisionKind.COMPILED_CODE: 0.6,
    DecisionKind.NEW_TEST: 0.5,
    DecisionKind.USES_CHANGED_NAME: 0.45,
    DecisionKind.READ_CHANGED_FILE: 0.4,
    DecisionKind.DECLARED_INPUT: 0.4,
    DecisionKind.IMPORTS_CHANGED_MODULE: 0.3,
    DecisionKind.UNSEEN_CODE: 0.3,
    DecisionKind.STATIC_REACH: 0.3,
    DecisionKind.PATH_RULE: 0.3,
    DecisionKind.CHANGED_DISTRIBUTION: 0.25,
    DecisionKind.ENVIRONMENT_PACKAGES: 0.2,
    DecisionKind.UNPARSABLE_FILE: 0.2,
}
_OTHER = 0.1
#: Directness of a changed function whose changed lines the test's line evidence ran.
RAN_CHANGED_LINES = 0.8
#: Reasons about the test itself rather than the code it reaches: ``reasons``' first
#: groups, and what ``rare_inputs`` puts before any score.
_OWN_KINDS = (DecisionKind.FAILED_LAST, DecisionKind.MODIFIED_TEST, DecisionKind.NEW_TEST)
#: The order of ``reasons`` (kinds not listed come after, cheapest first).
_KIND_ORDER = [*_OWN_KINDS, DecisionKind.CHANGED_UNIT, DecisionKind.UNPARSABLE_FILE]


@dataclass(frozen=True)
class RiskFacts:
    """What a strategy may know about a selected test.

    Attributes:
        decision: the selection decision (its reasons).
        cost: expected GPU-seconds at the planned workload (None: unknown).
        recent: outcomes of its recorded runs, newest first (``passed``, ``failed``...).
        changed_lines_ran: how many lines that every run reaching the changed code
            executes its full-workload calibration ran (:mod:`fastci.select.lines`);
            None: no line evidence speaks for every reason of the test.
        inputs: per changed unit the test reached, the ``name=value`` tokens of the
            contexts its evidence recorded there (:func:`input_tokens`); empty when
            not read.
        cofailure: how often it failed when a commit changed the files this change
            changes (:func:`cofailure`), in [0, 1); 0 when unknown.
        scope: what its declaration says it validates (``scope``; empty: not declared).
        check: its declared check (``exact``, ``tolerance``...; None: not declared).
    """

    decision: Decision
    cost: float | None = None
    recent: tuple[str, ...] = ()
    changed_lines_ran: int | None = None
    inputs: Mapping[UnitId, frozenset[str]] = field(default_factory=dict)
    cofailure: float = 0.0
    scope: tuple[str, ...] = ()
    check: str | None = None


class Strategy(Protocol):
    """Scores a test; higher runs earlier. Ties run cheaper first, then by id.

    A strategy whose scores depend on the other selected tests too (``rare_inputs``)
    also has ``scores(facts) -> list[float]``, over all of them at once; :func:`order`
    calls it when present.
    """

    @property
    def name(self) -> str: ...

    def score(self, facts: RiskFacts) -> float: ...


def input_tokens(contexts: Iterable[str]) -> frozenset[str]:
    """The ``name=value`` tokens (:data:`~fastci.select.contexts.TOKEN`) of one unit's
    contexts in one test: the values of its arguments, of the configs and parallel
    state they carry, its caller and process labels. A number that varies within the
    test's own run of the unit is per-call data (:func:`varying_numbers`): its token
    reads ``name=#``, so a step counter is not an unusual input."""
    contexts = list(contexts)
    data = varying_numbers(contexts)
    out: set[str] = set()
    for sig in contexts:
        for m in TOKEN.finditer(sig):
            name, value = m.group(1), m.group(2)
            out.add(f"{name}=#" if name in data and NUMERIC.match(value) else f"{name}={value}")
    return frozenset(out)


def input_rarity(facts: Sequence[RiskFacts]) -> list[float]:
    """How unusual each test's inputs to the changed code are among the selected tests.

    For each changed unit, a token's weight is ``log(n / df)``: ``n`` the selected
    tests with contexts recorded there, ``df`` those whose contexts hold the token (an
    input every test gives weighs 0). A test's rarity is the sum of the weights of its
    tokens over the changed units it reached (inverse document frequency, the tests
    as documents).
    """
    holders: dict[UnitId, dict[str, int]] = {}
    reached: dict[UnitId, int] = {}
    for f in facts:
        for unit, tokens in f.inputs.items():
            reached[unit] = reached.get(unit, 0) + 1
            counts = holders.setdefault(unit, {})
            for tok in tokens:
                counts[tok] = counts.get(tok, 0) + 1
    return [sum(math.log(reached[unit] / holders[unit][tok])
                for unit, tokens in f.inputs.items() for tok in tokens)
            for f in facts]


def failed_outcome(outcome: str) -> bool:
    """Whether a recorded outcome counts as a failure in a test's history."""
    return outcome in ("failed", "error", "timeout")


def cofailure(runs: Iterable[tuple[str, str | None]], files_of: Mapping[str, frozenset[str]],
              changed: frozenset[str]) -> float:
    """A test's failure history correlated with the changed files, in [0, 1).

    ``runs``: its recorded (outcome, commit) pairs; ``files_of``: the paths each known
    commit changed (against its first parent). Of the runs at a commit that changed one
    of ``changed``, the share that failed, smoothed as ``failed / (runs + 1)``: one
    failure in one such run gives 0.5, two in two 0.67; none such, 0.
    """
    n = failed = 0
    for outcome, commit in runs:
        files = files_of.get(commit) if commit else None
        if files and not files.isdisjoint(changed):
            n += 1
            failed += failed_outcome(outcome)
    return failed / (n + 1)


def risk(facts: RiskFacts) -> float:
    """How likely the test is to fail on this change, in [0, 2).

    The reasons combine as independent evidence (1 - prod(1 - directness)), so a test
    that executes several changed units ranks above one that executes one; recent
    failures (of the last 10 runs) add up to 0.5; a flaky history (its outcomes flip
    back and forth) takes some of that back, since its failures say less; failures at
    commits that changed the files this change changes (:func:`cofailure`) add up to
    1 more (they speak of this change more than failures anywhere). Line
    evidence sharpens a body change: a test that ran changed lines counts each such
    reason as :data:`RAN_CHANGED_LINES`; one that ran none of them behaves as before the
    change (:mod:`fastci.select.lines`), so it goes last: its score is cut to a hundredth.
    """
    ran = facts.changed_lines_ran
    miss = 1.0
    for r in facts.decision.reasons:
        direct = DIRECTNESS.get(r.kind, _OTHER)
        if ran and r.kind is DecisionKind.CHANGED_UNIT:
            direct = RAN_CHANGED_LINES
        miss *= 1.0 - direct
    score = 1.0 - miss
    if ran == 0:
        score *= 0.01
    recent = facts.recent[:10]
    if recent:
        fails = sum(failed_outcome(o) for o in recent) / len(recent)
        flips = sum(failed_outcome(a) != failed_outcome(b) for a, b in zip(recent, recent[1:]))
        flaky = flips / max(len(recent) - 1, 1)
        score += 0.5 * fails * (1.0 - 0.5 * flaky)
    return score + facts.cofailure


@dataclass(frozen=True)
class _Reasons:
    name: str = "reasons"

    def score(self, facts: RiskFacts) -> float:
        return float(len(_KIND_ORDER) - _group(facts))


def _group(facts: RiskFacts) -> int:
    """The index in :data:`_KIND_ORDER` of the test's first-listed reason kind (its
    length when none is listed)."""
    kinds = {r.kind for r in facts.decision.reasons}
    return min((_KIND_ORDER.index(k) for k in kinds if k in _KIND_ORDER),
               default=len(_KIND_ORDER))


@dataclass(frozen=True)
class _Risk:
    name: str = "risk"

    def score(self, facts: RiskFacts) -> float:
        return risk(facts)


@dataclass(frozen=True)
class _RiskPerCost:
    name: str = "risk_per_cost"

    def score(self, facts: RiskFacts) -> float:
        return risk(facts) / math.sqrt(_cost(facts))


def _cost(facts: RiskFacts) -> float:
    """The expected GPU-seconds a per-cost score divides by: at least 1 (unknown: 1)."""
    return max(facts.cost, 1.0) if facts.cost is not None else 1.0


#: What one step of :func:`_own_state` weighs: more than any risk plus rarity.
_OWN_STATE = 1e6


def _own_state(facts: RiskFacts) -> int:
    """3 when the test failed last, 2 when the change modifies it, 1 when it is new, else 0."""
    return max(len(_OWN_KINDS) - _group(facts), 0)


_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
#: Words every test id or unit carries, which say nothing of what it is about.
_NOISE = frozenset({"test", "tests", "py", "self", "init", "main"})


def words(text: str) -> frozenset[str]:
    """The lower-case words of identifiers and paths in ``text`` (``snake_case``,
    ``camelCase``, path parts; one-letter words and :data:`_NOISE` left out)."""
    return frozenset(w for w in (m.lower() for m in _WORD.findall(text))
                     if len(w) > 1 and w not in _NOISE)


def _same_word(a: str, b: str) -> bool:
    """Equal, or one a prefix of the other of at least 4 letters (``optim``/``optimizer``)."""
    if a == b:
        return True
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    return len(short) >= 4 and long_.startswith(short)


def name_match(facts: Sequence[RiskFacts]) -> list[float]:
    """How much each test's name says it is about the changed code it reaches.

    Test-to-code traceability by naming: a test's words (its id: path, file, target
    or function names; its declared ``scope``) that also name the changed units it
    reaches (their path and qualified name), each weighted ``log((n + 1) / df)`` over
    the ``n`` selected tests, ``df`` of them carrying the word: a word in every test's
    id (the package, ``parity``) weighs little.
    """
    docs = [words(f.decision.test) | frozenset(w for s in f.scope for w in words(s))
            for f in facts]
    n = len(facts)
    df: dict[str, int] = {}
    out = []
    for f, doc in zip(facts, docs):
        changed = frozenset(w for r in f.decision.reasons if r.unit for w in words(r.unit))
        total = 0.0
        for word in doc:
            if any(_same_word(word, c) for c in changed):
                if word not in df:
                    df[word] = sum(1 for d in docs if any(_same_word(word, x) for x in d))
                total += math.log((n + 1) / df[word])
        out.append(total)
    return out


#: How much a declared check's strength scales a score (``exact`` 1.1 ... ``completes``
#: 0.8; undeclared 1.0): a strict oracle sees more of what a change breaks.
_CHECK_WEIGHT = {"exact": 1.1, "tolerance": 1.0, "threshold": 0.9, "completes": 0.8}


@dataclass(frozen=True)
class _Rare:
    """``rare_inputs``; with ``named``, ``rare_named``."""

    name: str
    named: bool = False

    def score(self, facts: RiskFacts) -> float:
        return self.scores([facts])[0]

    def scores(self, facts: Sequence[RiskFacts]) -> list[float]:
        # The test's own state first (it failed last time, the change edits or adds it:
        # ``reasons``' first groups), then risk plus rarity per square root of the
        # expected GPU-seconds (as risk_per_cost); named: plus what the test's name says
        # (name_match), the sum scaled by the strength of its check.
        named = name_match(facts) if self.named else [0.0] * len(facts)
        return [_OWN_STATE * _own_state(f) + (risk(f) + r + m)
                * (_CHECK_WEIGHT.get(f.check or "", 1.0) if self.named else 1.0)
                / math.sqrt(_cost(f))
                for f, r, m in zip(facts, input_rarity(facts), named)]


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (_Reasons(), _Risk(), _RiskPerCost(),
                                                        _Rare("rare_inputs"),
                                                        _Rare("rare_named", named=True))}
#: The strategies that read :func:`risk`: recent outcomes and line facts (``reasons``
#: reads neither, so planning does not compute them for it).
RISK_BASED = frozenset({"risk", "risk_per_cost", "rare_inputs", "rare_named"})
#: The strategies that read the contexts of the changed units (:attr:`RiskFacts.inputs`).
INPUT_BASED = frozenset({"rare_inputs", "rare_named"})
#: The default: the best mean APFDc measured on the example's bench changes (docs/SELECTION.md,
#: "Order") among the strategies that do not lose on held-out faults (``rare_named`` scores
#: higher on the bench changes and lower on held-out faults: ``python -m bench.priority``).
#: fastci.config.Config.priority holds the same name (a test checks it).
DEFAULT = "rare_inputs"


def order(decisions: Sequence[Decision], facts: Callable[[Decision], RiskFacts],
          strategy: Strategy) -> list[Decision]:
    """``decisions`` (selected ones) highest score first, each with its ``priority``
    (1.0 for the first, falling evenly)."""
    known = [facts(d) for d in decisions]
    batch = getattr(strategy, "scores", None)
    values = batch(known) if batch is not None else [strategy.score(f) for f in known]
    scored = []
    for d, f, value in zip(decisions, known, values):
        cost = f.cost if f.cost is not None else math.inf
        scored.append((-value, cost, d.test, d))
    scored.sort(key=lambda s: s[:3])
    n = len(scored)
    return [replace(d, priority=round(1.0 - i / max(n, 1), 4))
            for i, (_, _, _, d) in enumerate(scored)]


def apfdc(tests: Sequence[TestId], cost: Mapping[TestId, float],
          failing: Iterable[TestId], *, one_fault: bool = False) -> float | None:
    """APFDc of running ``tests`` in this order (faults of severity 1).

    ``(sum over faults of (cost from the detecting test to the end - half its own
    cost)) / (total cost x faults)``. Each failing test is a fault; with ``one_fault``
    the change is the one fault, detected by its first failing test (what a developer
    waits for: the first red test). None when no test fails (nothing to detect) or
    nothing costs anything.
    """
    bad = [t for t in tests if t in set(failing)][:1 if one_fault else None]
    total = sum(max(cost.get(t, 0.0), 0.0) for t in tests)
    if not bad or total <= 0:
        return None
    remaining, after = total, {}
    for t in tests:
        after[t] = remaining
        remaining -= max(cost.get(t, 0.0), 0.0)
    return sum(after[t] - 0.5 * max(cost.get(t, 0.0), 0.0) for t in bad) / (total * len(bad))


def reorder(selection: Selection, facts: Callable[[Decision], RiskFacts],
            strategy: Strategy) -> Selection:
    """``selection`` with its selected tests in ``strategy``'s order (skipped ones after,
    unchanged); the plan lists tests in this order."""
    ordered = order(selection.selected, facts, strategy)
    skipped = [d for d in selection.decisions if not d.selected]
    return replace(selection, decisions=tuple(ordered + skipped))
