"""Progress with an ETA for long commands (``record``, ``calibrate``, ``eval``, ``run``).

One :class:`Progress` per long loop, on stderr, in one of three modes:

* ``bar`` (stderr is a terminal): a tqdm bar with count, rate, elapsed time and ETA,
  removed when it closes (``leave=False``) and replaced by one final line. Lines the
  caller prints meanwhile go through :meth:`Progress.echo` (``tqdm.write``), so the bar
  never tears them.
* ``log`` (CI logs, pipes, files): no carriage return, no bar; one plain line at most
  every ``log_every_s`` seconds (as work advances, or on :meth:`Progress.tick`), and
  one when it closes::

      fastci: record: 12/40 tests, 03:10 elapsed, ETA 07:24 (last: //pkg:a_test PASSED)
      fastci: record: 40/40 tests in 10:31

  The times and the ETA are tqdm's (:meth:`tqdm.tqdm.format_meter`: the average rate
  so far, ``[H:]MM:SS``); a total not known yet shows a count without an ETA.
  :meth:`Progress.echo` just prints.
* ``off``: nothing at all (:meth:`Progress.echo` still prints).

``FASTCI_PROGRESS`` picks the mode: ``0`` off, ``1`` the bar even without a terminal,
``log`` the plain lines even in a terminal; unset (or anything else) decides by whether
the stream is a terminal. A caller's ``interactive=`` argument overrides that detection
(and ``1``/``log``), never ``0``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Callable, Iterator, Literal, Mapping, TextIO

from tqdm import tqdm as _tqdm  # type: ignore[import-untyped]

LOG = logging.getLogger(__name__)

#: The environment variable that turns progress off (``0``) or picks its mode.
ENV = "FASTCI_PROGRESS"

Mode = Literal["off", "bar", "log"]


def choose_mode(stream: TextIO, interactive: bool | None = None,
                environ: Mapping[str, str] | None = None) -> Mode:
    """The mode a :class:`Progress` on ``stream`` runs in (see the module docstring).

    Args:
        stream: where progress goes.
        interactive: True/False forces the bar/the lines (None: decide).
        environ: the environment (default ``os.environ``).
    """
    env = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if env == "0":
        return "off"
    if interactive is not None:
        return "bar" if interactive else "log"
    if env == "1":
        return "bar"
    if env == "log":
        return "log"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed or odd streams are not terminals
        tty = False
    return "bar" if tty else "log"


def _plural(unit: str) -> str:
    return unit if unit.endswith("s") else unit + "s"


class Progress:
    """Progress of ``total`` units of work (tests, rungs) on stderr.

    Thread-safe: :meth:`advance` may come from a follower thread while the caller
    blocks (``bazel test`` running).

    Args:
        total: how many units are expected (None: unknown; counted without an ETA).
        desc: what is progressing (``record``, ``run``, ``calibrate``).
        unit: the unit's name, singular.
        stream: where progress goes (default ``sys.stderr`` as it is now).
        interactive: True: the bar, False: plain lines, None: decide
            (:func:`choose_mode`).
        log_every_s: the least time between two plain lines in log mode.
        clock: seconds, monotonic (tests pass a fake one; log mode only).
    """

    def __init__(self, total: int | None, desc: str, *, unit: str = "test",
                 stream: TextIO | None = None, interactive: bool | None = None,
                 log_every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = 0
        self.last = ""
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.mode: Mode = choose_mode(self.stream, interactive)
        self.log_every_s = log_every_s
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self._closed = False
        self._lock = threading.RLock()
        self._bar: Any = None
        if self.mode == "bar":
            # miniters=0: every update, tick() included, redraws once mininterval passed;
            # smoothing=0: the average rate (tests finish in bursts; ticks are no progress).
            self._bar = _tqdm(total=total, desc=f"fastci {desc}", unit=unit, file=self.stream,
                              leave=False, dynamic_ncols=True, miniters=0, smoothing=0,
                              bar_format=self._count_format() if total is None else None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the progress started (by its clock)."""
        return self._clock() - self._start

    def advance(self, n: int = 1, *, note: str = "") -> None:
        """Count ``n`` more units done; ``note`` names the last one (e.g. the test's label)."""
        with self._lock:
            if self._closed:
                return
            self.n += n
            if note:
                self.last = note
            if self._bar is not None:
                if note:
                    self._bar.set_postfix_str(note, refresh=False)
                self._bar.update(n)
            elif self.mode == "log":
                self._maybe_line()

    def set_total(self, total: int) -> None:
        """Now the total is known (or changed)."""
        with self._lock:
            if self._closed or total == self.total:
                return
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.bar_format = None  # tqdm's own bar, now that there is a total
                self._bar.refresh()

    def tick(self) -> None:
        """Show time passing though nothing advanced: the periodic line if it is due (log
        mode), the bar's elapsed time and ETA redrawn (bar mode).

        A caller with a loop of its own (the build-event follower polls) calls it, so
        a long test neither freezes the bar nor leaves a CI log silent for longer than
        ``log_every_s``.
        """
        with self._lock:
            if self._closed:
                return
            if self._bar is not None:
                self._bar.update(0)
            elif self.mode == "log":
                self._maybe_line()

    @contextlib.contextmanager
    def ticking(self, every_s: float = 1.0) -> Iterator[None]:
        """:meth:`tick` every ``every_s`` seconds on a daemon thread while the block runs
        (a caller blocked on one long step: a calibration rung, a ``bazel test`` round)."""
        if self.mode == "off":
            yield
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                try:
                    self.tick()
                except Exception as exc:  # noqa: BLE001 - progress must never fail the command
                    LOG.debug("progress tick failed: %s", exc)
                    return

        thread = threading.Thread(target=loop, name="fastci-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def echo(self, line: str, *, file: TextIO | None = None) -> None:
        """Print ``line`` (to stdout by default) without tearing the bar."""
        out = file if file is not None else sys.stdout
        with self._lock:
            if self._bar is not None and not self._closed:
                _tqdm.write(line, file=out)
                out.flush()
            else:
                print(line, file=out, flush=True)

    def close(self) -> None:
        """Remove the bar and print the final line; idempotent.

        Nothing is printed when off, or when nothing was counted and no total was set
        (e.g. ``fastci run`` where only pytest ran).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.mode == "off":
                return
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            if self.total is None and self.n == 0:
                return  # nothing was counted: nothing to say
            self._write(self.line(final=True))

    def line(self, *, final: bool = False) -> str:
        """The plain progress line as it reads now (log mode prints these)."""
        # More done than expected (a total counted short): the total says nothing.
        total = self.total if self.total is None or self.n <= self.total else None
        counted = f"{{n_fmt}}/{{total_fmt}} {_plural(self.unit)}" if total is not None \
            else f"{{n_fmt}} {_plural(self.unit) if self.n != 1 else self.unit}"
        fmt = f"{counted} in {{elapsed}}" if final else f"{counted}, {{elapsed}} elapsed"
        if not final and total is not None and 0 < self.n < total:
            fmt += ", ETA {remaining}"
        text: str = _tqdm.format_meter(self.n, total, max(self.elapsed_s, 0.0), unit=self.unit,
                                       bar_format=fmt)
        if self.last and not final:
            text += f" (last: {self.last})"
        return f"fastci: {self.desc}: {text}"

    def _count_format(self) -> str:
        """The bar's format without a total: a count (tqdm's own reads ``0test``)."""
        return f"{{desc}}: {{n_fmt}} {_plural(self.unit)} [{{elapsed}}, {{rate_fmt}}{{postfix}}]"

    def _maybe_line(self) -> None:
        if self.total is not None and self.n >= self.total:
            return  # all done: the final line follows
        now = self._clock()
        if now - self._last_line >= self.log_every_s:
            self._last_line = now
            self._write(self.line())

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError) as exc:  # a closed or broken stream: progress is optional
            LOG.debug("cannot write progress: %s", exc)
