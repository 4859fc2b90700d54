"""Follow a build event JSON file while ``bazel test`` writes it: each test as it finishes.

Bazel writes ``--build_event_json_file`` one event per line as the build goes. A
:class:`BepFollower` (a daemon thread, :func:`follow_bep`) reads what was appended
every ``poll_s`` seconds, parses complete lines only (a partial last line waits for
the rest) and calls back:

* ``on_test(label, status)`` once per test target, when Bazel is done with it. That
  is its ``testSummary`` event (``overallStatus``): Bazel posts it after every run,
  shard and attempt of the target finished (a flaky test's retries are several
  ``testResult`` events but one summary, ``FLAKY``), so it means "this test is
  finished", where a ``testResult`` only means "this attempt is". Bazel 4.2.3 posts
  no summary for two kinds of test targets, so their ``targetCompleted`` event is
  their end instead (its ``children`` announce no ``testSummary``): one skipped as
  incompatible (``--config=fastci`` skipping a test the plan skips: ``aborted``,
  reason ``SKIPPED``; status ``SKIPPED``) and one that failed to build (status
  ``FAILED_TO_BUILD``). A summary Bazel announced but never posted
  (``--notest_keep_going`` stopping the build) comes as an ``aborted`` event of that
  id (status: the abort's reason; Bazel 4.2.3 gives none there, ``"aborted": {}``,
  so ``NO_STATUS``, as its console says).
* ``on_total(n)`` with the number of test targets to expect: Bazel 4.2.3 has no event
  with the count, but its ``pattern`` event (``expanded``) lists as its children one
  ``targetConfigured`` id per target the patterns expanded to (``//examples/...``
  included), then posts those events before it builds anything, and only a test
  rule's carries ``configured.testSize``. ``n`` counts those, said once every target
  the patterns named is configured (or once a target completed), so it is final
  before the first test finishes; said again should it grow.
* ``on_poll()`` after each poll (e.g. :meth:`fastci.progress.Progress.tick`).

It never raises into the caller: a line that is not a JSON object is logged and
skipped (the parse that counts, :func:`fastci.integrations.bazel.bep.parse_bep`, is
strict; this is only progress), and an error reading the file or in a callback is
logged and stops the follower. A file already there when following starts (the
previous run's, at a fixed path) is not read until it changes (Bazel truncates or
replaces it), and a file that shrinks is read again from its start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Protocol

LOG = logging.getLogger(__name__)

#: How often the follower looks at the file, in seconds.
POLL_S = 0.5

OnTest = Callable[[str, str], None]


def _label(ev_id: dict[str, Any], kind: str) -> str | None:
    value = ev_id.get(kind)
    if isinstance(value, dict) and isinstance(value.get("label"), str):
        return str(value["label"])
    return None


class BepFollower:
    """Tails one build event JSON file (see the module docstring).

    :meth:`poll` does one round by hand (tests); :meth:`start` and :meth:`stop`
    run it on a daemon thread, :meth:`stop` ending with a final drain.

    Args:
        path: the build event JSON file (it may not exist yet).
        on_test: called with (label, status) once per finished test target.
        on_total: called with the number of test targets to expect, once analysis is
            over (and again should it grow).
        on_poll: called after each poll (also before the file exists).
        poll_s: seconds between polls.
    """

    def __init__(self, path: Path, on_test: OnTest, *,
                 on_total: Callable[[int], None] | None = None,
                 on_poll: Callable[[], None] | None = None, poll_s: float = POLL_S) -> None:
        self.path = Path(path)
        self.on_test = on_test
        self.on_total = on_total
        self.on_poll = on_poll
        self.poll_s = poll_s
        self.finished: dict[str, str] = {}  # label -> status, in the order they finished
        self.tests: set[str] = set()  # test targets configured
        self.failed = False  # stopped on an error
        self._offset = 0
        self._buffer = b""
        self._stale = self._identity()  # the previous run's file: ignored until it changes
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._skipped_lines = 0
        self._told_total = 0
        self._expected: set[str] = set()  # targets the patterns expanded to
        self._configured: set[str] = set()  # targets configured (or their configuring aborted)
        self._analysed = False  # a target completed: analysis is over

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def start(self) -> None:
        """Poll on a daemon thread every ``poll_s`` seconds until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fastci-bep-follow",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then read what is left (a last line without its newline too)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 4 * self.poll_s))
            if self._thread.is_alive():  # a callback hangs: leave it, do not drain under it
                LOG.warning("build event follower did not stop: no final drain")
                return
        self.poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self, *, final: bool = False) -> None:
        """Read what was appended and call back for it; never raises.

        Args:
            final: the file is complete: a last line without a newline is parsed too.
        """
        with self._lock:
            if self.failed:
                return
            try:
                self._read(final)
                if self.on_poll is not None:
                    self.on_poll()
            except Exception as exc:  # noqa: BLE001 - progress must never fail the command
                self.failed = True
                LOG.warning("following %s stopped: %s: %s", self.path, type(exc).__name__, exc)

    def _read(self, final: bool) -> None:
        ident = self._identity()
        if ident is None:
            return
        if self._stale is not None:
            if ident == self._stale:
                return  # still the previous run's file
            self._stale = None
            self._offset, self._buffer = 0, b""
        if ident[1] < self._offset:  # truncated and rewritten: start over
            LOG.debug("%s shrank: reading it from the start", self.path)
            self._offset, self._buffer = 0, b""
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        self._offset += len(data)
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()  # b"" after a newline, else a line still being written
        if final and self._buffer.strip():
            lines.append(self._buffer)
            self._buffer = b""
        for raw in lines:
            if raw.strip():
                self._line(raw)
        self._flush_total()

    def _flush_total(self) -> None:
        """Say how many test targets there are once analysis is over (every target the
        patterns expanded to configured, or a target completed), and again if that grows;
        at the end of a poll, and before a test finishes (a total before its count)."""
        done = self._analysed or bool(self._expected and self._expected <= self._configured)
        if self.on_total is not None and done and len(self.tests) > self._told_total:
            self._told_total = len(self.tests)
            self.on_total(self._told_total)

    def _line(self, raw: bytes) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("id"), dict):
            self._skipped_lines += 1
            if self._skipped_lines == 1:
                LOG.warning("%s: skipping a line that is not a build event: %r",
                            self.path, raw[:120])
            return
        self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        ev_id: dict[str, Any] = event["id"]
        if "pattern" in ev_id:
            for child in event.get("children") or ():
                label = _label(child, "targetConfigured") if isinstance(child, dict) else None
                if label is not None:
                    self._expected.add(label)
            return
        label = _label(ev_id, "targetConfigured")
        if label is not None:
            self._configured.add(label)
            configured = event.get("configured")
            if isinstance(configured, dict) and "testSize" in configured:
                self.tests.add(label)
            return
        label = _label(ev_id, "testSummary")
        if label is not None:
            summary = event.get("testSummary")
            if isinstance(summary, dict):
                self._finish(label, str(summary.get("overallStatus", "NO_STATUS")))
            elif isinstance(event.get("aborted"), dict):
                self._finish(label, str(event["aborted"].get("reason") or "NO_STATUS"))
            return
        label = _label(ev_id, "targetCompleted")
        if label is not None:
            self._analysed = True  # Bazel 4.2.3 configures every target before it builds one
        if label is not None and label in self.tests:
            announced = any(isinstance(c, dict) and "testSummary" in c
                            for c in event.get("children") or ())
            if announced:
                return  # its testSummary event ends it
            aborted = event.get("aborted")
            completed = event.get("completed")
            if isinstance(aborted, dict):
                self._finish(label, str(aborted.get("reason") or "NO_STATUS"))
            elif isinstance(completed, dict) and not completed.get("success"):
                self._finish(label, "FAILED_TO_BUILD")

    def _finish(self, label: str, status: str) -> None:
        if label in self.finished:
            return
        self.finished[label] = status
        self._flush_total()
        self.on_test(label, status)

    def __enter__(self) -> BepFollower:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


