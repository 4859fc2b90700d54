"""Record what runs while pytest collects, as segments shared by the tests that need it.

Module top levels run once per process: test module ``A`` imports ``consts``
and runs its top level; test module ``B`` does ``from consts import LIMIT``
later and finds it in ``sys.modules``. So what a test needs from collection is
not "what ran while its module was collected" but "the top levels of every
module its module imported, when- and by whomever they first ran". The
recorder keeps a graph of *contexts* (coverage.py dynamic contexts, one
coverage run for the whole collection):

* one per collector node (session, directory, package, module, class), entered
  and left around its ``pytest_make_collect_report`` (conftest files of a
  directory are imported there; ``pytest_generate_tests`` runs in the module's);
* one per module execution: the ``exec`` audit event of a ``<module>`` code
  object (importlib runs every source module body with ``exec``, whatever
  imported it) opens the module's context, nested in the one that imported it,
  with an edge parent -> module. Its end is taken from the import call that
  returned (``builtins.__import__`` and ``importlib.import_module`` are
  wrapped) and, for modules run another way, from the interpreter stack at the
  next module execution; until then lines go to the finished module's context,
  which every enclosing context includes — over-attribution, never less;
* an edge from the current context to the context of every module an
  ``import`` statement or ``import_module`` call *requests*, already imported
  or not (and its parent packages, and submodules named in ``from x import y``).

Each context with evidence (or with a path to one that has) becomes a
:class:`Segment` (its units, lines, contexts and file reads, and the keys it
includes) in one shared trace; a test item's trace names the segments of its
collector chain and the session's. After collection the import wrappers stay
until the end of the session so that a test that imports an already imported
module in its body names that module's segment too.

Limits: imports in threads other than the collecting one are not followed
(what they run is attributed to the current context); a module that a test
imports for the first time (not during collection) stays that test's evidence.
"""

from __future__ import annotations

import builtins
import importlib
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable, Iterable

from fastci.evidence.record import active, environment, files as files_mod, monitor, trace
from fastci.evidence.record.contexts import ContextProfiler
from fastci.evidence.record.files import OpenRecorder, PathMapper
from fastci.evidence.record.recorder import EVIDENCE_CODE_DIR
from fastci.evidence.record.trace_files import fill_files

LOG = logging.getLogger(__name__)
SHARED_ROLE = "shared"


@dataclass
class _Context:
    label: str
    includes: set[int] = field(default_factory=set)


