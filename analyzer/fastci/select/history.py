"""A test's failures ordered by git ancestry, not by clocks (issue 34 item 5).

Runs merged from several CI jobs arrive in any order: a retried job of an *older*
commit that passes is recorded after the job of the newer commit that failed. Ordered
by wall clock, that pass was "the last run" and the failure was forgotten, so the test
was skipped. Here a failure at commit F is cleared only by a pass at F recorded after it
(a retry) or by a pass at a descendant of F (the code that fixed it, or that carries
F's change and passed). Git decides descent, in one ``git rev-list`` for every test
(:meth:`fastci.integrations.git.repository.Git.parents_of_history`). Without an answer
(no repository, a shallow clone, a commit git does not hold, beyond the walk's limit)
the failure stands: the safe side. A failure recorded with no commit (a run outside
git) has no ancestry: the clock decides, as before.

A reduced pass never clears a full-workload failure (as :func:`fastci.select.test_rules.test_rules`).
Only each test's last :data:`HISTORY_RUNS` runs count: an older failure has aged out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

from fastci.errors import GitError
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.test_rules import Hits, add_hit
from fastci.types import Outcome, TestId, is_failure

LOG = logging.getLogger(__name__)

__all__ = ["HISTORY_RUNS", "HISTORY_COMMITS", "HistoryLike", "history_rules", "uncleared"]

#: Runs of a test whose failures count (newest first).
HISTORY_RUNS = 20
#: Commits of history git is asked for, from the passing commits back.
HISTORY_COMMITS = 20_000


class HistoryLike(Protocol):
    """One run of a failure history (:class:`fastci.evidence.store.db.HistoryRun`)."""

    @property
    def outcome(self) -> str: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def full(self) -> bool: ...


class _Graph(Protocol):
    def parents_of_history(self, tips: Iterable[str], limit: int) -> dict[str, tuple[str, ...]]: ...


@dataclass(frozen=True)
class _Ancestry:
    """Ancestor sets computed from a commit -> parents map (only what it holds)."""

    parents: Mapping[str, tuple[str, ...]]

    def ancestors(self, commit: str, cache: dict[str, frozenset[str]]) -> frozenset[str]:
        if commit not in cache:
            seen: set[str] = set()
            todo = [commit]
            while todo:
                c = todo.pop()
                for p in self.parents.get(c, ()):
                    if p not in seen:
                        seen.add(p)
                        todo.append(p)
            cache[commit] = frozenset(seen)
        return cache[commit]


def uncleared(runs: Sequence[HistoryLike], parents: Mapping[str, tuple[str, ...]]
              ) -> HistoryLike | None:
    """The newest failure among ``runs`` (newest first) that no pass clears, or None.

    A pass clears a failure when it is at least as full (a reduced pass never clears a
    full failure) and either at the failure's commit and recorded after it, or at a
    descendant of that commit (``parents``: commit -> parents, from git). A failure
    without a commit is cleared by any later pass (no ancestry to ask).
    """
    graph = _Ancestry(parents)
    cache: dict[str, frozenset[str]] = {}
    for i, failed in enumerate(runs):
        if not is_failure(failed.outcome):
            continue
        cleared = False
        for j, run in enumerate(runs):
            if run.outcome != Outcome.PASSED.value or (failed.full and not run.full):
                continue
            later = j < i
            if failed.commit is None or run.commit == failed.commit:
                cleared = later
            elif run.commit is not None:
                cleared = failed.commit in graph.ancestors(run.commit, cache)
            if cleared:
                break
        if not cleared:
            return failed
    return None


def history_rules(history: Mapping[TestId, Sequence[HistoryLike]], git: _Graph | None,
                  skip: Iterable[TestId] = ()) -> Hits:
    """A ``failed in its last run`` reason for each test whose newest run passed while
    an earlier failure is not cleared by ancestry (see the module docstring).

    Args:
        history: per test, its last runs, newest first (tests that failed among them:
            :meth:`fastci.evidence.store.db.EvidenceStore.failure_history`).
        git: the repository (None: no ancestry is known, every such failure stands).
        skip: tests already selected for a failure (their newest run failed).
    """
    done = set(skip)
    pending = {t: runs for t, runs in history.items()
               if t not in done and runs and not is_failure(runs[0].outcome)}
    if not pending:
        return {}
    tips = {r.commit for runs in pending.values() for r in runs
            if r.commit and r.outcome == Outcome.PASSED.value}
    parents: dict[str, tuple[str, ...]] = {}
    if git is not None and tips:
        try:
            parents = git.parents_of_history(tips, HISTORY_COMMITS)
        except GitError as exc:  # no answer: every hidden failure stands
            LOG.info("git ancestry of the test history not read: %s", exc)
    hits: Hits = {}
    for test in sorted(pending):
        runs = pending[test]
        failed = uncleared(runs, parents)
        if failed is None:
            continue
        newest = runs[0]
        known = newest.commit in parents
        add_hit(hits, test, Reason(
            DecisionKind.FAILED_LAST,
            f"it ended {failed.outcome!r} at {_short(failed.commit)}; no pass at that commit or "
            f"a descendant clears it (its newest run passed at {_short(newest.commit)}, "
            f"{'not a descendant' if known else 'and git could not tell their ancestry'})",
            via="safety rule: a failure is cleared only by a pass at its commit or a "
                "descendant (git ancestry, not the clock)"))
    return hits


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "an unknown commit"
