"""Safe test selection: which tests a change reaches, each with its reasons.

:func:`select_tests` is pure over its inputs (a :class:`~fastci.changes.scan.ChangeSet`,
the evidence store's read side, the config, the declared tests, the environment
fingerprint): it applies every rule (the change's in :mod:`fastci.select.change_rules`,
the tests' own in :mod:`fastci.select.test_rules`, and the rest), keeps the union,
and never drops a test without a reason. Gathering the inputs (git, SQLite, ``bazel
query``) happens in :mod:`fastci.plan.planner`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from fastci.changes.scan import ChangeSet
from fastci.config import Config
from fastci.select.decisions import (SKIP_KINDS, WIDEN_KINDS, Decision, DecisionKind, Reason,
                                     Selection)
from fastci.changes.versions import Versions
from fastci.select.change_rules import Baselines, change_rules
from fastci.select.inputs import declared_input_rules
from fastci.select.manifest_rules import environment_rules
from fastci.select.history import HISTORY_RUNS, history_rules
from fastci.select.test_rules import (DeclaredTest, EvidenceReader, RunLike,
                                      ignored_read_rules, test_rules)
from fastci.types import RelPath, TestId, as_label

LOG = logging.getLogger(__name__)

__all__ = ["select_tests", "widen_everything", "Selection", "Decision", "DecisionKind", "Reason",
           "DeclaredTest", "EvidenceReader"]

# Run order before prioritization exists: likely failures first, then cheap tests.
_ORDER = [DecisionKind.FAILED_LAST, DecisionKind.MODIFIED_TEST, DecisionKind.NEW_TEST,
          DecisionKind.CHANGED_UNIT, DecisionKind.UNPARSABLE_FILE]


def estimate_gpu_s(run: RunLike | None, decl: DeclaredTest | None) -> float | None:
    """Recorded duration x GPUs (declared GPUs win), None when never run."""
    if run is None:
        return None
    gpus = decl.gpus if decl is not None else run.gpus
    return round(float(run.duration_s) * max(int(gpus), 0), 3)


def _rank(d: Decision) -> tuple[int, float, str]:
    kinds = {r.kind for r in d.reasons}
    first = min((_ORDER.index(k) for k in kinds if k in _ORDER), default=len(_ORDER))
    cost = d.est_gpu_s if d.est_gpu_s is not None else float("inf")
    return first, cost, d.test


def _finish(decisions: list[Decision]) -> list[Decision]:
    selected = sorted((d for d in decisions if d.selected), key=_rank)
    n = len(selected)
    out = [Decision(d.test, d.reasons, d.est_gpu_s, round(1.0 - i / max(n, 1), 4))
           for i, d in enumerate(selected)]
    out += sorted((d for d in decisions if not d.selected), key=lambda d: d.test)
    return out


def select_tests(changes: ChangeSet, store: EvidenceReader, config: Config, *,
                 declared: Mapping[TestId, DeclaredTest] | None,
                 env_fingerprint: str | None,
                 environment: Mapping[str, Any] | None = None) -> Selection:
    """Decide every test of the universe (declared ∪ recorded) for ``changes``.

    Args:
        changes: what changed (see :func:`fastci.changes.scan.scan`).
        store: the evidence store's read side.
        config: the effective configuration.
        declared: the declared tests (``bazel query``), or None when unknown.
        env_fingerprint: the current environment fingerprint, None if unknown.
        environment: the test runner's whole environment
            (:func:`fastci.evidence.record.environment.environment_of_interpreter`), so evidence
            from an environment that differs only in packages a test never imported is
            kept; None: compared by fingerprint alone.
    """
    known = _known(store, declared, environment, env_fingerprint)
    versions = changes.versions or (Versions(changes.tree.git, changes.tree.head)
                                    if changes.tree is not None else None)
    baselines = Baselines.of(changes, store.baselines())

    def src_changed(test: TestId, path: str) -> bool:
        if versions is None:
            return path in changes.paths
        return baselines.src_changed(changes, versions, test, path)

    change_hits, widen, notes = change_rules(changes, store, config, known.universe, baselines,
                                             versions)
    imported = store.distributions_of_tests(sorted(known.with_evidence)) if known.env and any(
        r.env_fingerprint != known.env.get("fingerprint")
        for r in known.with_evidence.values()) else {}
    inputs: dict[RelPath, str | None] = {}
    hits: dict[TestId, list[Reason]] = {}
    for rule_hits in (test_rules(known.ordered, known.runs, declared, src_changed, known.evidence),
                      environment_rules(known.with_evidence, known.env, imported),
                      change_hits, ignored_read_rules(changes, store, inputs),
                      declared_input_rules(changes, store, config, known.with_evidence)):
        for test, reasons in rule_hits.items():
            hits.setdefault(test, []).extend(reasons)
    _add_failure_history(hits, store, changes, known.universe)
    decisions = _decisions(known, declared, hits, widen, changes)
    return Selection(tuple(_finish(decisions)), tuple(widen), tuple(changes.notes) + tuple(notes),
                     changes.summary() + _baseline_summary(changes, baselines),
                     tuple(sorted(inputs.items())))


@dataclass(frozen=True)
class _Known:
    """The tests a selection decides, and what it knows of them before any rule runs.

    ``universe``: declared ∪ recorded, less ``removed`` (recorded Bazel targets the build
    no longer declares: they cannot run), ``ordered`` sorted; ``evidence`` the recorded
    tests, ``runs`` their newest runs, ``with_evidence`` those of the universe; ``env``
    the test runner's environment (None: unknown).
    """

    universe: set[TestId]
    removed: set[TestId]
    ordered: list[TestId]
    evidence: set[TestId]
    runs: Mapping[TestId, RunLike]
    with_evidence: dict[TestId, RunLike]
    env: dict[str, Any] | None


def _known(store: EvidenceReader, declared: Mapping[TestId, DeclaredTest] | None,
           environment: Mapping[str, Any] | None, env_fingerprint: str | None) -> _Known:
    evidence_tests = set(store.test_ids())
    runs = store.latest_runs()
    universe = set(evidence_tests) | set(declared or ())
    removed: set[TestId] = set()
    if declared is not None:
        # A recorded Bazel target that the build no longer declares cannot run.
        removed = {t for t in evidence_tests
                   if (lab := as_label(t)) is not None and not lab.repo and str(lab) not in declared}
        universe -= removed
    env = dict(environment) if environment is not None else (
        {"fingerprint": env_fingerprint} if env_fingerprint else None)
    with_evidence = {t: r for t, r in runs.items() if t in universe and t in evidence_tests}
    # (test_rules sorts what it is given: once, here)
    return _Known(universe, removed, sorted(universe), evidence_tests, runs, with_evidence, env)


def _add_failure_history(hits: dict[TestId, list[Reason]], store: EvidenceReader,
                         changes: ChangeSet, universe: set[TestId]) -> None:
    """A failure hidden behind a newer-by-clock pass (a retried job of an older commit)
    stands until a pass at its commit or a descendant clears it (git ancestry)."""
    history = getattr(store, "failure_history", None)
    if history is None:
        return
    red = {t for t, reasons in hits.items()
           if any(r.kind is DecisionKind.FAILED_LAST for r in reasons)}
    failing = {t: r for t, r in history(HISTORY_RUNS).items() if t in universe}
    for test, reasons in history_rules(failing, changes.tree.git if changes.tree else None,
                                       red).items():
        hits.setdefault(test, []).extend(reasons)


def _decisions(known: _Known, declared: Mapping[TestId, DeclaredTest] | None,
               hits: Mapping[TestId, list[Reason]], widen: list[Reason],
               changes: ChangeSet) -> list[Decision]:
    """One decision per test of the universe (its reasons, or none reaches it; every
    test takes the plan-wide widenings), then one per test no longer declared."""
    decisions = []
    quiet = "no changed unit, file or rule reaches it" + (
        f" ({changes.summary()})" if changes.files or changes.others else " (nothing changed)")
    unaffected = Decision.sharing((Reason(
        DecisionKind.NOT_AFFECTED, quiet, via="evidence: none of its recorded units or files changed"),))
    get_run, get_decl, get_hits = known.runs.get, (declared or {}).get, hits.get
    for test in known.ordered:
        est = estimate_gpu_s(get_run(test), get_decl(test))
        found = get_hits(test)
        if found or widen:
            decisions.append(Decision(test, tuple((found or []) + widen), est))
        else:
            decisions.append(unaffected(test, est))
    for test in sorted(known.removed):
        decisions.append(Decision(test, (Reason(
            DecisionKind.NOT_DECLARED, f"{test} is in the evidence but no longer declared in "
            "the build", via="bazel query"),)))
    return decisions


def _baseline_summary(changes: ChangeSet, baselines: Baselines) -> str:
    """What the summary must say when tests were recorded elsewhere than at ``base``: each
    is compared with its own baseline, so the ``base``..``head`` diff is not all it sees."""
    other = {t: c for t, c in baselines.commits.items() if (c or "") != changes.base}
    if not other:
        return ""
    known = {c for c in other.values() if c and c in baselines.since}
    since: set[str] = set().union(*(baselines.since[c] for c in known)) if known else set()
    unknown = sum(1 for c in other.values() if not c or c not in baselines.since)
    parts = []
    n = len(other) - unknown
    if n:
        parts.append(f"{n} test{'s were' if n != 1 else ' was'} recorded at {len(known)} "
                     f"commit{'s' * (len(known) != 1)} other than the base, each compared "
                     f"with its own ({len(since)} file{'s' * (len(since) != 1)} changed since)")
    if unknown:
        parts.append(f"{unknown} test{'s have' if unknown != 1 else ' has'} no known "
                     "commit (compared file by file)")
    return " between base and head; " + "; ".join(parts)


def widen_everything(reason: Reason, store: EvidenceReader | None,
                     declared: Mapping[TestId, DeclaredTest] | None) -> Selection:
    """The plan for "something went wrong": every known test, with the reason."""
    tests: set[TestId] = set(declared or ())
    if store is not None:
        try:
            tests |= set(store.test_ids())
        except Exception as exc:  # noqa: BLE001 - widening must not fail
            LOG.warning("cannot list recorded tests while widening: %s", exc)
    decisions = [Decision(t, (reason,)) for t in sorted(tests)]
    return Selection(tuple(_finish(decisions)), (reason,), (), reason.sentence)


assert not (SKIP_KINDS & WIDEN_KINDS)
