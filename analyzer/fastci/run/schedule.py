"""Fast feedback: run a plan's tests in priority order on the GPU slots the host has.

Bazel 4.2.3 starts test actions in no particular order and knows nothing about
GPUs, so the order is kept by the launchers (:mod:`fastci.run.launch`), not by
Bazel: ``fastci run`` publishes the plan's order in a *schedule file*
(``<workspace>/.fastci/runs/schedule.json``, :func:`publish`) and lets Bazel
start every test at once (``--local_test_jobs``); each launcher, before it
takes GPUs from the pool (:mod:`fastci.run.gpus`), registers in the run's
*queue directory* and waits its turn (:class:`Ticket`). Whose turn it is is a
pure function, :func:`decide`: list scheduling, highest priority first, a
lower-priority test backfilling GPUs that no higher-priority waiter fits.

Nothing of this enters a test's cache key: the launcher finds the schedule from
where its own main file lives in the source tree (runfiles are symlinks to it),
not from its environment or arguments, so a test whose priority changed is
still a cache hit, and plain ``bazel test --config=fastci`` shares its cache
with ``fastci run``. The schedule is only obeyed while the ``fastci run`` that
wrote it holds an ``flock`` on it (a leftover file is ignored), and a missing,
stale, corrupt or unusable schedule never blocks or fails a test: the launcher
then takes GPUs as it always did (one warning line when the file is corrupt).
See docs/RUNNING.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Sequence

from fastci.errors import FastCIError
from fastci.plan.model import Plan, PlannedTest, by_priority
from fastci.types import TestId, is_label, normalize_test_id

LOG = logging.getLogger(__name__)

#: Where ``fastci run`` writes the schedule, relative to the workspace root.
SCHEDULE_PATH = Path(".fastci/runs/schedule.json")
#: How long after the first test of a run registers the launchers wait for
#: higher-priority tests that have not registered yet (Bazel starts them a
#: little apart); one that is cached never registers, so this is a bound.
GATHER_S = 10.0
SCHEDULE_VERSION = 1


class ScheduleError(FastCIError):
    """A schedule file cannot be read or does not follow its format."""


# --- The order ---------------------------------------------------------------------------

#: The plan's run order, highest priority first (:func:`fastci.plan.model.by_priority`).
order = by_priority


@dataclass(frozen=True)
class Entry:
    """One scheduled test: its place in line (0 first) and what the plan expects of it."""

    test: TestId
    rank: int
    priority: float | None = None
    est_gpu_s: float | None = None


@dataclass(frozen=True)
class Schedule:
    """What ``fastci run`` publishes for the launchers of one ``bazel test``."""

    run: str  # a fresh id per run
    queue: str  # absolute path of the directory the launchers register in
    tests: Mapping[TestId, Entry]
    gather_s: float = GATHER_S
    fail_fast: bool = False  # once a test failed, the others wait (for Bazel to stop them)

    def entry(self, test: TestId) -> Entry:
        """``test``'s place in line: a test the plan does not list (declared after the
        plan was made, it runs at full workload) goes after every planned one."""
        label = normalize_test_id(test)
        return self.tests.get(label) or Entry(label, len(self.tests))

    def to_json(self) -> str:
        """The schedule file's text."""
        return json.dumps({"version": SCHEDULE_VERSION, "run": self.run, "queue": self.queue,
                           "gather_s": self.gather_s, "fail_fast": self.fail_fast,
                           "tests": [dataclasses.asdict(e) for e in
                                     sorted(self.tests.values(), key=lambda e: e.rank)]},
                          indent=1) + "\n"


def schedule_for(plan: Plan, queue: str, *, run: str | None = None,
                 gather_s: float = GATHER_S, fail_fast: bool = False) -> Schedule:
    """The schedule of ``plan``'s Bazel labels, in :func:`order`."""
    entries: dict[TestId, Entry] = {}
    for t in order([t for t in plan.tests if is_label(t.id)]):
        label = normalize_test_id(t.id)
        if label not in entries:
            entries[label] = Entry(label, len(entries), t.priority, t.est_gpu_s)
    return Schedule(run or uuid.uuid4().hex, queue, entries, gather_s, fail_fast)


def parse_schedule(text: str) -> Schedule:
    """Read a schedule file's text.

    Raises:
        ScheduleError: not JSON, another version, or a field of the wrong type.
    """
    try:
        data = json.loads(text)
        if data.get("version") != SCHEDULE_VERSION:
            raise ScheduleError(f"schedule version {data.get('version')!r}, expected {SCHEDULE_VERSION}")
        run, queue, gather_s = data["run"], data["queue"], float(data["gather_s"])
        fail_fast = data.get("fail_fast", False)
        if not isinstance(run, str) or not run.isalnum() or not isinstance(queue, str) \
                or not os.path.isabs(queue) or not math.isfinite(gather_s) or gather_s < 0 \
                or not isinstance(fail_fast, bool):
            raise ScheduleError("schedule: bad run, queue, gather_s or fail_fast")
        tests: dict[TestId, Entry] = {}
        for e in data["tests"]:
            entry = Entry(str(e["test"]), int(e["rank"]),
                          None if e.get("priority") is None else float(e["priority"]),
                          None if e.get("est_gpu_s") is None else float(e["est_gpu_s"]))
            tests[entry.test] = entry
    except ScheduleError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ScheduleError(f"schedule: not a schedule file ({type(exc).__name__}: {exc})") from exc
    return Schedule(run, queue, tests, gather_s, fail_fast)


