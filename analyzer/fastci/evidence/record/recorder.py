"""The recorder: runs inside a test process and writes its trace file.

``Recorder(test_id, out_dir, repo_root=..., workload=..., gpus=...)``;
``start()`` begins measuring, ``stop(outcome)`` writes the trace and returns
its path. While running it collects

* the units of repo files that ran: from each call event of repo code the
  contexts plug-in sees (:mod:`fastci.evidence.record.covplugin`; those frames get no
  line events, so such traces hold no lines), or, without contexts, from the
  executed lines (coverage.py's public API, in memory) mapped to units with
  :func:`fastci.units.lines.line_index` (checksums are added at ingest, from the
  file content the trace names by sha256);
* context signatures per unit (:mod:`fastci.evidence.record.contexts`);
* in *line mode* (``FASTCI_RECORD_LINES=1``, set by ``fastci calibrate`` and
  inherited by child processes): executed lines and arcs of every repo file as
  well as the contexts, which then come from a ``sys.setprofile`` hook instead of
  the plug-in (slower; calibration is not the hot path);
* files opened for reading under the repo (:mod:`fastci.evidence.record.files`);
* the environment fingerprint, workload, GPUs, duration and outcome;
* why the evidence is incomplete although the process stopped cleanly
  (``incomplete_reasons``): it started a Python interpreter that left no trace
  (:func:`fastci.evidence.record.children.python_start`, from the audit events of
  programs started), or ran backward on CUDA with a torch that cannot keep it
  on the calling thread.

While recording, autograd's multithreading is off
(:mod:`fastci.evidence.record.autograd`): backward passes and hooks run on the thread
that called backward, where the tracer sees them, not on torch's device threads.

``start()`` writes an *incomplete* trace at once; ``stop()`` atomically
replaces it, so a process killed in between leaves a file marked incomplete.
Child processes are recorded too (:mod:`fastci.evidence.record.children`).

*Segments* are evidence shared by several tests: between
``begin_segment(key)`` and ``end_segment()`` (they nest) lines, units,
contexts and reads go to the segment ``key`` instead of the test (a coverage
dynamic context per segment); ``stop()`` writes them into the trace's
``segments``. ``shared`` holds the keys of segments (from any trace of the
session) whose evidence is this test's too; ingest adds them to its run.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Mapping

from fastci import types
from fastci.evidence.record import distributions, environment, monitor, trace
from fastci.evidence.record.autograd import IMPORT_EVENT, AutogradSwitch
from fastci.evidence.record.children import (START_EVENTS, ChildEnvironment, PythonStart,
                                             python_start)
from fastci.evidence.record.contexts import ContextProfiler
from fastci.evidence.record.files import OpenRecorder, PathMapper, set_event_sink
from fastci.evidence.record.inputs import config_file_name, declared_digests
from fastci.evidence.record.scope import module_scope
from fastci.evidence.record.trace_files import fill_files, read_lines, unit_index
from fastci.evidence.record.traced import DynamoWatch, add_traced

LOG = logging.getLogger(__name__)

#: What :meth:`Recorder.stop` stores: pytest's words (:class:`fastci.types.Outcome`, so
#: ``xfailed``/``xpassed`` stay what they are, not errors) and "" for a child's trace.
OUTCOMES = (*sorted(types.OUTCOMES), "")
#: The directory of FastCI's evidence code (``fastci/evidence``: this recording package
#: and the store beside it): never measured as the tests' code, by the per-test recorder
#: or by the collection recorder.
EVIDENCE_CODE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# The recording running in this process, for the fork hook.
_CURRENT: "Recorder | None" = None
_FORK_HOOK = False
# Path mappers by (pid, repo root).
_MAPPERS: dict[tuple[int, str], PathMapper] = {}
#: Files coverage.py never measures for the recorder (installed code, FastCI's own).
_OMIT = ("*/.venv/*", "*/site-packages/*", "*/dist-packages/*",
         os.path.join(EVIDENCE_CODE_DIR, "*"))
# Coverage engines kept for reuse in this process, by (pid, sources, contexts); and the
# ids of those a recorder is using now. See _acquire_engine.
_ENGINES: dict[tuple[int, tuple[str, ...], bool, bool], Any] = {}
_BUSY: set[int] = set()


#: Set to ``1`` to record lines and arcs with contexts (line mode; see the module docstring).
LINES_ENV = "FASTCI_RECORD_LINES"


def line_mode() -> bool:
    """Whether this process records in line mode (``FASTCI_RECORD_LINES=1``)."""
    return os.environ.get(LINES_ENV) == "1"


def _acquire_engine(sources: list[str], contexts: bool, branch: bool = False) -> Any:
    """A coverage engine for ``sources``: this process's idle one, else a new one.

    Building a ``coverage.Coverage`` and starting it the first time costs about
    20 ms (coverage.py summarises the call stack with ``inspect.stack()`` and
    computes the interpreter's paths), and a fresh engine asks Python again
    whether to trace every file the test runs. pytest records one test after
    another in one process, so the engine is kept: :func:`_release_engine`
    erases its data after each recording, and the next one starts it again.
    """
    key = (os.getpid(), tuple(sources), contexts, branch)
    cov = _ENGINES.get(key)
    if cov is None or id(cov) in _BUSY:  # none yet, or nested recorders: a fresh one
        from fastci.evidence.record.covplugin import make_coverage  # coverage.py: only here

        cov = make_coverage(sources, list(_OMIT), contexts=contexts, branch=branch)
        _ENGINES.setdefault(key, cov)
    _BUSY.add(id(cov))
    return cov


def _engine_for(mapper: PathMapper, profiler: ContextProfiler | None, lines_mode: bool) -> Any:
    """The recording engine: ``sys.monitoring`` or coverage.py, as
    :func:`fastci.evidence.record.monitor.backend` chooses (the one place that decides)."""
    if monitor.backend() == "monitoring":
        try:
            return monitor.acquire(mapper, profiler, lines=lines_mode or profiler is None,
                                   arcs=lines_mode, exact=lines_mode)
        except monitor.MonitorUnavailable as exc:
            LOG.warning("fastci: %s; recording with coverage.py, which does not see "
                        "threads it did not start on", exc)
    return _acquire_engine(list(mapper.roots), profiler is not None and not lines_mode,
                           branch=lines_mode)


def _release_engine(cov: Any) -> None:
    """Erase what ``cov`` collected (it is stopped) and make it available again."""
    if monitor.release(cov):
        return
    try:
        cov.get_data().erase()
    except Exception:  # never reuse an engine in an unknown state
        for key, kept in list(_ENGINES.items()):
            if kept is cov:
                del _ENGINES[key]
    _BUSY.discard(id(cov))


_EVENTS = START_EVENTS | {IMPORT_EVENT}


def _on_event(event: str, args: tuple[Any, ...]) -> None:
    """An audit event of ``_EVENTS`` (any thread): hand it to the running recorder."""
    rec = _CURRENT
    if rec is None or not rec.recording:
        return
    if event == IMPORT_EVENT:
        rec._autograd.on_import()
        return
    started = python_start(event, args)
    if started is not None:
        rec._python_started(event, started)


def _after_fork_in_child() -> None:
    rec = _CURRENT
    if rec is not None and rec._cov is not None:
        rec._forked()



def _known_outcome(outcome: str) -> str:
    """``outcome`` when it is one of :data:`OUTCOMES`, else "error" (never lose a trace
    over a label: record it as an error)."""
    if outcome in OUTCOMES:
        return outcome
    LOG.warning("unknown outcome %r recorded as 'error' (expected one of %s)", outcome, OUTCOMES)
    return "error"


@dataclass
class _Measured:
    """What a recording measured: per repo file its lines and arcs, per segment its
    files' lines, and the contexts per unit (``ctx``)."""

    ctx: Any
    seg_lines: dict[str, dict[str, list[int]]]
    lines: dict[str, list[int]] = field(default_factory=dict)
    arcs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

class Recorder:
    """Record what one test process executes; see the module docstring."""

    def __init__(self, test_id: str, out_dir: Path, *, repo_root: Path,
                 workload: Mapping[str, object], gpus: int, role: str = "main",
                 overrides: Mapping[str, object] | None = None,
                 run_id: str | None = None, contexts: bool = True,
                 children: bool = True) -> None:
        self.test_id = test_id
        self.out_dir = Path(out_dir)
        self.repo_root = Path(repo_root).resolve()
        self.workload = dict(workload)  # the declared (full) workload
        # What the run changed from it (a plan's reduction); None when not known.
        self.overrides = dict(overrides) if overrides is not None else None
        self.gpus = int(gpus)
        self.role = role
        self.run_id = run_id or uuid.uuid4().hex
        self.path = self.out_dir / trace.file_name(test_id, self.run_id, os.getpid())
        # The recorder's own package is machinery, not evidence.
        self.mapper = _mapper(self.repo_root)
        self._contexts = ContextProfiler(self.mapper) if contexts else None
        self._opens = OpenRecorder(self.mapper)
        self._children = children and role == "main"
        self._child_env: ChildEnvironment | None = None
        self._cov: Any = None
        self._t0 = 0.0
        self._started_at = 0.0
        self._stopped = False
        self._profile_hook: Callable[[FrameType, str, Any], None] | None = None
        self._autograd = AutogradSwitch()
        # Command lines of the Python interpreters this process started while recording
        # that should leave a trace, and why those that cannot were missed.
        self._python_starts: list[str] = []
        self._untraced: list[str] = []
        #: Keys of segments whose evidence is this test's too (see the module docstring).
        self.shared: set[str] = set()
        self._open_segments: list[str] = []
        self._segment_includes: dict[str, set[str]] = {}
        self._segment_ctx: dict[str, dict[tuple[str, str], tuple[set[str], int]]] = {}
        # Frames dynamo traces symbolically never run as Python (fastci.evidence.record.traced).
        self._traced = DynamoWatch(lambda: self._open_segments[-1] if self._open_segments
                                   else None)

    # ------------------------------------------------------------------ lifecycle

    def _header(self) -> trace.TraceMsg:
        return trace.Trace(
            format_version=trace.FORMAT_VERSION, test_id=self.test_id, run_id=self.run_id,
            complete=False, role=self.role, pid=os.getpid(), parent_pid=os.getppid(),
            started_at=self._started_at, gpus=self.gpus,
            workload_json=json.dumps(self.workload, sort_keys=True, default=str),
            overrides_json="" if self.overrides is None else json.dumps(
                self.overrides, sort_keys=True, default=str),
            argv=" ".join(sys.argv)[:2000])

    def start(self) -> None:
        """Write the incomplete header and start measuring."""
        self._started_at = time.time()
        self._t0 = time.perf_counter()
        trace.write_atomic(self.path, self._header())
        if self._children:
            self._child_env = ChildEnvironment(
                self.out_dir, self.test_id, self.run_id, self.repo_root,
                {"workload": self.workload, "gpus": self.gpus})
            self._child_env.install()
        lines_mode = line_mode()
        cov = _engine_for(self.mapper, self._contexts, lines_mode)
        self._cov = cov
        self._opens.start()
        self._python_starts, self._untraced = [], []
        self._autograd.start()
        set_event_sink(_on_event, _EVENTS)
        if self._contexts is not None:
            self._contexts.start()
            if lines_mode and not getattr(cov, "feeds_calls", False):
                self._profile_hook = _profile_hook(self._contexts)
                threading.setprofile(self._profile_hook)
                sys.setprofile(self._profile_hook)
        self._traced.start()
        cov.start()
        global _CURRENT, _FORK_HOOK
        _CURRENT = self
        if not _FORK_HOOK and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _FORK_HOOK = True

    def _forked(self) -> None:
        """In a forked child (no exec): go on measuring as a child with its own trace.

        The tracer and its data are inherited; the child writes its trace at exit
        (``atexit``, and multiprocessing's finalizers, which fork children run
        before ``os._exit``). A child that dies leaves its incomplete header.
        """
        self.role = "child"
        self._child_env = None  # the parent's: never undo it from a child
        self._python_starts, self._untraced = [], []  # the parent's children are not its
        self._started_at = time.time()
        self._t0 = time.perf_counter()
        self.path = self.out_dir / trace.file_name(self.test_id, self.run_id, os.getpid())
        self._stopped = False
        trace.write_atomic(self.path, self._header())
        atexit.register(self._stop_child)
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # Process._bootstrap clears finalizers registered before it, then runs
            # the after-fork hooks: register the finalizer from one of those.
            mp_util.register_after_fork(self, Recorder._finalize_in_mp_child)

    @staticmethod
    def _finalize_in_mp_child(rec: "Recorder") -> None:
        import multiprocessing.util

        multiprocessing.util.Finalize(None, rec._stop_child, exitpriority=0)

    def _stop_child(self) -> None:
        if not self._stopped:
            try:
                self.stop("")
            except Exception as exc:  # at exit: report, never raise
                sys.stderr.write(f"fastci: forked child trace not written: {exc!r}\n")

    def _python_started(self, event: str, start: PythonStart) -> None:
        """This process started (or, ``os.exec``, became) the Python interpreter ``start``."""
        if event != "os.exec":
            if start.untraced:
                self._untraced.append(f"it started a Python child ({start.command}) that "
                                      f"left no trace: {start.untraced}")
            else:
                self._python_starts.append(start.command)
            return
        if not start.untraced:
            return  # the new interpreter records (same pid, so it replaces this trace)
        # This process is being replaced by one that will not record: its trace stays this
        # header, which says why.
        msg = self._header()
        msg.incomplete_reasons.append(f"it replaced itself with a Python interpreter "
                                      f"({start.command}) that left no trace: {start.untraced}")
        try:
            trace.write_atomic(self.path, msg)
        except OSError as exc:
            LOG.debug("trace header not rewritten before exec: %r", exc)

    def _children_without_trace(self) -> str:
        """Why Python children this process started are missing from the evidence (or ``""``).

        Those that cannot record (:attr:`PythonStart.untraced`) are named as they start.
        For the others: a child that recorded left a trace file of this run (its name holds
        the test, the run and the pid) whose header names this process as its parent, or a
        process that left no trace of its own (a shell or a wrapper such as ``env`` between
        them). Traces of children started without an audit event (forked ones, which keep
        this process's argv, and multiprocessing's spawned ones) are not counted: fewer
        found than started means some left none.
        """
        if self.role == "shared":
            return ""
        known = "; ".join(dict.fromkeys(self._untraced))
        started = list(self._python_starts)
        if not started:
            return known
        prefix = trace.file_name(self.test_id, self.run_id, 0)[:-len("0" + trace.SUFFIX)]
        heads: dict[int, trace.TraceMsg] = {}
        try:
            names = [p for p in self.out_dir.iterdir()
                     if p.name.startswith(prefix) and p.name.endswith(trace.SUFFIX)]
        except OSError:
            names = []
        for p in names:
            try:
                head = trace.decode_head(p.read_bytes(), origin=str(p))
            except Exception:  # a child's trace being written or broken: not seen
                continue
            heads[head.pid] = head
        me, argv = os.getpid(), self._header().argv
        mine = 0
        for pid, head in heads.items():
            if pid == me or head.role != "child" or not (
                    head.parent_pid == me or head.parent_pid not in heads):
                continue
            if head.argv == argv or "--multiprocessing-fork" in head.argv.split():
                continue
            mine += 1
        missing = len(started) - mine
        if missing <= 0:
            return known
        if len(started) == 1:
            why = f"it started a Python child ({started[0]}) that left no trace"
        else:
            why = (f"it started {len(started)} Python children and {missing} of them left "
                   f"no trace (one of: {'; '.join(dict.fromkeys(started))[:300]})")
        return f"{known}; {why}" if known else why

    @property
    def recording(self) -> bool:
        """Whether this recorder is measuring now."""
        return self._cov is not None and not self._stopped

    def begin_segment(self, key: str) -> None:
        """Send what runs from now on to segment ``key`` (nested in the open one, if any)."""
        if not self.recording:
            raise RuntimeError(f"segment {key!r} begun while not recording")
        if self._open_segments:
            self._segment_includes[self._open_segments[-1]].add(key)
        self._segment_includes.setdefault(key, set())
        self._open_segments.append(key)
        if self._contexts is not None:
            self._contexts.begin_segment()
        self._switch(key)

    def end_segment(self) -> str:
        """Close the innermost open segment; return its key."""
        key = self._open_segments.pop()
        if self._contexts is not None:
            got = self._contexts.end_segment()
            mine = self._segment_ctx.setdefault(key, {})
            for k, (sigs, calls) in got.items():
                old_sigs, old_calls = mine.get(k, (set(), 0))
                mine[k] = (old_sigs | sigs, old_calls + calls)
        self._switch(self._open_segments[-1] if self._open_segments else None)
        return key

    def _switch(self, key: str | None) -> None:
        if self._cov is not None:
            self._cov.switch_context(key or "")
        self._opens.segment = key

    def stop(self, outcome: str) -> Path:
        """Stop measuring, write the complete trace atomically, return its path."""
        outcome = _known_outcome(outcome)
        cov = self._stop_measuring()
        measured = self._measured(cov)
        reads, unseen = self._stop_watching()
        msg = self._header()
        msg.complete = True
        msg.incomplete_reasons.extend(unseen)
        msg.outcome = outcome
        msg.duration_s = time.perf_counter() - self._t0
        msg.environment.CopyFrom(environment.current())
        self._write_evidence(msg, measured, reads)
        return trace.write_atomic(self.path, msg)

    def _stop_measuring(self) -> Any:
        """Stop every tracer (open segments ended, the profile hook removed, coverage
        stopped); the stopped coverage engine, or None."""
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None
        while self._open_segments:  # stopped inside a fixture's setup: keep what ran
            self.end_segment()
        self._stopped = True
        if self._profile_hook is not None:
            if sys.getprofile() is self._profile_hook:
                sys.setprofile(None)
            threading.setprofile(None)
            self._profile_hook = None
        cov = self._cov
        if cov is not None:
            cov.stop()
        return cov

    def _measured(self, cov: Any) -> _Measured:
        """What ran: lines, arcs and contexts of the test and of each segment, the
        engine given back for reuse, code dynamo traced added."""
        ctx = self._contexts.stop() if self._contexts is not None else {}
        m = _Measured(ctx=ctx, seg_lines={k: {} for k in self._segment_includes})
        if cov is not None:
            try:
                read_lines(cov.get_data(), self.mapper, m.lines, m.seg_lines, m.arcs)
            finally:
                self._cov = None
                _release_engine(cov)
        add_traced(self._traced, self.mapper, m.lines, ctx, self._segment_ctx,
                   lambda rel: unit_index(self.mapper, rel)[0])
        return m

    def _stop_watching(self) -> tuple[dict[str, str], list[str]]:
        """Stop the audit sinks, autograd switch and child environment: the files read
        (declared inputs of a main process included) and why evidence is missing."""
        reads = self._opens.stop()
        # After the open sink stopped: reading the children's traces is no input.
        unseen = [why for why in (self._autograd.unseen(), self._children_without_trace())
                  if why]
        self._autograd.restore()
        if self.role == "main":  # files native code reads, declared in fastci.yaml
            try:
                reads = {**declared_digests(self.test_id, self._config_root()), **reads}
            except Exception as exc:  # noqa: BLE001 - never lose the trace over bookkeeping
                # Nothing declared is recorded: planning sees the files as added and selects.
                LOG.warning("declared inputs of %s not recorded: %s: %s", self.test_id,
                            type(exc).__name__, exc)
        if self._child_env is not None:
            self._child_env.uninstall()
            self._child_env = None
        return reads, unseen

    def _write_evidence(self, msg: Any, m: _Measured, reads: Mapping[str, str]) -> None:
        """Fill ``msg`` with the files, reads and segments measured, the shared segments'
        keys, the module scope and the third-party distributions imported."""
        table = trace.ContextTable(msg)
        self._fill(msg.files, m.lines, m.ctx, table, m.arcs)
        for rel, digest in sorted(reads.items()):
            if rel not in m.lines:
                msg.reads.add(path=rel, digest=digest)
        for key, includes in self._segment_includes.items():
            seg = msg.segments.add(key=key, includes=sorted(includes))
            self._fill(seg.files, m.seg_lines[key], self._segment_ctx.get(key, {}), table)
            for rel, digest in self._opens.resolve(self._opens.by_segment.get(key, set())).items():
                if rel not in m.seg_lines[key]:
                    seg.reads.add(path=rel, digest=digest)
        table.close()
        msg.shared.extend(sorted(self.shared))
        repo_n, outside_n, example = module_scope(self.mapper)
        msg.modules.repo_modules = repo_n
        msg.modules.outside_modules = outside_n
        msg.modules.outside_example = example
        for name, version in distributions.imported().items():  # third-party imports
            msg.distributions.add(name=name, version=version)

    def _config_root(self) -> Path:
        """Where ``fastci.yaml`` is: the repository root, else (under Bazel, whose runfiles
        tree may not hold it) the source tree behind the runfiles symlinks."""
        for root in (str(self.repo_root), *self.mapper.roots):
            if (Path(root) / config_file_name()).is_file():
                return Path(root)
        return self.repo_root

    def _fill(self, files: Any, lines: Mapping[str, list[int]],
              ctx: Mapping[tuple[str, str], tuple[set[str], int]],
              table: trace.ContextTable,
              arcs: Mapping[str, list[tuple[int, int]]] | None = None) -> None:
        fill_files(self.mapper, files, lines, ctx, table, arcs)


def _profile_hook(profiler: ContextProfiler) -> Callable[[FrameType, str, Any], None]:
    """A ``sys.setprofile`` function that feeds call events to ``profiler`` (line mode)."""
    on_call = profiler.on_call

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            on_call(frame)
    return hook


def _mapper(repo_root: Path) -> PathMapper:
    """This process's path mapper for ``repo_root``, shared by its recorders.

    pytest records one test after another in one process; a shared mapper keeps
    what it learned (file name -> repo path) instead of mapping every file again.
    """
    key = (os.getpid(), str(repo_root))
    mapper = _MAPPERS.get(key)
    if mapper is None:
        mapper = _MAPPERS[key] = PathMapper(repo_root, omit_dirs=(EVIDENCE_CODE_DIR,))
    return mapper
