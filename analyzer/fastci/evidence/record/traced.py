"""Frames dynamo traces while a test records: executed units the tracer never sees.

``torch.compile``, ``torch._dynamo.explain``, ``torch._dynamo.optimize`` and
``nn.Module.compile`` run a function by tracing its bytecode symbolically and
running the graph they built: the functions dynamo inlines into the graph (a
model's submodules' ``forward``, the helpers they call) never produce a Python
call or line event, so coverage.py cannot see that the test ran them. Breaking one
of them still breaks the test (a bounds check that reads a tensor value adds a
graph break; a test asserting one graph fails).

The watch reads what dynamo itself lists: every ``torch._guards.TracingContext``
(one per frame dynamo converts) keeps ``traced_code``, the code objects of the
frame and of every function inlined into it. While a recording runs,
``TracingContext.__init__`` is wrapped (restored when no recording runs) so that
the contexts made during the test are kept; at the stop their code objects are
mapped to units the way the recorder maps executed lines
(:func:`units_of_codes`). Dynamo compiles a frame once per process and reuses the
result: a later test that runs the compiled frame again (its converted code keeps
the frame's file and qualname, so the recorder sees its call) gets the units of
every earlier compilation of that frame, remembered per process.

Cost: nothing in a process that never imports torch (one dictionary lookup at
start and stop; an import watcher waits for ``torch._guards`` only where torch is
not imported yet), and one list append per frame dynamo converts.

Fail safe: when dynamo compiled frames during the recording but the wrapper could
not be put in place (a torch without ``TracingContext`` or ``traced_code``),
nothing says what dynamo traced; then every unit of every repository module the
process has loaded counts as traced (dynamo can only trace code that is loaded),
so the evidence over-states, never under-states, what the test ran. Documented in
docs/EVIDENCE.md ("Traced frames").
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import CodeType, ModuleType
from typing import Any, Callable, Iterable, Mapping, Sequence

from fastci.evidence.record.files import PathMapper
from fastci.units.lines import MODULE_QUALNAME, LineIndex

LOG = logging.getLogger(__name__)

#: The context signature of a unit the test ran only as dynamo traced it.
TRACED_CONTEXT = "traced(dynamo)"
#: The key of a run's environment JSON saying that its recorder recorded traced frames
#: (every trace of the run of format 3 or later), and its value.
TRACED_FRAMES_KEY = "traced_frames"
TRACED_BY_DYNAMO = "dynamo"
#: The module whose ``TracingContext`` lists the code dynamo traced.
GUARDS_MODULE = "torch._guards"

# Every compilation this process made: root frame's code -> code traced with it.
_ROOTS: dict[CodeType, set[CodeType]] = {}
# The watches of the recordings running now (nested recorders each get theirs).
_ACTIVE: list["DynamoWatch"] = []
# TracingContext.__init__ as torch defined it, while the wrapper is in place.
_ORIGINAL_INIT: Any = None
_FINDER: "_GuardsFinder | None" = None

Ctx = dict[tuple[str, str], tuple[set[str], int]]


def _frames_compiled() -> int | None:
    """Frames dynamo converted in this process so far (0 before dynamo is loaded); None:
    dynamo is loaded but its counter cannot be read."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None if "torch._dynamo.convert_frame" in sys.modules else 0
    try:
        return int(getattr(utils, "counters")["frames"]["total"])
    except Exception:  # noqa: BLE001 - another torch: cannot tell
        return None


