"""The measures of ``fastci eval``, as pure functions of measured runs (docs/EVAL.md).

- **GPU-seconds**: each test's measured duration x max(its GPUs, 1) (a CPU test
  holds one slot while it runs), summed.
- **Latency on G slots**: the test runs replayed with their measured durations on
  ``G`` GPU slots by list scheduling, the rule ``fastci run`` obeys
  (:func:`fastci.run.schedule.grants`): whenever slots free up, the waiting tests
  in line order that fit take them; a test without GPUs starts at once. A test that
  declares more GPUs than there are slots takes all of them (it could not run
  otherwise). FastCI's latency adds its own analysis time in front.
- **Time to first failure**: when the first failing test ends, on that schedule.
- **Retention**: changed lines run-all executed (in any test) that the plan's runs
  executed too, over the changed lines run-all executed.
- **Detection**: a test failing under run-all is *caught* when the plan ran it and
  saw it fail; every other one is a miss.
- **APFDc**: :func:`fastci.select.priority.apfdc` over the arm's order and measured
  costs, each failing test a fault.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from fastci.run.schedule import Waiter, grants
from fastci.select.priority import apfdc
from fastci.types import RelPath, TestId


@dataclass(frozen=True)
class Job:
    """One test run to place on the slots: its id, GPUs, measured seconds, whether it failed."""

    test: TestId
    gpus: int
    duration_s: float
    failed: bool = False


def slot_cost(job: Job) -> float:
    """GPU-seconds of one run (a CPU test counts as one slot)."""
    return max(job.duration_s, 0.0) * max(job.gpus, 1)


def schedule(jobs: Sequence[Job], slots: int) -> dict[TestId, tuple[float, float]]:
    """Start and end time of every job by list scheduling on ``slots`` GPU slots.

    ``jobs`` are in line order (first = highest priority). Event-driven: at time 0
    and whenever a job ends, :func:`grants` picks the waiting jobs that start.
    """
    slots = max(slots, 1)
    need = {j.test: min(j.gpus, slots) for j in jobs}
    by_test = {j.test: j for j in jobs}
    waiting = [Waiter(j.test, rank, need[j.test]) for rank, j in enumerate(jobs)]
    running: list[tuple[float, int, TestId]] = []  # (end, rank, test) heap
    times: dict[TestId, tuple[float, float]] = {}
    now, free = 0.0, slots
    while waiting or running:
        for w in grants(waiting, free):
            end = now + max(by_test[w.test].duration_s, 0.0)
            times[w.test] = (now, end)
            heapq.heappush(running, (end, w.rank, w.test))
            free -= w.gpus
            waiting.remove(w)
        if not running:  # nothing runs and nothing fits: cannot happen (need <= slots)
            break
        now, _rank, done = heapq.heappop(running)
        free += need[done]
        while running and running[0][0] <= now:
            free += need[heapq.heappop(running)[2]]
    return times


def makespan(times: Mapping[TestId, tuple[float, float]]) -> float:
    """When the last job ends (0 for none)."""
    return max((end for _start, end in times.values()), default=0.0)


def first_failure(jobs: Iterable[Job], times: Mapping[TestId, tuple[float, float]]) -> float | None:
    """When the first failing job ends (None: none failed)."""
    ends = [times[j.test][1] for j in jobs if j.failed and j.test in times]
    return min(ends) if ends else None


@dataclass(frozen=True)
class ArmMeasure:
    """One arm on the slots: cost, latency, first failure, order quality."""

    gpu_s: float
    latency_s: float
    ttff_s: float | None
    apfdc: float | None
    failing: tuple[TestId, ...]


def measure_arm(jobs: Sequence[Job], slots: int, *, lead_s: float = 0.0) -> ArmMeasure:
    """Cost, latency (``lead_s`` first: the analysis), TTFF and APFDc of ``jobs`` in order."""
    times = schedule(jobs, slots)
    first = first_failure(jobs, times)
    failing = tuple(sorted(j.test for j in jobs if j.failed))
    order = [j.test for j in jobs]
    return ArmMeasure(
        gpu_s=sum(slot_cost(j) for j in jobs),
        latency_s=lead_s + makespan(times),
        ttff_s=None if first is None else lead_s + first,
        apfdc=apfdc(order, {j.test: slot_cost(j) for j in jobs}, failing),
        failing=failing)


def retention(changed: Mapping[RelPath, set[int]],
              run_all: Iterable[Mapping[RelPath, frozenset[int]]],
              plan: Iterable[Mapping[RelPath, frozenset[int]]]) -> tuple[int, int]:
    """(changed lines run-all executed, of those the plan's runs executed)."""
    def covered(runs: Iterable[Mapping[RelPath, frozenset[int]]]) -> set[tuple[RelPath, int]]:
        out: set[tuple[RelPath, int]] = set()
        for lines in runs:
            for path, want in changed.items():
                out.update((path, n) for n in want & lines.get(path, frozenset()))
        return out

    seen = covered(run_all)
    kept = covered(plan) & seen
    return len(seen), len(kept)


def misses(failing_all: Iterable[TestId], plan_failing: Iterable[TestId]) -> list[TestId]:
    """Tests that failed under run-all and that the plan did not run and see fail."""
    caught = set(plan_failing)
    return sorted(t for t in set(failing_all) if t not in caught)
