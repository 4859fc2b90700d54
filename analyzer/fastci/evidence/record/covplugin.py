"""A coverage.py file-tracer plug-in that feeds call frames of repo files to contexts.

``sys.setprofile`` costs a Python call on every call, return and C call of the
whole process (measured: +70% on a microllm training loop with a no-op hook).
coverage.py's C tracer already decides per file whether to trace; a file
tracer plug-in (public plug-in API) that claims the repo's files and declares
a *dynamic source filename* gets one Python call per call event of repo code
only — torch's and the standard library's frames never reach Python. The
plug-in answers coverage.py's own (None) name, which leaves those frames without
line events: with contexts, a trace holds the units whose calls were seen (every
call reaches the plug-in), not executed lines (see ``dynamic_source_filename``).
(Measured on a microllm training run: +36% with a Python ``line_number_range``,
see ``_Tracer``; ``make bench`` prints the current number.)
"""

from __future__ import annotations

import operator
import os
from types import FrameType
from typing import Any

import coverage
from coverage import collector as _collector
from coverage.disposition import disposition_init

from fastci.evidence.record import active

#: Every private name of coverage.py this module uses, as (where, name, parameters or
#: None for a non-callable, why). Private names can change in any minor release:
#: pyproject.toml pins coverage to the tested minor (third_party/requirements.txt), and
#: tests/test_coverage_contract.py checks each entry against the installed coverage.py
#: and that this module uses no private name missing here. Each has no public
#: equivalent: the public API offers no hook before the collector is built, none per
#: file decision, and no ``get_data`` without the unexecuted-file walk of ``source``.
COVERAGE_PRIVATE: tuple[tuple[str, str, tuple[str, ...] | None, str], ...] = (
    ("coverage.Coverage", "_init_for_start", ("self",),
     "overridden: builds the Collector; short_stack is swapped around it"),
    ("coverage.Coverage", "_should_trace", ("self", "filename", "frame"),
     "overridden: the per-file trace decision, answered early for outside files"),
    ("coverage.Coverage", "_post_save_work", ("self",),
     "overridden to do nothing: get_data's walk of unexecuted source files"),
    ("coverage.Coverage", "_inorout", None,
     "read: its disp_class is the disposition class of the running core"),
    ("coverage.inorout.InOrOut", "disp_class", None,
     "read: the class disposition_init must build (C or Python tracer)"),
    ("coverage.collector", "short_stack", ("skip", "full", "frame_ids", "short_filenames"),
     "swapped while the Collector is built: its debug-only inspect.stack()"),
    ("coverage.disposition", "disposition_init", ("cls", "original_filename"),
     "called: a 'do not trace' disposition, as coverage.py builds one"),
)

PLUGIN_MODULE = __name__


def _idle(filename: str | None, frame: FrameType) -> str | None:
    return filename


def _bind(target: Any) -> None:
    """Send the plug-in's call events to ``target``, the active profiler
    (:mod:`fastci.evidence.record.active`; None: to nobody).

    ``target`` has ``dynamic_source_filename(filename, frame)`` (answering what the
    plug-in must answer, see :class:`_Tracer`) and ``on_call(frame)``. Its bound
    method becomes the tracers' own ``dynamic_source_filename``: coverage.py's C
    tracer then calls it directly, one Python frame per call event of repo code
    instead of two (measured: a third of the recorder's cost on call-heavy code).
    """
    # A bound method stored on the class is not re-bound on access (a plain function
    # would be: hence the staticmethod): the tracer instance's attribute is the hook.
    hook = target.dynamic_source_filename if target is not None else staticmethod(_idle)
    setattr(_Tracer, "dynamic_source_filename", hook)


class _Tracer(coverage.FileTracer):
    # coverage's C tracer calls line_number_range on every line event of a
    # plug-in-traced file; a C callable returning (f_lineno, f_lineno) keeps
    # that out of Python (the default method costs a Python call per line).
    line_number_range = operator.attrgetter("f_lineno", "f_lineno")  # type: ignore[assignment]

    def __init__(self, filename: str) -> None:
        self._filename = filename

    def source_filename(self) -> str:
        return self._filename

    def has_dynamic_source_filename(self) -> bool:
        return True

    # coverage.py passes None as ``filename``, and answering None leaves the frame
    # without line tracing: only the call event reaches the plug-in. Answering the
    # file's name would trace its lines too, but coverage.py 7.17's C tracer then
    # crashes (SIGSEGV) in multi-threaded tests (thread ranks: reproduced with the
    # example's checkpoint_crash_test even with on_call disabled). So traces made
    # with contexts carry the units each call event saw, not lines.
    # ``activate`` replaces this with the active target's bound method.
    dynamic_source_filename = staticmethod(_idle)


class _Plugin(coverage.CoveragePlugin):
    def file_tracer(self, filename: str) -> _Tracer | None:
        prof = active.ACTIVE
        if prof is None or not filename.endswith(".py") or prof.mapper.rel(filename) is None:
            return None
        return _Tracer(filename)

    def file_reporter(self, filename: str) -> str:
        return "python"


def coverage_init(reg: Any, options: Any) -> None:
    """coverage.py's plug-in entry point."""
    reg.add_file_tracer(_Plugin())


