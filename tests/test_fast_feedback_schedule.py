"""fastci.run.schedule: the order, the list-scheduling decision, the schedule file and queue."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.plan.model import Plan, PlannedTest
from fastci.run import gpus, schedule
from fastci.run.schedule import Waiter, decide, grants


def test_order_is_priority_first_then_plan_order_for_ties_and_none() -> None:
    tests = [PlannedTest("//a:low", priority=0.2), PlannedTest("//a:none1"),
             PlannedTest("//a:high", priority=1.0), PlannedTest("//a:none2"),
             PlannedTest("//a:tie1", priority=0.5), PlannedTest("//a:tie2", priority=0.5)]
    assert [t.id for t in schedule.order(tests)] == \
        ["//a:high", "//a:tie1", "//a:tie2", "//a:low", "//a:none1", "//a:none2"]


def test_the_first_in_line_that_fits_goes_and_later_ones_backfill() -> None:
    big, small, late = Waiter("//t:big", 0, 2), Waiter("//t:small", 1, 1), Waiter("//t:late", 2, 1)
    # One GPU free: the 2-GPU test ahead does not fit, the next one backfills.
    assert [w.test for w in grants([late, small, big], 1)] == ["//t:small"]
    assert decide(small, [big, late], 1).go
    turn = decide(late, [big, small], 1)
    assert not turn.go and "//t:small" in turn.why
    # Two free: the big one goes first and nothing is left.
    assert [w.test for w in grants([late, small, big], 2)] == ["//t:big"]
    assert not decide(small, [big, late], 2).go


def test_a_test_ahead_that_has_not_registered_holds_the_line() -> None:
    me = Waiter("//t:b", 1, 1)
    turn = decide(me, [], 4, unseen_ahead=["//t:a"])
    assert not turn.go and "//t:a" in turn.why
    assert decide(me, [], 4).go


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    """(slots, [(gpus, arrival tick, duration ticks)] in line order)."""
    slots = draw(st.integers(1, 4))
    jobs = draw(st.lists(st.tuples(st.integers(0, slots), st.integers(0, 6), st.integers(1, 4)),
                         min_size=1, max_size=8))
    return slots, jobs


@given(workloads(), st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_list_scheduling_invariants(case: tuple[int, list[tuple[int, int, int]]], rnd: object) -> None:
    """Launchers deciding one after another in any order, each on the state it sees:
    never more GPUs in use than slots, a waiting test ahead in line that fits is never
    passed over, and every test finishes."""
    import random
    assert isinstance(rnd, random.Random)
    slots, jobs = case
    waiting: dict[int, Waiter] = {}
    running: dict[int, int] = {}  # job -> tick it ends
    done: set[int] = set()
    in_use = 0
    for tick in range(200):
        for j in [j for j, end in running.items() if end <= tick]:
            in_use -= jobs[j][0]
            del running[j]
            done.add(j)
        for j, (g, arrival, _) in enumerate(jobs):
            if arrival == tick:
                waiting[j] = Waiter(f"//t:{j}", j, g)
        order = list(waiting)
        rnd.shuffle(order)
        for j in order:
            me = waiting[j]
            free = slots - in_use
            others = [w for k, w in waiting.items() if k != j]
            if not decide(me, others, free).go:
                continue
            assert me.gpus <= free  # the pool would refuse it anyway
            # Passed over? The first waiter in line that fits must be me or still fit after me.
            head = next((w for w in sorted(waiting.values(), key=lambda w: w.rank)
                         if w.gpus <= free), None)
            assert head is not None
            assert head == me or head.gpus <= free - me.gpus, (head, me, free)
            in_use += me.gpus
            assert in_use <= slots
            running[j] = tick + jobs[j][2]
            del waiting[j]
        if len(done) == len(jobs):
            break
    assert len(done) == len(jobs), (slots, jobs, waiting, running)


def test_one_slot_runs_everything_in_line_order() -> None:
    line = [Waiter(f"//t:{i}", i, 1) for i in range(5)]
    started = []
    waiting = list(reversed(line))
    while waiting:
        go = [w for w in waiting if decide(w, waiting, 1).go]
        assert len(go) == 1
        started.append(go[0].test)
        waiting.remove(go[0])
    assert started == [w.test for w in line]


def _plan(*ids: str) -> Plan:
    return Plan("selective", tests=tuple(PlannedTest(t, priority=1.0 - i / 10) for i, t in enumerate(ids)))


def test_schedule_file_round_trips_and_rejects_garbage() -> None:
    s = schedule.schedule_for(_plan("//p:b", "//p:a", "pkg/t.py::x"), "/tmp/q", run="abc")
    assert [e.test for e in sorted(s.tests.values(), key=lambda e: e.rank)] == ["//p:b", "//p:a"]
    assert schedule.parse_schedule(s.to_json()) == s
    for bad in ("", "[]", "{}", '{"version": 1, "run": "x", "queue": "rel", "gather_s": 1, "tests": []}',
                s.to_json().replace('"rank": 0', '"rank": "zero"')):
        with pytest.raises(schedule.ScheduleError):
            schedule.parse_schedule(bad)


def test_published_schedule_is_live_only_while_the_run_holds_it(tmp_path: Path) -> None:
    path = tmp_path / schedule.SCHEDULE_PATH
    with schedule.publish(tmp_path, _plan("//p:a", "//p:b")) as published:
        assert published is not None and Path(published.queue).is_dir()
        assert schedule.read_live(path) == published
        queue = Path(published.queue)
    assert not path.exists() and not queue.exists()
    # A file left by a run that died is not obeyed.
    path.write_text(published.to_json())
    assert schedule.read_live(path) is None
    with schedule.publish(tmp_path, _plan("//p:a")) as nothing:
        assert nothing is None  # one test: no order to keep


def test_workspace_is_found_from_the_real_path_of_the_main(tmp_path: Path) -> None:
    src = tmp_path / "ws/pkg/t.py"
    src.parent.mkdir(parents=True)
    src.write_text("")
    link = tmp_path / "runfiles/ws/pkg/t.py"
    link.parent.mkdir(parents=True)
    link.symlink_to(src)
    assert schedule.workspace_of(link, "pkg/t.py") == tmp_path / "ws"
    assert schedule.workspace_of(link, "other/t.py") is None
    assert schedule.workspace_of(link, "external/x/t.py") is None


def _main_in(ws: Path) -> Path:
    main = ws / "pkg/t.py"
    main.parent.mkdir(parents=True, exist_ok=True)
    main.write_text("")
    return main


def test_tickets_wait_their_turn_in_the_queue(tmp_path: Path) -> None:
    said: list[str] = []
    main = _main_in(tmp_path)
    with schedule.publish(tmp_path, _plan("//p:a", "//p:b")) as published:
        assert published is not None
        b = schedule.ticket_for("//p:b", 1, main, "pkg/t.py", say=said.append)
        assert b is not None
        assert not b.turn(1)  # //p:a is ahead and has not started yet
        assert said and "//p:a" in said[-1]
        a = schedule.ticket_for("//p:a", 1, main, "pkg/t.py", say=said.append)
        assert a is not None and a.turn(1) and not b.turn(1)
        assert b.turn(2)  # enough for both
        a.close()  # //p:a holds its GPU now: //p:b's turn when one is free
        assert b.turn(1)
        b.close()
        new = schedule.ticket_for("//p:new", 1, main, "pkg/t.py", say=said.append)
        assert new is not None and new.me.rank == 2  # not in the plan: after every planned test
        new.close()


@pytest.mark.parametrize("content", ["{not json", '{"version": 99}'])
def test_a_corrupt_schedule_is_one_warning_and_no_ticket(tmp_path: Path, content: str) -> None:
    path = tmp_path / schedule.SCHEDULE_PATH
    path.parent.mkdir(parents=True)
    path.write_text(content)
    said: list[str] = []
    with open(path, "rb") as held:  # as a live `fastci run` would
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert schedule.ticket_for("//p:a", 1, _main_in(tmp_path), "pkg/t.py", say=said.append) is None
    assert len(said) == 1 and said[0].startswith("fastci: warning: ignoring the run's schedule")
    # No schedule at all: silent (a plain `bazel test`).
    path.unlink()
    assert schedule.ticket_for("//p:a", 1, _main_in(tmp_path), "pkg/t.py", say=said.append) is None
    assert len(said) == 1


def test_an_unreadable_queue_stops_the_waiting_not_the_test(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    with schedule.publish(tmp_path, _plan("//p:a", "//p:b")) as published:
        assert published is not None
        b = schedule.ticket_for("//p:b", 1, _main_in(tmp_path), "pkg/t.py", say=said.append)
        assert b is not None and not b.turn(1)

        def broken(self: schedule.Ticket) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(schedule.Ticket, "_state", broken)
        assert b.turn(1) and b.turn(1)
        assert sum("cannot be read" in line for line in said) == 1
        b.close()


def test_the_pool_asks_for_a_turn_before_it_takes_devices(tmp_path: Path) -> None:
    asked: list[int] = []

    def turn(free: int) -> bool:
        asked.append(free)
        return len(asked) >= 3

    lease = gpus.acquire(1, ["0", "1"], tmp_path, poll_s=0.01, turn=turn)
    try:
        assert asked == [2, 2, 2] and len(lease.devices) == 1
        assert gpus.free_count(["0", "1"], tmp_path) == 1
    finally:
        lease.release()
    with pytest.raises(gpus.GpuPoolError, match="stayed busy"):
        gpus.acquire(1, ["0"], tmp_path, wait_s=0.05, poll_s=0.01, turn=lambda free: False)


def test_registration_names_the_test_rank_and_gpus(tmp_path: Path) -> None:
    with schedule.publish(tmp_path, _plan("//p:a", "//p:b")) as published:
        assert published is not None
        t = schedule.ticket_for("//p:b", 2, _main_in(tmp_path), "pkg/t.py", say=print)
        assert t is not None
        files = list(Path(published.queue).glob("*.json"))
        assert [json.loads(f.read_text()) for f in files] == [{"test": "//p:b", "rank": 1, "gpus": 2}]
        t.close()