class CollectionRecorder:
    """Record pytest's collection as segments; see the module docstring.

    ``start()`` before collection (initial conftests included), ``enter_node``/
    ``leave_node`` around each collector, ``stop()`` when collection is done,
    then ``write(out_dir)``; ``keys_for(nodeids)`` are an item's segments.
    """

    def __init__(self, repo_root: Path, session: str | None = None) -> None:
        self.repo_root = Path(repo_root).resolve()
        self.session = session or uuid.uuid4().hex
        self.mapper = PathMapper(self.repo_root, omit_dirs=(EVIDENCE_CODE_DIR,))
        self._ctx: list[_Context] = [_Context("session")]
        self._stack: list[tuple[int, CodeType | None]] = [(0, None)]
        self._by_file: dict[str, int] = {}     # module file -> its context
        self._by_node: dict[str, int] = {}     # collector node id -> its context
        self._want = 0  # the context lines should go to now
        self._have = 0  # the context coverage is collecting into
        self._profilers: dict[int, ContextProfiler] = {}
        self._opens = OpenRecorder(self.mapper)
        self._reads: dict[int, set[str]] = {}
        self._cov: Any = None
        self._tid = threading.get_ident()
        self._collecting = False
        self._closed = False
        self._data: Any = None
        self._orig_import: Callable[..., Any] | None = None
        self._orig_import_module: Callable[..., Any] | None = None
        self._emitted: dict[int, str] = {}  # context -> segment key, after stop()
        self._started_at = 0.0
        #: Module names requested by ``import`` while a test runs (see :meth:`take_requested`).
        self._requested: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start measuring, following module executions and imports."""
        self._started_at = time.time()
        cov = _engine(self)
        self._cov = cov
        self._collecting = True
        self._install_import_hooks()
        files_mod.set_open_sink(self._on_open)
        files_mod.set_exec_sink(self._on_exec)
        active.activate(self)
        cov.start()
        cov.switch_context(self._label(0))

    def stop(self) -> None:
        """Stop measuring (collection is over); import requests are still noted."""
        if not self._collecting:
            return
        self._collecting = False
        files_mod.set_exec_sink(None)
        files_mod.set_open_sink(None)
        if active.ACTIVE is self:
            active.activate(None)
        cov, self._cov = self._cov, None
        cov.stop()
        self._data = cov.get_data()
        if monitor.release(cov):  # its data is erased: calls only, no lines were collected
            self._data = monitor.MonitorData(False)

    def close(self) -> None:
        """Remove the import wrappers (end of the session)."""
        self._closed = True  # a wrapper that someone else still calls passes through
        if self._orig_import is not None and builtins.__import__ == self._import:
            builtins.__import__ = self._orig_import
        if self._orig_import_module is not None and importlib.import_module == self._import_module:
            importlib.import_module = self._orig_import_module

    # ------------------------------------------------------------------ contexts

    def _label(self, ctx: int) -> str:
        return f"c{ctx}"

    def _new(self, label: str) -> int:
        self._ctx.append(_Context(label))
        return len(self._ctx) - 1

    def _push(self, ctx: int, code: CodeType | None) -> None:
        self._stack.append((ctx, code))
        self._want = ctx

    def _truncate(self, depth: int) -> None:
        if len(self._stack) > depth:
            del self._stack[depth:]
        self._want = self._stack[-1][0]
        if self._have != self._want and self._cov is not None:
            self._have = self._want
            self._cov.switch_context(self._label(self._want))

    def enter_node(self, nodeid: str) -> int:
        """A collector starts collecting: what runs now is needed by the items under it."""
        if not self._collecting:
            return len(self._stack)
        depth = len(self._stack)
        ctx = self._by_node.get(nodeid)
        if ctx is None:
            ctx = self._by_node[nodeid] = self._new(f"node {nodeid or '<session>'}")
        self._push(ctx, None)
        self._truncate(len(self._stack))  # switch now: collection code is mostly not repo code
        return depth

    def leave_node(self, depth: int) -> None:
        """The collector that :meth:`enter_node` returned ``depth`` for is done."""
        if self._collecting:
            self._truncate(depth)

    def dynamic_source_filename(self, filename: str | None, frame: FrameType) -> str | None:
        """The coverage plug-in's hook (:func:`fastci.evidence.record.active.activate`)."""
        self.on_call(frame)
        return filename

    def on_call(self, frame: FrameType) -> None:
        """A call of repo code (from the coverage plug-in): switch context lazily here."""
        want = self._want  # inlined (not _profiler_now): every call of repo code comes here
        if want != self._have and self._cov is not None:
            self._have = want
            self._cov.switch_context(self._label(want))
        prof = self._profilers.get(want)
        if prof is None:
            prof = self._profilers[want] = ContextProfiler(self.mapper)
        prof.on_call(frame)

    def on_start(self, frame: FrameType, *, every_call: bool) -> bool:
        """A start of repo code from the ``sys.monitoring`` engine (:mod:`fastci.evidence.record.monitor`):
        as :meth:`on_call`; whether later starts of the code are wanted in this context (a
        context switch makes every start fire again)."""
        return self._profiler_now().on_start(frame, every_call=every_call)

    def _profiler_now(self) -> ContextProfiler:
        want = self._want
        if want != self._have and self._cov is not None:
            self._have = want
            self._cov.switch_context(self._label(want))
        prof = self._profilers.get(want)
        if prof is None:
            prof = self._profilers[want] = ContextProfiler(self.mapper)
        return prof

    def _on_open(self, name: str) -> None:
        if not os.path.isabs(name):
            name = os.path.join(os.getcwd(), name)
        self._reads.setdefault(self._want, set()).add(name)

    def _on_exec(self, code: object) -> None:
        """A module body starts: open its context under the module that runs it."""
        if not isinstance(code, CodeType) or code.co_name != "<module>" or \
                code.co_filename.startswith("<") or threading.get_ident() != self._tid:
            return
        self._sync()
        ctx = self._by_file.get(code.co_filename)
        if ctx is None:
            ctx = self._by_file[code.co_filename] = self._new(f"module {code.co_filename}")
        self._ctx[self._want].includes.add(ctx)
        self._push(ctx, code)

    def _sync(self) -> None:
        """Close module contexts whose module body is no longer on the interpreter stack."""
        if self._stack[-1][1] is None:
            return
        live: set[CodeType] = set()
        f: FrameType | None = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name == "<module>":
                live.add(f.f_code)
            f = f.f_back
        depth = len(self._stack)
        while depth > 1 and self._stack[depth - 1][1] is not None \
                and self._stack[depth - 1][1] not in live:
            depth -= 1
        self._truncate(depth)

    # ------------------------------------------------------------------ imports

    def _install_import_hooks(self) -> None:
        if self._orig_import is None:
            self._orig_import = builtins.__import__
            builtins.__import__ = self._import
        if self._orig_import_module is None:
            self._orig_import_module = importlib.import_module
            importlib.import_module = self._import_module

    def _import(self, name: str, globals: Any = None, locals: Any = None,
                fromlist: Any = (), level: int = 0) -> Any:
        orig = self._orig_import
        assert orig is not None
        if self._closed or threading.get_ident() != self._tid:
            return orig(name, globals, locals, fromlist, level)
        depth = len(self._stack)
        try:
            return orig(name, globals, locals, fromlist, level)
        finally:
            if self._collecting:
                self._truncate(depth)
            self._note(name, globals, fromlist, level)

    def _import_module(self, name: str, package: str | None = None) -> Any:
        orig = self._orig_import_module
        assert orig is not None
        if self._closed or threading.get_ident() != self._tid:
            return orig(name, package)
        depth = len(self._stack)
        try:
            return orig(name, package)
        finally:
            if self._collecting:
                self._truncate(depth)
            if name.startswith("."):
                self._note(name.lstrip("."), {"__package__": package}, (),
                           len(name) - len(name.lstrip(".")))
            else:
                self._note(name, None, (), 0)

    def _note(self, name: str, globals: Any, fromlist: Any, level: int) -> None:
        """Record that the current context (or test) needs module ``name`` and its parents."""
        try:
            if level:
                package = (globals or {}).get("__package__") or ""
                base = package.rsplit(".", level - 1)[0] if level > 1 else package
                name = f"{base}.{name}" if name else base
            names = [name]
            if fromlist:
                names.extend(f"{name}.{x}" for x in fromlist if isinstance(x, str) and x != "*")
        except Exception:  # never break an import over bookkeeping
            return
        if not self._collecting:
            self._requested.update(names)
            return
        cur = self._ctx[self._want].includes
        for ctx in self._module_contexts(names):
            cur.add(ctx)

    def _module_contexts(self, names: Iterable[str]) -> set[int]:
        out: set[int] = set()
        modules = sys.modules
        for full in names:
            parts = full.split(".")
            for i in range(1, len(parts) + 1):
                mod = modules.get(".".join(parts[:i]))
                fname = getattr(mod, "__file__", None) if mod is not None else None
                ctx = self._by_file.get(fname) if isinstance(fname, str) else None
                if ctx is not None:
                    out.add(ctx)
        return out

    def take_requested(self) -> list[str]:
        """Segment keys of the modules imported since the last call (for the running test)."""
        names, self._requested = self._requested, set()
        return sorted({self._emitted[c] for c in self._module_contexts(names) if c in self._emitted})

    # ------------------------------------------------------------------ output

    def keys_for(self, nodeids: Iterable[str]) -> list[str]:
        """The segment keys an item with these collector node ids (its chain) needs."""
        ctxs = {0, *(self._by_node[n] for n in nodeids if n in self._by_node)}
        return sorted(self._emitted[c] for c in ctxs if c in self._emitted)

    def write(self, out_dir: Path) -> Path:
        """Write the segments into one shared trace in ``out_dir``; return its path."""
        lines: dict[int, dict[str, list[int]]] = {}
        data = self._data
        for fname in data.measured_files():
            rel = self.mapper.rel(fname)
            if rel is None:
                continue
            for line, labels in data.contexts_by_lineno(fname).items():
                for label in labels:
                    ctx = int(label[1:]) if label.startswith("c") and label[1:].isdigit() else 0
                    lines.setdefault(ctx, {}).setdefault(rel, []).append(line)
        ctx_data = {i: prof.stop() for i, prof in self._profilers.items()}
        reads = {i: self._opens.resolve(names) for i, names in self._reads.items()}
        has = {i for i in range(len(self._ctx)) if lines.get(i) or ctx_data.get(i) or reads.get(i)}
        keep = _reaching(has, self._ctx)
        self._emitted = {i: f"{self.session}/{self._label(i)}" for i in sorted(keep)}
        msg = trace.Trace(
            format_version=trace.FORMAT_VERSION, test_id="", run_id=self.session, complete=True,
            role=SHARED_ROLE, pid=_pid(), started_at=self._started_at,
            argv=" ".join(sys.argv)[:2000])
        msg.environment.CopyFrom(environment.current())
        table = trace.ContextTable(msg)
        for i in sorted(keep):
            seg = msg.segments.add(key=self._emitted[i], includes=sorted(
                self._emitted[c] for c in self._ctx[i].includes if c in keep and c != i))
            fill_files(self.mapper, seg.files, lines.get(i, {}), ctx_data.get(i, {}), table)
            for rel, digest in sorted(reads.get(i, {}).items()):
                if rel not in lines.get(i, {}):
                    seg.reads.add(path=rel, digest=digest)
        table.close()
        path = Path(out_dir) / f"s-collection.{self.session[:12]}.{_pid()}{trace.SUFFIX}"
        return trace.write_atomic(path, msg)


