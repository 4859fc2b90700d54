"""Keep pytest's assertion rewriting out of a recording's tracer.

pytest rewrites the ``assert`` statements of every test module, conftest file and
plug-in module it imports: it reads the source, parses it, rewrites the tree in
Python and compiles it. The result is cached as a ``.pyc`` beside the source, but a
fresh CI checkout has no cache, and ``PYTHONDONTWRITEBYTECODE=1`` (common in CI
images) means there never is one, so every recorded session rewrites everything
again. Under Python 3.11's ``sys.settrace`` the whole interpreter runs in tracing
mode, and that pure-Python rewriting got about twice as slow in a recorded pytest
process, although it runs no code of the repository.

:func:`install` wraps pytest's rewrite function so that it runs with this thread's
trace and profile functions off and puts them back afterwards, whatever happens.
The module body that the rewritten code object then runs is executed by the
import system after the wrapper has returned, traced as before. Only code that
cannot be repository code runs untraced:

* the rewrite reads one file and transforms its syntax tree; it calls no hook and
  imports nothing of the repository;
* the cyclic garbage collector is paused for the call, so no finalizer of a
  repository object (``__del__``, a weakref callback) runs in the gap;
* the gap is not opened while a Python signal handler defined in a measured file
  is installed (it could interrupt the rewrite);
* other threads keep their tracers: ``sys.settrace`` is per thread.

The evidence is the same with and without it (``tests/test_pytest_untraced.py``
records one project both ways and compares the evidence).
"""

from __future__ import annotations

import functools
import gc
import signal
import sys
from typing import Any, Callable

__all__ = ["install", "paused_tracing", "handler_in"]

#: Marks the wrapper, so that :func:`install` never wraps twice.
_MARK = "__fastci_untraced__"


def handler_in(measured: Callable[[str], object]) -> bool:
    """Whether a Python-level signal handler may run measured code: one defined in a
    file ``measured`` maps to a repo path (:meth:`fastci.evidence.record.files.PathMapper.rel`),
    or one that is not a plain function or method (a ``functools.partial``, a callable
    object), since what that calls cannot be told."""
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if handler is None or isinstance(handler, int) or handler is signal.default_int_handler:
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        filename = getattr(code, "co_filename", None)
        if not isinstance(filename, str) or measured(filename) is not None:
            return True
    return False


def paused_tracing(fn: Callable[..., Any], measured: Callable[[str], object]) -> Callable[..., Any]:
    """``fn`` run with this thread's trace and profile functions off (see the module
    docstring); as it is when nothing traces, or while a handler of :func:`handler_in`
    is installed."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        trace, profile = sys.gettrace(), sys.getprofile()
        if (trace is None and profile is None) or handler_in(measured):
            return fn(*args, **kwargs)
        collecting = gc.isenabled()
        gc.disable()
        sys.settrace(None)
        sys.setprofile(None)
        try:
            return fn(*args, **kwargs)
        finally:
            sys.setprofile(profile)
            sys.settrace(trace)
            if collecting:
                gc.enable()

    setattr(wrapper, _MARK, True)
    return wrapper


def install(measured: Callable[[str], object]) -> Callable[[], None] | None:
    """Run pytest's assertion rewriting untraced for the rest of the process (or until
    the returned function undoes it); ``measured`` maps a file name to its repo path,
    None when it is not measured. None when this pytest has no rewrite function to
    wrap (nothing changes then)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return None
    orig = getattr(rewrite, "_rewrite_test", None)
    if not callable(orig) or getattr(orig, _MARK, False):
        return None
    wrapped = paused_tracing(orig, measured)
    setattr(rewrite, "_rewrite_test", wrapped)

    def undo() -> None:
        if getattr(rewrite, "_rewrite_test", None) is wrapped:
            setattr(rewrite, "_rewrite_test", orig)

    return undo