# --- Whose turn (pure) -------------------------------------------------------------------

@dataclass(frozen=True)
class Waiter:
    """A test of the run whose launcher waits for GPUs (rank: its place in line, 0 first)."""

    test: TestId
    rank: int
    gpus: int


@dataclass(frozen=True)
class Turn:
    """Whether a waiter may take GPUs now, and why (or why not)."""

    go: bool
    why: str


def grants(waiters: Sequence[Waiter], free: int) -> list[Waiter]:
    """List scheduling: in line order, every waiter that fits in the GPUs still free gets them.

    A waiter that does not fit is passed over, so a later one may backfill GPUs
    that no waiter ahead of it fits; the first in line that fits always goes.
    """
    left, out = free, []
    for w in sorted(waiters, key=lambda w: (w.rank, w.test)):
        if w.gpus <= left:
            out.append(w)
            left -= w.gpus
    return out


def decide(me: Waiter, waiters: Sequence[Waiter], free: int,
           unseen_ahead: Sequence[TestId] = ()) -> Turn:
    """Whether ``me`` may take its GPUs now.

    ``waiters``: the run's tests waiting now (``me`` among them or not);
    ``free``: GPUs nobody holds; ``unseen_ahead``: tests ahead of ``me`` in line
    that have not registered yet and are still waited for (see :data:`GATHER_S`).
    """
    if unseen_ahead:
        return Turn(False, f"waits for {unseen_ahead[0]} (ahead in line, not started yet)")
    line = [w for w in waiters if w.test != me.test] + [me]
    granted = grants(line, free)
    if me in granted:
        return Turn(True, f"{free} GPU(s) free, {me.gpus} taken in priority order")
    ahead = [w for w in granted if (w.rank, w.test) < (me.rank, me.test)]
    if ahead:
        return Turn(False, f"waits for {ahead[0].test} (higher priority, fits first)")
    return Turn(False, f"waits for {me.gpus} free GPU(s) ({free} free)")


# --- The launcher's side: register, wait its turn ------------------------------------------