def _engine(col: CollectionRecorder) -> Any:
    """The engine :func:`fastci.evidence.record.monitor.backend` chooses: ``sys.monitoring`` (module
    bodies and every call reach :meth:`CollectionRecorder.on_start`; each context switch
    re-arms the starts), else coverage.py with the contexts plug-in."""
    if monitor.backend() == "monitoring":
        try:
            return monitor.acquire(col.mapper, col, lines=False, arcs=False, exact=False)
        except monitor.MonitorUnavailable as exc:
            LOG.warning("fastci: %s; collection recorded with coverage.py", exc)
    from fastci.evidence.record.covplugin import make_coverage  # coverage.py: only here

    return make_coverage(list(col.mapper.roots),
                         ["*/.venv/*", "*/site-packages/*", "*/dist-packages/*",
                          f"{EVIDENCE_CODE_DIR}/*"], contexts=True)


def _pid() -> int:
    return os.getpid()


def _reaching(has: set[int], ctxs: list[_Context]) -> set[int]:
    """Contexts with evidence, and those from which one is reachable by includes."""
    rev: dict[int, set[int]] = {}
    for i, c in enumerate(ctxs):
        for j in c.includes:
            rev.setdefault(j, set()).add(i)
    keep = set(has)
    todo = list(has)
    while todo:
        for parent in rev.get(todo.pop(), ()):
            if parent not in keep:
                keep.add(parent)
                todo.append(parent)
    return keep
