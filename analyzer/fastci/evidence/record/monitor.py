"""The recorder's engine on Python 3.12+: ``sys.monitoring`` instead of coverage.py's C tracer.

coverage.py's C tracer is a ``sys.settrace`` function: it sees only the threads
it was installed on (native threads and autograd's device threads never), and on
Python 3.12 every traced call and line goes through the legacy tracing shim
(measured: a recorded pure-Python suite ran ~3x a plain run). ``sys.monitoring``
(PEP 669) is process-wide and lets a callback switch its own event off at one
code location (``DISABLE``) until :func:`sys.monitoring.restart_events`. So:

* ``PY_START``/``PY_RESUME`` (a call, or a generator resumed: what the C
  tracer's ``call`` event is) of a repo code object feeds the recorder's
  :class:`~fastci.evidence.record.contexts.ContextProfiler`, which names the unit and
  samples its context. A code object outside the repository is switched off at
  its first start. A repo code object is switched off once its sampling is
  done (:meth:`ContextProfiler.on_start`): after its first
  :data:`~fastci.evidence.record.contexts.FULL_CALLS` calls in a test, or — line mode,
  where calibration needs the exact rule — once it retires with
  :data:`~fastci.evidence.record.contexts.MAX_CONTEXTS` contexts. Every switched-off
  event comes back (:func:`sys.monitoring.restart_events`) when the recording
  starts, at each segment boundary and when :func:`~fastci.evidence.record.contexts.annotate`
  changes the labels, so each of those periods samples again, from the next call.
* Lines and arcs only where the coverage-based recorder collects them: in line
  mode, and without contexts (units then come from line ownership). ``LINE`` and
  ``BRANCH`` are set as *local* events on repo code objects only, at their first
  start; a ``LINE`` event is switched off after its first hit per (code, line
  location), a ``BRANCH`` once both of its ways were taken. Arcs are the
  branches taken, (line of the branch, line it went to): what a reduced run must
  take too (:mod:`fastci.plan.reduce` compares rungs of one calibration, all
  recorded by one engine).

The engine answers the part of coverage.py's API the recorder reads
(``start``, ``stop``, ``switch_context``, ``get_data`` with ``measured_files``,
``lines``, ``arcs``, ``contexts_by_lineno``, ``erase``), so traces, ingest and
selection are unchanged. It holds one ``sys.monitoring`` tool id while it runs
(:data:`TOOL_IDS`: ids no standard tool claims) and gives it back at stop.

Which engine records is decided in one place, :func:`backend`.
"""

from __future__ import annotations

import logging
import os
import sys
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Protocol

from fastci.errors import FastCIError
from fastci.evidence.record import contexts

if TYPE_CHECKING:
    from fastci.evidence.record.files import PathMapper

LOG = logging.getLogger(__name__)

#: Which engine records: ``auto`` (``monitoring`` on Python 3.12+, else ``coverage``),
#: ``monitoring`` or ``coverage`` (docs/CONFIG.md). Child processes inherit it.
BACKEND_ENV = "FASTCI_RECORDER"
BACKENDS = ("auto", "monitoring", "coverage")
#: sys.monitoring tool ids tried, in order: 0 (debugger), 1 (coverage), 2 (profiler) and
#: 5 (optimizer) are the standard tools' ids; 4 and 3 are named by none.
TOOL_IDS = (4, 3)
TOOL_NAME = "fastci"

_WARNED: set[str] = set()
# sys.monitoring (None before Python 3.12), typed Any: mypy checks against 3.11.
_MON: Any = getattr(sys, "monitoring", None)


class MonitorUnavailable(FastCIError):
    """``sys.monitoring`` cannot record here (too old a Python, or no free tool id)."""


def available() -> bool:
    """Whether this interpreter has ``sys.monitoring`` (Python 3.12+)."""
    return _MON is not None and hasattr(sys, "monitoring")