class DynamoWatch:
    """Collect the frames dynamo traces during one recording (see the module docstring).

    Args:
        segment: the key of the evidence segment open now (None: the test's own), asked
            when dynamo starts tracing a frame.
    """

    def __init__(self, segment: Callable[[], str | None]) -> None:
        self._segment = segment
        self._made: list[tuple[str | None, Any]] = []
        self._frames_at_start: int | None = 0
        self.problem: str | None = None

    def start(self) -> None:
        """Begin watching (wrap ``TracingContext`` now, or when torch imports it)."""
        self._frames_at_start = _frames_compiled()
        _ACTIVE.append(self)
        guards = sys.modules.get(GUARDS_MODULE)
        if guards is not None:
            self.problem = _wrap(guards)
        elif _FINDER is None:
            _arm_finder()

    def made(self, tracing_context: Any) -> None:
        """Called by the wrapped ``TracingContext.__init__``."""
        self._made.append((self._segment(), tracing_context))

    def stop(self, mapper: PathMapper, lines: Mapping[str, Sequence[int]],
             ctx: Mapping[tuple[str, str], object]) -> dict[str | None, set[CodeType]]:
        """Stop watching; the code objects traced, by segment key (None: the test's own).

        ``lines`` and ``ctx`` are what the recorder saw run (executed lines, call
        events by (path, qualname)): a frame compiled earlier in this process whose
        converted code ran now brings the code traced with it.
        """
        wrapped = _wrapped()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        if not _ACTIVE:
            _unwrap()
        out: dict[str | None, set[CodeType]] = {}
        for key, tc in self._made:
            codes = getattr(tc, "traced_code", None)
            if not isinstance(codes, list):
                self.problem = self.problem or \
                    "torch._guards.TracingContext has no traced_code list"
                continue
            if codes:
                _ROOTS.setdefault(codes[0], set()).update(codes)
                out.setdefault(key, set()).update(codes)
        self._made = []
        own = out.setdefault(None, set())
        for root, codes in _ROOTS.items():
            if root not in own and _ran(root, mapper, lines, ctx):
                own.update(codes)
        if self.problem is None and GUARDS_MODULE in sys.modules and not wrapped:
            self.problem = "the TracingContext wrapper was not in place"
        if self.problem is not None:
            now = _frames_compiled()
            if now is not None and now == self._frames_at_start:
                self.problem = None  # dynamo compiled nothing meanwhile: nothing was missed
            else:
                LOG.warning("dynamo compiled frames while a test recorded, but what it traced "
                            "cannot be read (%s): every loaded repository module counts as "
                            "traced", self.problem)
        return out


def _ran(root: CodeType, mapper: PathMapper, lines: Mapping[str, Sequence[int]],
         ctx: Mapping[tuple[str, str], object]) -> bool:
    rel = mapper.rel(root.co_filename)
    if rel is None:
        # A frame outside the repository (torch's own) runs again from dynamo's cache with
        # no call the recorder sees: what it traced of the repository's code counts.
        return True
    if (rel, root.co_qualname) in ctx:
        return True
    ran = lines.get(rel)
    return bool(ran) and not _code_lines(root).isdisjoint(ran or ())


def _code_lines(code: CodeType) -> set[int]:
    return {line for _, _, line in code.co_lines() if line is not None}


def units_of_codes(codes: Iterable[CodeType], mapper: PathMapper,
                   index_of: Callable[[str], LineIndex | None]) -> set[tuple[str, str]]:
    """(repo path, unit qualname) of each code object of a repo file.

    A code object whose qualname is a unit of the file's index is that unit; any
    other (a lambda, a comprehension, dynamo's resume functions) maps through its
    lines, as the recorder maps executed lines (:class:`~fastci.units.lines.LineIndex`),
    its first line left out (a ``def`` line belongs to the enclosing unit). A file
    that cannot be indexed counts as its module.
    """
    out: set[tuple[str, str]] = set()
    for code in codes:
        rel = mapper.rel(code.co_filename)
        if rel is None:
            continue
        index = index_of(rel)
        if index is None:
            out.add((rel, MODULE_QUALNAME))
        elif code.co_qualname in index.qualnames:
            out.add((rel, code.co_qualname))
        else:
            body = _code_lines(code) - {code.co_firstlineno} or {code.co_firstlineno}
            out.update((rel, index.qualname_for_line(n)) for n in body)
    return out