@contextmanager
def follow_bep(path: Path, on_test: OnTest, *, on_total: Callable[[int], None] | None = None,
               on_poll: Callable[[], None] | None = None,
               poll_s: float = POLL_S) -> Iterator[BepFollower]:
    """Follow ``path`` while the block runs (``bazel test`` writing it); drain it at the end.

    Args:
        path: the build event JSON file Bazel is about to write.
        on_test: called with (label, status) once per finished test target.
        on_total: called with the number of test targets to expect, once analysis is over.
        on_poll: called after each poll.
        poll_s: seconds between polls.
    """
    follower = BepFollower(path, on_test, on_total=on_total, on_poll=on_poll, poll_s=poll_s)
    follower.start()
    try:
        yield follower
    finally:
        follower.stop()


class TestProgress(Protocol):
    """What :func:`follow_bep_progress` drives (:class:`fastci.progress.Progress`)."""

    def advance(self, n: int = 1, *, note: str = "") -> None: ...
    def set_total(self, total: int) -> None: ...
    def tick(self) -> None: ...


@contextmanager
def follow_bep_progress(path: Path, progress: TestProgress, *,
                        poll_s: float = POLL_S) -> Iterator[BepFollower]:
    """:func:`follow_bep` counting into ``progress``: its total is the test targets Bazel
    configured, each finished test advances it (noted ``LABEL STATUS``), and each poll
    ticks it (a periodic line in a CI log even while one long test runs)."""

    def on_test(label: str, status: str) -> None:
        progress.advance(note=f"{label} {status}")

    with follow_bep(path, on_test, on_total=progress.set_total, on_poll=progress.tick,
                    poll_s=poll_s) as follower:
        yield follower