def backend(environ: dict[str, str] | None = None) -> str:
    """The engine this process records with: ``"monitoring"`` or ``"coverage"``.

    ``FASTCI_RECORDER`` forces one; ``auto`` (or unset) takes ``monitoring`` where the
    interpreter has it. ``monitoring`` forced on an interpreter without it, or a value
    not in :data:`BACKENDS`, is said once (a warning) and recorded with coverage.py,
    which records the same evidence on the threads it sees.
    """
    env = os.environ if environ is None else environ
    raw = env.get(BACKEND_ENV, "") or "auto"
    want = raw.strip().lower()
    if want not in BACKENDS:
        _warn_once(f"{BACKEND_ENV}={raw!r} is not one of {', '.join(BACKENDS)}: "
                   "recording with the default engine")
        want = "auto"
    if want == "coverage":
        return "coverage"
    if available():
        return "monitoring"
    if want == "monitoring":
        _warn_once(f"{BACKEND_ENV}=monitoring needs Python 3.12+ (this is "
                   f"{sys.version.split()[0]}): recording with coverage.py")
    return "coverage"


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        LOG.warning("fastci: %s", msg)


# Engines kept for reuse in this process, by (pid, mapper id, lines, arcs, exact), and the
# ids of those recording now (nested recorders get a fresh engine: another tool id).
_ENGINES: dict[tuple[int, int, bool, bool, bool], "MonitorEngine"] = {}
_BUSY: set[int] = set()


class StartSink(Protocol):
    """What receives the starts of repo code: a :class:`ContextProfiler` (a test's
    recorder) or the collection recorder."""

    def on_start(self, frame: FrameType, *, every_call: bool) -> bool: ...


def acquire(mapper: PathMapper, profiler: StartSink | None, *, lines: bool,
            arcs: bool, exact: bool) -> "MonitorEngine":
    """This process's idle engine for these settings, else a new one; :func:`release` it.

    Raises:
        MonitorUnavailable: no ``sys.monitoring`` here.
    """
    if not available():
        raise MonitorUnavailable(f"Python {sys.version.split()[0]} has no sys.monitoring")
    _free_tool()
    key = (os.getpid(), id(mapper), lines, arcs, exact)
    eng = _ENGINES.get(key)
    if eng is None or id(eng) in _BUSY or eng.mapper is not mapper:
        eng = MonitorEngine(mapper, lines=lines, arcs=arcs, exact=exact)
        _ENGINES.setdefault(key, eng)
    eng.profiler = profiler
    _BUSY.add(id(eng))
    return eng


def release(engine: Any) -> bool:
    """Erase what a stopped monitor engine collected and make it available again.

    Returns False (doing nothing) for an object that is not a :class:`MonitorEngine`.
    """
    if not isinstance(engine, MonitorEngine):
        return False
    engine.get_data().erase()
    engine.profiler = None
    _BUSY.discard(id(engine))
    return True


class MonitorData:
    """What a :class:`MonitorEngine` collected, read like coverage.py's ``CoverageData``:
    executed lines by file name and context label (``""``: the test's), and arcs."""

    def __init__(self, arcs: bool) -> None:
        self._branch = arcs
        self.lines_by: dict[str, dict[str, set[int]]] = {}  # label -> file -> lines
        self.arcs_by: dict[str, set[tuple[int, int]]] = {}  # file -> (from line, to line)

    def erase(self) -> None:
        """Forget everything collected."""
        self.lines_by.clear()
        self.arcs_by.clear()

    def measured_files(self) -> list[str]:
        """The file names with executed lines or arcs."""
        names = {f for by_file in self.lines_by.values() for f, got in by_file.items() if got}
        return sorted(names | {f for f, got in self.arcs_by.items() if got})

    def lines(self, filename: str) -> list[int]:
        """The executed lines of ``filename`` in any context."""
        out: set[int] = set()
        for by_file in self.lines_by.values():
            out |= by_file.get(filename, set())
        return sorted(out)

    def has_arcs(self) -> bool:
        """Whether arcs were collected."""
        return self._branch

    def arcs(self, filename: str) -> list[tuple[int, int]]:
        """The arcs (branches taken) of ``filename``."""
        return sorted(self.arcs_by.get(filename, set()))

    def file_tracer(self, filename: str) -> str:
        """No plug-in traces files here (coverage.py's API: ``""``)."""
        return ""

    def contexts_by_lineno(self, filename: str) -> dict[int, list[str]]:
        """Each executed line of ``filename`` with the labels of the contexts it ran in."""
        out: dict[int, list[str]] = {}
        for label, by_file in self.lines_by.items():
            for line in by_file.get(filename, ()):
                out.setdefault(line, []).append(label)
        return out


