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
from types import FrameType
from typing import Any

import coverage

#: The context profiler of the running recorder (one per process at a time).
ACTIVE: Any = None
PLUGIN_MODULE = __name__


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

    def dynamic_source_filename(self, filename: str | None, frame: FrameType) -> str | None:
        # coverage.py passes None as ``filename``, and answering None leaves the frame
        # without line tracing: only the call event reaches the plug-in. Answering the
        # file's name would trace its lines too, but coverage.py 7.17's C tracer then
        # crashes (SIGSEGV) in multi-threaded tests (thread ranks: reproduced with the
        # example's checkpoint_crash_test even with on_call disabled). So traces made
        # with contexts carry the units each call event saw, not lines.
        prof = ACTIVE
        if prof is not None:
            prof.on_call(frame)
        return filename


class _Plugin(coverage.CoveragePlugin):
    def file_tracer(self, filename: str) -> _Tracer | None:
        prof = ACTIVE
        if prof is None or not filename.endswith(".py") or prof.mapper.rel(filename) is None:
            return None
        return _Tracer(filename)

    def file_reporter(self, filename: str) -> str:
        return "python"


def coverage_init(reg: Any, options: Any) -> None:
    """coverage.py's plug-in entry point."""
    reg.add_file_tracer(_Plugin())


class _Coverage(coverage.Coverage):
    """A Coverage that skips the work it does after each data flush.

    ``get_data()`` after ``stop()`` walks every ``source`` folder for files that
    never ran, to report them at 0%, and checks for warnings; the recorder reads
    executed lines only and silences those warnings, and the walk cost about 3 ms
    per recorded test (a full tree walk each time). Overriding this hook changes
    nothing in the line data; on a coverage.py without it the override is unused.
    """

    def _post_save_work(self) -> None:
        pass


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
