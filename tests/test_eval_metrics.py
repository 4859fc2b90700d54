"""The pure measures of ``fastci eval``: list scheduling on GPU slots, retention, misses."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.eval.metrics import (Job, first_failure, makespan, measure_arm, misses, retention,
                                 schedule, slot_cost)


def test_jobs_fill_the_slots_in_line_order() -> None:
    jobs = [Job("a", 2, 10.0), Job("b", 1, 4.0), Job("c", 1, 4.0), Job("d", 2, 1.0)]
    times = schedule(jobs, 3)
    # a (2) and b (1) start at once; c waits for b; d (2 GPUs) waits for a.
    assert times == {"a": (0.0, 10.0), "b": (0.0, 4.0), "c": (4.0, 8.0), "d": (10.0, 11.0)}
    assert makespan(times) == 11.0


def test_a_smaller_test_backfills_what_the_head_of_the_line_cannot_use() -> None:
    times = schedule([Job("x", 1, 5.0), Job("big", 4, 1.0), Job("small", 1, 2.0)], 4)
    assert times["x"] == (0.0, 5.0)
    assert times["small"] == (0.0, 2.0)  # big does not fit beside x; small does
    assert times["big"] == (5.0, 6.0)


def test_cpu_tests_take_no_slot_and_oversized_tests_take_all() -> None:
    times = schedule([Job("gpu", 2, 3.0), Job("cpu", 0, 3.0), Job("huge", 8, 1.0)], 2)
    assert times["cpu"] == (0.0, 3.0)
    assert times["huge"] == (3.0, 4.0)  # needs 8 of 2: runs alone on both
    assert slot_cost(Job("cpu", 0, 3.0)) == 3.0 and slot_cost(Job("huge", 8, 1.0)) == 8.0


def test_first_failure_and_the_arm() -> None:
    jobs = [Job("slow", 1, 10.0, failed=True), Job("fast", 1, 1.0, failed=True)]
    assert first_failure(jobs, schedule(jobs, 2)) == 1.0
    assert first_failure(jobs, schedule(jobs, 1)) == 10.0
    arm = measure_arm(jobs, 1, lead_s=0.5)
    assert arm.latency_s == 11.5 and arm.ttff_s == 10.5 and arm.failing == ("fast", "slow")
    assert arm.gpu_s == 11.0 and arm.apfdc is not None
    assert measure_arm([Job("ok", 1, 1.0)], 1).ttff_s is None


def test_retention_counts_changed_lines_run_all_executed() -> None:
    changed = {"m.py": {3, 4, 9}}
    run_all = [{"m.py": frozenset({3, 4})}, {"m.py": frozenset({1})}]
    plan = [{"m.py": frozenset({4, 9})}]  # 9: the plan ran it, run-all did not
    assert retention(changed, run_all, plan) == (2, 1)
    assert retention({}, run_all, plan) == (0, 0)


def test_misses_are_failing_tests_the_plan_did_not_see_fail() -> None:
    assert misses(["a", "b", "c"], ["b"]) == ["a", "c"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 50.0)), min_size=0, max_size=12),
       st.integers(1, 6))
def test_schedule_never_oversubscribes_and_is_bounded(specs: list[tuple[int, float]],
                                                      slots: int) -> None:
    jobs = [Job(f"t{i}", g, d) for i, (g, d) in enumerate(specs)]
    times = schedule(jobs, slots)
    assert set(times) == {j.test for j in jobs}
    for j in jobs:
        start, end = times[j.test]
        assert start >= 0 and abs((end - start) - j.duration_s) < 1e-9
    # At every start time, the GPUs in use fit in the slots.
    for t in {s for s, _e in times.values()}:
        used = sum(min(j.gpus, slots) for j in jobs
                   if times[j.test][0] <= t < times[j.test][1])
        assert used <= slots
    span = makespan(times)
    assert span <= sum(j.duration_s for j in jobs) + 1e-9
    assert span >= max((j.duration_s for j in jobs), default=0.0) - 1e-9