class MonitorEngine:
    """Record with ``sys.monitoring``; see the module docstring.

    Args:
        mapper: which files are the repository's (``rel`` is None for the others).
        lines: collect executed lines of repo code (``LINE`` events).
        arcs: collect branches taken in repo code (``BRANCH`` events).
        exact: keep a repo code object's start events on until its context sampling
            retires it (the C tracer's rule; line mode), instead of after
            ``FULL_CALLS`` calls per sampling period.
    """

    #: The recorder need not add a ``sys.setprofile`` hook for contexts: starts feed them.
    feeds_calls = True
    #: Events of every thread reach the engine (sys.monitoring is process-wide).
    all_threads = True

    def __init__(self, mapper: PathMapper, *, lines: bool, arcs: bool, exact: bool) -> None:
        self.mapper = mapper
        self.lines = lines
        self.arcs = arcs
        self.exact = exact
        self.profiler: StartSink | None = None
        self.tool: int | None = None
        self._data = MonitorData(arcs)
        self._label = ""
        self._cur: dict[str, set[int]] = self._data.lines_by.setdefault("", {})
        # A code object's file name -> that name when it is repo code, else None. Keyed by
        # the name, not the code object: a str caches its hash, a code object hashes its
        # name, constants and names again at every lookup (callgrind, a call-heavy suite
        # on Python 3.12: about 2% of the instructions recording added).
        self._repo: dict[str, str | None] = {}
        self._local: set[CodeType] = set()  # code objects given local LINE/BRANCH events
        self._offsets: dict[CodeType, dict[int, int]] = {}  # instruction offset -> line
        self._taken: dict[tuple[CodeType, int], set[int]] = {}  # branch -> destinations
        self._events = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Claim a tool id, register the callbacks and switch the events on.

        Raises:
            MonitorUnavailable: every id of :data:`TOOL_IDS` is in use.
        """
        mon = _MON
        ev = mon.events
        self.tool = _claim_tool()
        mon.register_callback(self.tool, ev.PY_START, self._on_start)
        mon.register_callback(self.tool, ev.PY_RESUME, self._on_start)
        if self.lines:
            mon.register_callback(self.tool, ev.LINE, self._on_line)
        if self.arcs:
            mon.register_callback(self.tool, ev.BRANCH, self._on_branch)
        self._events = ev.PY_START | ev.PY_RESUME
        mon.set_events(self.tool, self._events)
        mon.restart_events()
        contexts.LABEL_WATCHERS.append(self.rearm)

    def stop(self) -> None:
        """Switch every event off, unregister and give the tool id back."""
        tool = self.tool
        if tool is None:
            return
        if self.rearm in contexts.LABEL_WATCHERS:
            contexts.LABEL_WATCHERS.remove(self.rearm)
        mon = _MON
        ev = mon.events
        mon.set_events(tool, ev.NO_EVENTS)
        for code in self._local:
            try:
                mon.set_local_events(tool, code, ev.NO_EVENTS)
            except ValueError:  # a code object that cannot be instrumented any more
                pass
        self._local.clear()
        self._taken.clear()
        for event in (ev.PY_START, ev.PY_RESUME, ev.LINE, ev.BRANCH):
            mon.register_callback(tool, event, None)
        mon.free_tool_id(tool)
        self.tool = None

    def switch_context(self, label: str) -> None:
        """Send what runs from now on to context ``label`` (a segment key; ``""``: the test)."""
        self._label = label
        self._cur = self._data.lines_by.setdefault(label, {})
        self.rearm()

    def rearm(self) -> None:
        """Switched-off events fire again: a new sampling period (segment, labels)."""
        if self.tool is not None:
            _MON.restart_events()

    def get_data(self) -> MonitorData:
        """What was collected (call after :meth:`stop`)."""
        return self._data

    # ------------------------------------------------------------------ callbacks

    def _file_of(self, code: CodeType) -> str | None:
        name = code.co_filename
        ok = name.endswith(".py") and self.mapper.rel(name) is not None
        self._repo[name] = got = name if ok else None
        return got

    def _on_start(self, code: CodeType, offset: int) -> Any:
        """A code object starts (or a generator resumes), in any thread.

        An exception raised here would surface in the test's own code: any is logged and
        the code's starts are switched off for this sampling period.
        """
        try:
            try:
                name = self._repo[code.co_filename]
            except KeyError:
                name = self._file_of(code)
            if name is None:
                return _DISABLE
            if (self.lines or self.arcs) and code not in self._local:
                self._instrument(code)
            prof = self.profiler
            if prof is None:
                return _DISABLE
            # The started frame is the callback's caller.
            if prof.on_start(sys._getframe(1), every_call=self.exact):
                return None
        except Exception as exc:  # noqa: BLE001 - never break the test over bookkeeping
            LOG.debug("start of %s not recorded: %r", getattr(code, "co_qualname", code), exc)
        return _DISABLE

    def _instrument(self, code: CodeType) -> None:
        mon = _MON
        events = (mon.events.LINE if self.lines else 0) | (mon.events.BRANCH if self.arcs else 0)
        assert self.tool is not None
        try:
            mon.set_local_events(self.tool, code, events)
        except ValueError as exc:  # never break the test over bookkeeping
            LOG.debug("no line events for %s: %r", code.co_qualname, exc)
        self._local.add(code)

    def _on_line(self, code: CodeType, line: int) -> Any:
        got = self._cur.get(code.co_filename)
        if got is None:
            got = self._cur[code.co_filename] = set()
        got.add(line)
        return _DISABLE

    def _on_branch(self, code: CodeType, src: int, dest: int) -> Any:
        table = self._offsets.get(code)
        if table is None:
            table = self._offsets[code] = _line_table(code)
        a, b = table.get(src), table.get(dest)
        if a is not None and b is not None:
            self._data.arcs_by.setdefault(code.co_filename, set()).add((a, b))
        seen = self._taken.setdefault((code, src), set())
        seen.add(dest)
        return _DISABLE if len(seen) >= 2 else None


_DISABLE: Any = getattr(_MON, "DISABLE", None)


def _line_table(code: CodeType) -> dict[int, int]:
    """Instruction offset -> line, for every instruction of ``code`` that has a line."""
    out: dict[int, int] = {}
    for start, end, line in code.co_lines():
        if line is not None:
            for off in range(start, end, 2):
                out[off] = line
    return out


def _free_tool() -> int:
    """The first free tool id of :data:`TOOL_IDS` (not claimed).

    Raises:
        MonitorUnavailable: every one is in use; the message names their holders.
    """
    mon = _MON
    held = []
    for tool in TOOL_IDS:
        owner = mon.get_tool(tool)
        if owner is None:
            return tool
        held.append(f"{tool} (held by {owner!r})")
    raise MonitorUnavailable("every sys.monitoring tool id FastCI may use is taken: "
                             + ", ".join(held))


def _claim_tool() -> int:
    """A free tool id of :data:`TOOL_IDS`, claimed for FastCI (:func:`_free_tool`)."""
    while True:
        tool = _free_tool()
        try:
            _MON.use_tool_id(tool, TOOL_NAME)
        except ValueError:  # claimed by another thread meanwhile: try the next
            continue
        return tool
