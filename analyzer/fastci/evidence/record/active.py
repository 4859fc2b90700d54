"""Which profiler receives the calls of repo code now: one per process at a time.

A test's :class:`~fastci.evidence.record.contexts.ContextProfiler` or the pytest
collection recorder becomes the *active* one while it records. The engine that
reports calls reads it: coverage.py's file-tracer plug-in
(:mod:`fastci.evidence.record.covplugin`) binds its tracers to it, and the
``sys.monitoring`` engine is handed its profiler directly. This registry imports
neither engine, so a process recording with ``sys.monitoring`` never imports
coverage.py (about 60 ms a recorded session on Python 3.12 here).
"""

from __future__ import annotations

from typing import Any, Callable

#: The active profiler (None: nobody records calls now).
ACTIVE: Any = None
_BINDERS: list[Callable[[Any], None]] = []


def activate(target: Any) -> None:
    """Make ``target`` the active profiler (None: nobody) and tell every binder."""
    global ACTIVE
    ACTIVE = target
    for bind in _BINDERS:
        bind(target)


def on_activate(bind: Callable[[Any], None]) -> None:
    """Call ``bind(target)`` now with the active profiler and at each :func:`activate`."""
    _BINDERS.append(bind)
    bind(ACTIVE)
