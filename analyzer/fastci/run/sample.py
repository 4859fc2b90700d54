"""Escapes learned from reality: a sample of reduced tests re-run at full workload after
merge (issue 34 item 3).

A learned floor (:func:`fastci.plan.reduce.learned_floors`) needs a full-workload failure
and a reduced pass *at the same commit*, which a pull request's head almost never has:
its plan runs the test reduced, and nothing runs it full there. ``fastci run
--full-sample`` makes such pairs on main: after the plan ran (reduced tests at their
overrides), a deterministic sample of the reduced tests that passed runs again at full
workload, on the same tree, and is recorded. A test that fails at full workload there is
an escape: the run history now holds both runs at one commit, and every later plan keeps
that test above the workload that passed (:func:`fastci.plan.reduce.escapes`).

The sample is drawn per test, seeded by the commit: test ``T`` is drawn when
``sha256(commit, T)`` read as a number in [0, 1) is below the rate (config
``full_sample``). A rerun of the job at the same commit draws the same tests; a test's
draw does not depend on which other tests the plan holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from fastci.plan.model import PlannedTest
from fastci.types import TestId


@dataclass(frozen=True)
class Sampled:
    """A reduced test drawn for a full-workload run.

    Attributes:
        test: the test id.
        overrides: the workload its reduced run had.
        draw: its number in [0, 1) for this seed (drawn: below the rate).
    """

    test: TestId
    overrides: Mapping[str, Any]
    draw: float


def draw(seed: str, test: TestId) -> float:
    """The number in [0, 1) that decides whether ``test`` is sampled under ``seed``."""
    digest = hashlib.sha256(f"{seed}\0{test}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def sample(tests: Iterable[PlannedTest], rate: float, seed: str) -> list[Sampled]:
    """The reduced tests of ``tests`` (overrides not empty) drawn at ``rate``, in order."""
    out = []
    for t in tests:
        if t.overrides:
            u = draw(seed, t.id)
            if u < rate:
                out.append(Sampled(t.id, dict(t.overrides), u))
    return out


def overrides_text(overrides: Mapping[str, Any]) -> str:
    """``steps=2, layers=1``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(overrides.items()))


def drawn_why(s: Sampled, rate: float, seed: str) -> str:
    """Why ``s`` is in the sample (one line for a person)."""
    return (f"full-workload sample: drawn {s.draw:.3f} < {rate:g} (seed {seed[:12]}); "
            f"its reduced run at {overrides_text(s.overrides)} passed")


def verdict(s: Sampled, passed: bool | None) -> str:
    """What the full-workload run of ``s`` says about its reduction."""
    if passed is None:
        return "full-workload sample: no result (nothing learned)"
    if passed:
        return (f"full-workload sample: passed, as its reduced run at "
                f"{overrides_text(s.overrides)} did")
    floors = ", ".join(f"{k} > {v}" for k, v in sorted(s.overrides.items()))
    return (f"full-workload sample: ESCAPE: failed at full workload, passed at "
            f"{overrides_text(s.overrides)} on the same tree; its learned floors rise: {floors}")