def _held(handle: IO[bytes]) -> bool:
    """Whether another process holds the lock on the open file ``handle``."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


#: The file a failing test leaves in its run's queue (fail-fast runs only).
FAILED_FILE = "failed"


def _ticket_name(test: TestId) -> str:
    return hashlib.sha256(test.encode()).hexdigest()[:24] + ".json"


def workspace_of(main_file: Path, main: str) -> Path | None:
    """The source workspace of a test whose main is ``main`` (its ``$(rootpath)``), or None.

    The runfiles hold symlinks to the source files: the real path of the main
    file, less ``main``, is the workspace root. A generated or external main has none.
    """
    if not main or main.startswith(("external/", "../")) or os.path.isabs(main):
        return None
    real = main_file.resolve()
    parts = Path(main).parts
    if real.parts[-len(parts):] != parts:
        return None
    return Path(*real.parts[:-len(parts)])


def read_live(path: Path) -> Schedule | None:
    """The schedule at ``path`` if the ``fastci run`` that wrote it still runs, else None.

    Raises:
        ScheduleError: the file is there and in use but unreadable or corrupt.
    """
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ScheduleError(f"cannot read the schedule {path}: {exc.strerror}") from exc
    with handle:
        if not _held(handle):
            LOG.debug("%s: left over from a finished run, ignored", path)
            return None
        text = handle.read().decode("utf-8", errors="replace")
    try:
        return parse_schedule(text)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from exc


class Ticket:
    """A launcher's place in its run's queue, from registration until it holds GPUs.

    The registration is a file ``<queue>/<hash of test>.json`` naming the test,
    its rank and GPUs, locked while the launcher waits: a file that exists says
    the test has started, a locked one that it waits. The kernel drops the lock
    when the launcher exits, however it exits.
    """

    def __init__(self, schedule: Schedule, entry: Entry, gpus: int, *,
                 say: Callable[[str], None], clock: Callable[[], float] = time.time) -> None:
        self.schedule, self.me = schedule, Waiter(entry.test, entry.rank, gpus)
        self.queue = Path(schedule.queue)
        self._say, self._clock = say, clock
        self._said = ""
        self._broken = False
        fd, tmp = tempfile.mkstemp(dir=self.queue, prefix=".reg-")
        self._handle: IO[bytes] | None = os.fdopen(fd, "r+b")
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._handle.write(json.dumps(dataclasses.asdict(self.me)).encode())
        self._handle.flush()
        os.replace(tmp, self.queue / _ticket_name(entry.test))

    def failed(self) -> None:
        """Say this test failed: in a fail-fast run no test takes GPUs after it.

        Called before the test's GPUs go back to the pool, so no waiting test
        starts in the moment before Bazel hears of the failure and stops the run.
        """
        if not self.schedule.fail_fast:
            return
        with contextlib.suppress(OSError):
            (self.queue / FAILED_FILE).write_text(self.me.test + "\n")

    def close(self) -> None:
        """Stop waiting (the registration stays, unlocked: this test has started)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _state(self) -> tuple[list[Waiter], list[TestId]]:
        """(the run's waiters now, the tests ahead of this one still waited for)."""
        waiters: list[Waiter] = []
        seen: set[str] = set()
        first = math.inf
        for path in self.queue.glob("*.json"):
            try:
                with open(path, "rb") as handle:
                    first = min(first, os.fstat(handle.fileno()).st_mtime)
                    seen.add(path.name)
                    if not _held(handle) or path.name == _ticket_name(self.me.test):
                        continue
                    d = json.loads(handle.read())
                    waiters.append(Waiter(str(d["test"]), int(d["rank"]), int(d["gpus"])))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                LOG.debug("%s: unreadable registration: %s", path, exc)
        unseen: list[TestId] = []
        if self._clock() < first + self.schedule.gather_s:
            unseen = [e.test for e in sorted(self.schedule.tests.values(), key=lambda e: e.rank)
                      if e.rank < self.me.rank and _ticket_name(e.test) not in seen]
        return waiters, unseen

    def turn(self, free: int) -> bool:
        """Whether this test may try to take its GPUs now (``free``: GPUs nobody holds).

        Never raises: a queue it cannot read makes it stop waiting its turn
        (one warning line), as if there were no schedule.
        """
        if self._broken or self._handle is None:
            return True
        try:
            if self.schedule.fail_fast and (self.queue / FAILED_FILE).exists():
                # Never run, never pass: wait for Bazel to stop this test (--notest_keep_going).
                failed = (self.queue / FAILED_FILE).read_text().strip()
                turn = Turn(False, f"does not start: {failed} failed and the run fails fast")
            else:
                waiters, unseen = self._state()
                turn = decide(self.me, waiters, free, unseen)
        except Exception as exc:  # noqa: BLE001 - scheduling is an optimization, never a failure
            self._broken = True
            self._say(f"fastci: warning: the run's queue {self.queue} cannot be read ({exc}): "
                       "taking GPUs without waiting for priority order")
            return True
        if not turn.go and turn.why != self._said:
            self._say(f"fastci: {self.me.test} {turn.why}")
            self._said = turn.why
        return turn.go


def ticket_for(test: TestId, gpus: int, main_file: Path, main: str, *,
               say: Callable[[str], None]) -> Ticket | None:
    """Register ``test`` in its run's queue when a ``fastci run`` schedules it, else None.

    Never raises and never blocks: a corrupt or unusable schedule is one line
    through ``say`` and None (the test takes GPUs as without a schedule).
    """
    try:
        root = workspace_of(main_file, main)
        schedule = read_live(root / SCHEDULE_PATH) if root is not None else None
        if schedule is None:
            return None
        entry = schedule.entry(test)
        return Ticket(schedule, entry, gpus, say=say)
    except Exception as exc:  # noqa: BLE001 - scheduling is an optimization, never a failure
        say(f"fastci: warning: ignoring the run's schedule ({exc}): taking GPUs without "
             "waiting for priority order")
        return None


# --- The runner's side: publish the schedule for one bazel test ---------------------------

#: Where queue directories go: /tmp is writable from Bazel 4.2.3's linux-sandbox
#: (the workspace is not), as the GPU pool's default lock directory is.
QUEUE_PARENT = "/tmp"


@contextlib.contextmanager
def publish(root: Path, plan: Plan, *, fail_fast: bool = False) -> Iterator[Schedule | None]:
    """Write ``plan``'s schedule for the launchers and keep it live while the block runs.

    Yields None (and publishes nothing) when there is neither an order to keep
    (a selective plan with two planned labels or more) nor ``fail_fast``. The schedule file
    stays locked until the block ends, then it and the queue are removed.
    """
    labels = {normalize_test_id(t.id) for t in plan.tests if is_label(t.id)}
    if not fail_fast and (plan.mode != "selective" or len(labels) < 2):
        yield None
        return
    parent = QUEUE_PARENT if os.path.isdir(QUEUE_PARENT) else tempfile.gettempdir()
    queue = tempfile.mkdtemp(prefix="fastci-queue-", dir=parent)
    os.chmod(queue, 0o777)  # tests may run as another user (e.g. a sandbox's)
    schedule = schedule_for(plan if plan.mode == "selective" else Plan(plan.mode), queue,
                            fail_fast=fail_fast)
    path = root / SCHEDULE_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            handle.truncate(0)
            handle.write(schedule.to_json().encode())
            handle.flush()
            try:
                yield schedule
            finally:
                with contextlib.suppress(OSError):
                    path.unlink()
    finally:
        shutil.rmtree(queue, ignore_errors=True)