class _Coverage(coverage.Coverage):
    """A Coverage that skips work whose answer the recorder already knows.

    * ``get_data()`` after ``stop()`` walks every ``source`` folder for files that
      never ran, to report them at 0%, and checks for warnings; the recorder reads
      executed lines only and silences those warnings, and the walk cost about 3 ms
      per recorded test (a full tree walk each time). Overriding this hook changes
      nothing in the line data; on a coverage.py without it the override is unused.
    * coverage.py decides once per file name whether to trace it, in Python, at
      about 160 µs a file (measured: 0.15 s of ``import torch``, ~950 files, in every
      recorded process). A file whose real path and whose module's ``__file__`` each
      lie outside every measured root (``source`` is the outer bound) or inside a
      folder an ``omit`` pattern ``*/NAME/*`` excludes (``.venv``, ``site-packages``)
      is never traced: :meth:`_should_trace` answers that from a per-folder cache of
      real paths and leaves every other file to coverage.py.
    """

    def __init__(self, *, source: list[str], omit: list[str], **kwargs: Any) -> None:
        super().__init__(source=source, omit=omit, **kwargs)
        # The measured roots, real and absolute, each ending with the separator.
        self._fastci_roots = tuple(sorted({os.path.join(r, "") for src in source for r in
                                           (os.path.abspath(src), os.path.realpath(src))}))
        # ``*/NAME/*`` patterns: any file with a folder NAME on its path is omitted.
        self._fastci_omit = tuple(sorted(
            os.sep + pat[2:-2] + os.sep for pat in omit
            if pat.startswith("*/") and pat.endswith("/*") and len(pat) > 4
            and not any(c in pat[2:-2] for c in "*?[]/")))

    def _post_save_work(self) -> None:
        pass

    def _init_for_start(self) -> None:
        # coverage.py's Collector keeps the call stack it was made from for its debug
        # output (``short_stack()``, i.e. ``inspect.stack()``, which reads the source of
        # every frame): ~30 ms in each recorded child process, and FastCI never reads it.
        # The name is looked up in coverage.collector's globals while the collector is
        # built, so it is swapped there for that call only.
        saved = getattr(_collector, "short_stack", None)
        if saved is not None:
            setattr(_collector, "short_stack", _no_stack)
        try:
            super()._init_for_start()
        finally:
            if saved is not None:
                setattr(_collector, "short_stack", saved)

    def _should_trace(self, filename: str, frame: FrameType) -> Any:
        where = (self._fastci_roots, self._fastci_omit)
        if where[0] and _excluded(filename, where) and _excluded_file(frame, where):
            try:
                disp = disposition_init(self._inorout.disp_class, filename)  # type: ignore[union-attr]
            except AttributeError:  # another coverage.py: ask it
                return super()._should_trace(filename, frame)
            disp.trace = False
            disp.reason = "outside every measured root (fastci)"
            return disp
        return super()._should_trace(filename, frame)


def _no_stack(*args: Any, **kwargs: Any) -> str:
    return "(call stack not kept by fastci)"


# Real paths of folders, for _outside: one realpath per folder, not per file.
_REAL_DIRS: dict[str, str] = {}


def _excluded(filename: object, where: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether ``filename`` is an absolute file name whose real and absolute paths are
    each under none of the roots (each ends with the path separator) or in an omitted
    folder (``/NAME/``). Unsure: False."""
    roots, omitted = where
    if not isinstance(filename, str) or not os.path.isabs(filename):
        return False
    folder, name = os.path.split(filename)
    real_dir = _REAL_DIRS.get(folder)
    if real_dir is None:
        real_dir = _REAL_DIRS[folder] = os.path.realpath(folder)
    try:
        if os.path.islink(filename):
            return False  # a file linked elsewhere: coverage.py resolves it
    except (OSError, ValueError):
        return False
    for path in (os.path.normpath(filename), os.path.join(real_dir, name)):
        if path.startswith(roots) and not any(part in path for part in omitted):
            return False
    return True


def _excluded_file(frame: FrameType | None,
                   where: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether the frame's module ``__file__`` (which coverage.py prefers) is outside too."""
    if frame is None:
        return True
    dunder = frame.f_globals.get("__file__") if frame.f_globals else None
    if not dunder:
        return True
    dunder = str(dunder)
    if not dunder.endswith(".py"):
        return False  # .pyc and others: coverage.py maps them to a source first
    return _excluded(dunder, where)


def make_coverage(sources: list[str], omit: list[str], *, contexts: bool,
                  branch: bool = False) -> coverage.Coverage:
    """An in-memory Coverage measuring ``sources``; with ``contexts`` it loads the plug-in,
    with ``branch`` it records arcs."""
    cov = _Coverage(data_file=None, config_file=False, source=sources, omit=omit, branch=branch)
    cov.set_option("run:disable_warnings", [
        "no-data-collected", "module-not-measured", "module-not-imported", "couldnt-parse",
        "already-imported", "no-ctracer", "module-not-python"])
    if contexts:
        cov.set_option("run:plugins", [PLUGIN_MODULE])
    return cov


active.on_activate(_bind)
