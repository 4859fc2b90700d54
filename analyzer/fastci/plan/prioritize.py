"""Prioritize: order a plan's selected tests by the configured strategy.

The strategies themselves are pure (:mod:`fastci.select.priority`); this step reads
what they score with -- each test's cost at its planned workload, its recent outcomes
and failures at commits that changed the same paths (git), the contexts of the changed
units it ran, its line facts, its declared scope and check -- and reorders.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping, Sequence

from fastci.changes.scan import ChangeSet
from fastci.errors import GitError
from fastci.integrations.git.repository import Git
from fastci.plan.analysis import Analysis
from fastci.plan.reduce import Choice, planned_cost
from fastci.select import Selection
from fastci.select.priority import (INPUT_BASED, RISK_BASED, STRATEGIES, RiskFacts, cofailure,
                                    failed_outcome, input_tokens, order, reorder)
from fastci.select.test_rules import DeclaredTest, EvidenceReader
from fastci.types import RelPath, TestId, UnitId

if TYPE_CHECKING:
    from fastci.select.lines import Reach

LOG = logging.getLogger(__name__)


#: Commits: where a test's runs were recorded (its history) and what the change changes.
History = tuple[Git, frozenset[RelPath]]


def changed_paths(changes: ChangeSet | None) -> frozenset[RelPath]:
    """Every path the change touches (both sides of a rename; :attr:`ChangeSet.paths`)."""
    return frozenset(changes.paths) if changes is not None else frozenset()


def prioritized(selection: Selection, store: EvidenceReader, choices: Mapping[TestId, Choice],
                strategy: str, lines: Mapping[TestId, Sequence[Reach]] | None = None, *,
                history: History | None = None,
                declared: Mapping[TestId, DeclaredTest] | None = None) -> Selection:
    """The selected tests in the order of the ``priority`` strategy (fastci.select.priority),
    scored with their expected cost at the planned workload, their recorded outcomes (with
    ``history``: also their failures at commits that changed the same paths) and, where
    line evidence speaks for them, how many changed lines they ran."""
    strategy = _affordable(strategy, selection, log=True)
    # Only the history-aware strategies pay for reading the tests' recent runs, and only
    # the input-aware ones for the contexts of the changed units.
    risky = strategy in RISK_BASED
    facts = _risk_facts(selection, store, choices, lines, history=risky,
                        inputs=strategy in INPUT_BASED, commits=history if risky else None,
                        declared=declared)
    return reorder(selection, lambda d: facts[d.test], STRATEGIES[strategy])


def strategy_orders(analysis: Analysis, store: EvidenceReader, git: Git | None = None,
                    declared: Mapping[TestId, DeclaredTest] | None = None
                    ) -> dict[str, list[TestId]]:
    """The analysis's selected tests in the order of every prioritization strategy
    (:data:`fastci.select.priority.STRATEGIES`), as ``fastci plan`` would order them
    with ``priority:`` set to it (``git``: the repository, for failures at commits that
    changed the same paths; ``declared``: the tests' declarations, for their scopes
    and checks); {} when the selection was widened (nothing to order).
    What the strategies read is read once for all of them."""
    selection = analysis.selection
    if selection.widen:
        return {}
    used = {name: _affordable(name, selection) for name in STRATEGIES}
    facts = _risk_facts(selection, store, analysis.choices, analysis.lines, history=True,
                        inputs=bool(INPUT_BASED & set(used.values())),
                        commits=(git, changed_paths(analysis.changes)) if git else None,
                        declared=declared)
    return {name: [d.test for d in order(selection.selected, lambda d: facts[d.test],
                                          STRATEGIES[strategy])]
            for name, strategy in used.items()}


def _affordable(strategy: str, selection: Selection, log: bool = False) -> str:
    """``strategy``, or ``reasons`` when it reads the tests' inputs and more than
    :data:`INPUTS_MAX_TESTS` tests are selected."""
    if strategy not in INPUT_BASED or len(selection.selected) <= INPUTS_MAX_TESTS:
        return strategy
    if log:
        LOG.info("%d tests selected (more than %d): ordered by their reasons, without "
                 "reading their inputs and histories", len(selection.selected), INPUTS_MAX_TESTS)
    return "reasons"


#: Runs per test read for its failures at commits that changed the same paths, and the
#: most distinct commits whose paths one plan asks git for (one ``git log``).
HISTORY_RUNS = 20
HISTORY_COMMITS = 2000


def _risk_facts(selection: Selection, store: EvidenceReader, choices: Mapping[TestId, Choice],
                lines: Mapping[TestId, Sequence[Reach]] | None, *, history: bool,
                inputs: bool, commits: History | None = None,
                declared: Mapping[TestId, DeclaredTest] | None = None) -> dict[TestId, RiskFacts]:
    """What a strategy may know of each selected test: its cost at the planned workload
    and its line facts; with ``history`` its recent outcomes (one query per chunk of
    tests when the store has ``recent_outcomes``) and, with ``commits`` too, its failure
    history correlated with the changed paths (:func:`fastci.select.priority.cofailure`;
    the paths of the commits its runs were recorded at, from git); with ``inputs`` its
    inputs to the changed units (:func:`changed_unit_inputs`); from ``declared``, its
    scope and check."""
    tests = [d.test for d in selection.selected]
    recent: Mapping[TestId, tuple[str, ...]] = {}
    correlated: dict[TestId, float] = {}
    if history:
        with_commits = getattr(store, "recent_runs", None)
        batch = getattr(store, "recent_outcomes", None)
        runs = getattr(store, "runs_of_test", None)
        if commits is not None and commits[1] and with_commits is not None:
            got = with_commits(tests, HISTORY_RUNS)
            recent = {t: tuple(o for o, _ in r[:10]) for t, r in got.items()}
            correlated = _correlated(got, *commits)
        elif batch is not None:
            recent = batch(tests)
        elif runs is not None:
            recent = {t: tuple(r.outcome for r in reversed(runs(t))) for t in tests}
    given = changed_unit_inputs(selection, store) if inputs else {}
    out: dict[TestId, RiskFacts] = {}
    for d in selection.selected:
        reach = (lines or {}).get(d.test)
        decl = (declared or {}).get(d.test)
        out[d.test] = RiskFacts(d, planned_cost(d, choices), recent.get(d.test, ()),
                                sum(r.ran for r in reach) if reach else None,
                                given.get(d.test, {}), correlated.get(d.test, 0.0),
                                decl.scope if decl else (),
                                decl.check if decl and "check" not in decl.defaulted else None)
    return out


def _correlated(runs: Mapping[TestId, Sequence[tuple[str, str | None]]], git: Git,
                changed: frozenset[RelPath]) -> dict[TestId, float]:
    """:func:`fastci.select.priority.cofailure` of each test that failed in one of ``runs``
    (one that never failed scores 0: git is asked only about its failing tests' commits)."""
    failing = {t: r for t, r in runs.items() if any(failed_outcome(o) for o, _ in r)}
    wanted = list(dict.fromkeys(c for r in failing.values() for _, c in r if c))
    if not wanted:
        return {}
    try:
        files_of = git.files_of_commits(wanted[:HISTORY_COMMITS])
    except GitError as exc:  # only the order loses a signal
        LOG.info("failure history by changed files not read: %s", exc)
        return {}
    return {t: cofailure(r, files_of, changed) for t, r in failing.items()}


#: Above this many selected tests, ``rare_inputs`` reads neither the contexts of the
#: changed units nor the tests' histories (about 0.07 s per 1,000 tests here; the
#: plan-time budget is 2 s at 100,000 tests) and orders as ``reasons`` does.
INPUTS_MAX_TESTS = 5000


def changed_unit_inputs(selection: Selection, store: EvidenceReader
                        ) -> dict[TestId, dict[UnitId, frozenset[str]]]:
    """Per selected test, the input tokens (:func:`fastci.select.priority.input_tokens`)
    of the contexts its evidence recorded for each changed unit it reached
    (:func:`fastci.select.prune.changed_unit_contexts`: what pruning reads)."""
    from fastci.select.prune import changed_unit_contexts

    return {t: {u: input_tokens(contexts) for u, contexts in units.items() if contexts}
            for t, units in changed_unit_contexts(selection, store).items()}