def loaded_units(mapper: PathMapper,
                 index_of: Callable[[str], LineIndex | None]) -> set[tuple[str, str]]:
    """Every unit of every repository module this process has loaded (the fail-safe)."""
    out: set[tuple[str, str]] = set()
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        rel = mapper.rel(filename) if isinstance(filename, str) else None
        if rel is None:
            continue
        index = index_of(rel)
        out.update((rel, q) for q in (index.qualnames if index else (MODULE_QUALNAME,)))
    return out


def add_traced(watch: DynamoWatch, mapper: PathMapper, lines: Mapping[str, Sequence[int]],
               ctx: Ctx, segments: Mapping[str, Ctx],
               index_of: Callable[[str], LineIndex | None]) -> None:
    """Stop ``watch`` and add the units it saw traced to ``ctx`` (the test's) and
    ``segments`` (by key), with :data:`TRACED_CONTEXT`."""
    traced = watch.stop(mapper, lines, ctx)
    for key, codes in traced.items():
        target = ctx if key is None or key not in segments else segments[key]
        _mark(target, units_of_codes(codes, mapper, index_of))
    if watch.problem is not None:
        _mark(ctx, loaded_units(mapper, index_of))


def _mark(target: Ctx, units: Iterable[tuple[str, str]]) -> None:
    for key in units:
        sigs, calls = target.get(key, (set(), 0))
        target[key] = (sigs | {TRACED_CONTEXT}, calls)


# ------------------------------------------------------------------ the wrapper

def _wrapped() -> bool:
    return _ORIGINAL_INIT is not None


def _wrap(guards: ModuleType) -> str | None:
    """Wrap ``TracingContext.__init__`` (once); the problem when it cannot be."""
    global _ORIGINAL_INIT
    if _ORIGINAL_INIT is not None:
        return None
    cls = getattr(guards, "TracingContext", None)
    if not isinstance(cls, type):
        return f"{GUARDS_MODULE} has no TracingContext"
    original = cls.__dict__.get("__init__")
    if not callable(original):
        return "torch._guards.TracingContext defines no __init__"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for watch in list(_ACTIVE):
            watch.made(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, "__init__", __init__)
    _ORIGINAL_INIT = original
    return None


def _unwrap() -> None:
    global _ORIGINAL_INIT, _FINDER
    if _FINDER is not None:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        _FINDER = None
    if _ORIGINAL_INIT is None:
        return
    cls = getattr(sys.modules.get(GUARDS_MODULE), "TracingContext", None)
    current = getattr(cls, "__init__", None) if cls is not None else None
    if current is not None and getattr(current, "__wrapped__", None) is _ORIGINAL_INIT:
        setattr(cls, "__init__", _ORIGINAL_INIT)
    # Else someone wrapped it after us: ours stays, idle with no watch active.
    _ORIGINAL_INIT = None


def _arm_finder() -> None:
    global _FINDER
    _FINDER = _GuardsFinder()
    sys.meta_path.insert(0, _FINDER)


class _GuardsFinder(importlib.abc.MetaPathFinder):
    """Wrap ``TracingContext`` as soon as torch imports ``torch._guards`` (a test that
    imports torch itself, a child process that records from its start)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != GUARDS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WrappingLoader(spec.loader)
        return spec


class _WrappingLoader(importlib.abc.Loader):
    """Delegates to torch's loader, then wraps the module's ``TracingContext``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._inner.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        if _ACTIVE:
            problem = _wrap(module)
            for watch in _ACTIVE:
                watch.problem = watch.problem or problem

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... for inspect
        return getattr(self._inner, name)


__all__ = ["TRACED_CONTEXT", "TRACED_FRAMES_KEY", "TRACED_BY_DYNAMO", "DynamoWatch", "add_traced", "units_of_codes", "loaded_units"]
