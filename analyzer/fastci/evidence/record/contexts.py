"""Context signatures: *how* each repo unit was exercised, cheaply and stably.

A signature is a short string built from a call's abstracted arguments, the
caller unit, the process's parallel role and phase::

    args(x=T(bf16,3d,cpu,s);cfg=ModelConfig(tp=2,layers=2))|caller=pkg/m.py::f|grad=1|rank=0/2

Arguments are abstracted, never copied: a tensor becomes its dtype, ndim,
device type and a coarse size class (``e`` empty, ``s`` <= 65536 elements,
``l`` larger) — its values and exact shape are never part of a context.
Scalars and short strings appear by value, dataclass configs by their scalar
fields, an ``nn.Module`` ``self`` by its class and ``training`` flag.

Collection rides on coverage.py's C tracer through a file-tracer plug-in
(:mod:`fastci.evidence.record.covplugin`): only calls of repo code reach Python, not
torch's or the standard library's (a ``sys.setprofile`` hook — Python 3.11
has no ``sys.monitoring`` — cost +70% on a training loop even as a no-op).
A unit's first :data:`FULL_CALLS` calls are inspected, later ones only at
power-of-two call counts, and a unit stops being inspected once it has
:data:`MAX_CONTEXTS` distinct contexts (then one dict lookup per call).

The code under test can add labels (phase, rank role, parallel degrees) with
:func:`annotate`; they are part of every signature taken while in effect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import sys
import weakref
from types import CodeType, FrameType
from typing import Any, Callable, Iterator

from fastci.evidence.record import active
from fastci.evidence.record.files import PathMapper

FULL_CALLS = 8
MAX_CONTEXTS = 16
SMALL_NUMEL = 1 << 16
_MAX_STR = 32
_MAX_FIELDS = 12
_CALLER_DEPTH = 12
_MAX_SELF_CONFIGS = 3

_labels: dict[str, str] = {}
#: Called whenever :func:`annotate` changes the labels: the ``sys.monitoring`` engine
#: starts a new sampling period there (:mod:`fastci.evidence.record.monitor`).
LABEL_WATCHERS: list[Callable[[], None]] = []


@contextlib.contextmanager
def annotate(**labels: object) -> Iterator[None]:
    """Add labels (``phase="train"``, ``role="pp_first"``, ``tp=2``) to contexts in effect.

    Safe to call when nothing records: it only sets a process-wide dict.
    """
    saved = dict(_labels)
    _labels.update({k: str(v) for k, v in labels.items()})
    _labels_changed()
    try:
        yield
    finally:
        _labels.clear()
        _labels.update(saved)
        _labels_changed()


def _labels_changed() -> None:
    for watcher in list(LABEL_WATCHERS):
        watcher()


_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "b"}


def _size_class(numel: int) -> str:
    if numel == 0:
        return "e"
    return "s" if numel <= SMALL_NUMEL else "l"


# Per-process caches of answers that depend on a type or a dtype only (never on a value):
# a class's dataclass field names (None: not a dataclass), a dtype's short name.
_DC_FIELDS: dict[type, tuple[str, ...] | None] = {}
_DTYPE_TOKEN: dict[Any, str] = {}


def _dataclass_fields(cls: type) -> tuple[str, ...] | None:
    """The first :data:`_MAX_FIELDS` field names of dataclass ``cls``; None if it is none."""
    try:
        return _DC_FIELDS[cls]
    except KeyError:
        pass
    names: tuple[str, ...] | None = None
    if dataclasses.is_dataclass(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))[:_MAX_FIELDS]
    try:
        _DC_FIELDS[cls] = names
    except TypeError:  # an unhashable metaclass: answer without caching
        pass
    return names


def _tensor(value: Any) -> str:
    dt = value.dtype
    tok = _DTYPE_TOKEN.get(dt)
    if tok is None:
        name = str(dt).replace("torch.", "")
        tok = _DTYPE_TOKEN[dt] = _DTYPE_SHORT.get(name, name)
    return f"T({tok},{value.dim()}d,{value.device.type},{_size_class(value.numel())})"


def _temp_roots() -> tuple[str, ...]:
    """This process's scratch folders (``/tmp``, ``/var/tmp``, ``$TMPDIR``, ``$TEMP``,
    ``$TMP``, Bazel's ``$TEST_TMPDIR``), as given and resolved, each ending in a
    separator, longest first."""
    found = {"/tmp", "/var/tmp"}
    for var in ("TMPDIR", "TEMP", "TMP", "TEST_TMPDIR"):
        value = os.environ.get(var)
        if value and os.path.isabs(value):
            found.add(value)
    roots = {p.rstrip(os.sep) + os.sep for r in found for p in (r, os.path.realpath(r))}
    return tuple(sorted(roots - {os.sep}, key=lambda r: (-len(r), r)))


_TEMP_ROOTS = _temp_roots()


def _str_token(value: str) -> str:
    """A short string by value, a long one by its size class; a path in a scratch
    folder with its first part there set aside (:func:`_temp_path`)."""
    if value.startswith(_TEMP_ROOTS):
        value = _temp_path(value)
    return repr(value) if len(value) <= _MAX_STR else f"str[{'l' if len(value) > 256 else 's'}]"


def _temp_path(value: str) -> str:
    """``/tmp/ckpt-8rt1qzed/iter_3`` -> ``<tmp>/*/iter_3``.

    ``tempfile.mkdtemp`` and ``mkstemp`` name what they make at random, so a path under
    a scratch folder differs on every run: as a context it would never match the same
    call in another run or another test (a calibration rung, a stand-in). The folder
    and its first part are set aside; the rest of the path stays.
    """
    root = next(r for r in _TEMP_ROOTS if value.startswith(r))
    _first, sep, rest = value[len(root):].partition(os.sep)
    return f"<tmp>/*{sep}{rest}"


def abstract(value: Any, depth: int = 0) -> str:
    """Abstract one argument value into a stable, value-free (for tensors) token."""
    cls = type(value)
    # The exact built-in scalar types first (most arguments): the same tokens as below.
    if cls is int:
        return str(value)
    if cls is str:
        return _str_token(value)
    if cls is float:
        return format(value, ".4g")
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return format(value, ".4g")
    if isinstance(value, str):
        return _str_token(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    mod = cls.__module__
    if mod.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(value, torch.Tensor):
                return _tensor(value)
            if isinstance(value, torch.dtype):
                return str(value).replace("torch.", "")
            if isinstance(value, torch.device):
                return f"dev({value.type})"
    if mod == "numpy" and hasattr(value, "dtype") and hasattr(value, "ndim"):
        return f"A({value.dtype},{value.ndim}d,{_size_class(int(value.size))})"
    names = _dataclass_fields(cls)
    if names is not None:  # a dataclass instance (a dataclass itself has type ``type``)
        if depth > 0:
            return cls.__name__
        return f"{cls.__name__}({','.join(f'{n}={abstract(getattr(value, n, None), 1)}' for n in names)})"
    if isinstance(value, (tuple, list)):
        if len(value) <= 4 and depth == 0 and all(
                isinstance(v, (int, float, str, bool)) or v is None for v in value):
            return f"{cls.__name__}({','.join(abstract(v, 1) for v in value)})"
        return f"{cls.__name__}[{'e' if not value else 's' if len(value) <= 16 else 'l'}]"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"fn:{value.__qualname__}"
    return cls.__name__


def _self_token(value: Any) -> str:
    """``self``: a dataclass by its fields; else its class, ``nn.Module.training`` and the
    dataclass-valued attributes it holds (``self.cfg``, ``self.ctx``: where tp/pp live)."""
    cls = type(value)
    if _dataclass_fields(cls) is not None:
        return abstract(value)
    token = cls.__name__
    training = getattr(value, "training", None)
    if isinstance(training, bool):
        token += f"[train={int(training)}]"
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        held = sorted(k for k, v in attrs.items() if _dataclass_fields(type(v)) is not None)
        for name in held[:_MAX_SELF_CONFIGS]:
            token += f":{name}={abstract(attrs[name])}"
    return token


def call_signature(frame: FrameType, caller: str) -> str:
    """The context signature of the call that created ``frame``."""
    code = frame.f_code
    nargs = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & 0x04:  # CO_VARARGS
        nargs += 1
    if code.co_flags & 0x08:  # CO_VARKEYWORDS
        nargs += 1
    names = code.co_varnames[:nargs]
    local = frame.f_locals
    toks = []
    for i, name in enumerate(names):
        if name not in local:
            continue
        value = local[name]
        try:
            if i == 0 and name in ("self", "cls"):
                toks.append(f"{name}={_self_token(value) if name == 'self' else 'cls'}")
            elif isinstance(value, dict) and name in names[-1:] and code.co_flags & 0x08:
                toks.append(f"{name}={{{','.join(f'{k}={abstract(v, 1)}' for k, v in sorted(value.items())[:_MAX_FIELDS])}}}")
            else:
                toks.append(f"{name}={abstract(value)}")
        except Exception:  # an odd object must never break the test
            toks.append(f"{name}=?")
    parts = [f"args({';'.join(toks)})", f"caller={caller}"]
    parts.extend(_process_labels())
    return "|".join(parts)


# The rank label of the default process group last seen: (the group object, its label).
_RANK: list[Any] = [None, ""]


def _rank_label(dist: Any) -> str:
    """``rank=0/W`` or ``rank=n/W`` of the default process group, "" without one.

    ``get_rank``/``get_world_size`` walk torch's group bookkeeping in Python; a group's
    rank and size never change, so the label is kept while the default group is the
    same object (a destroyed and re-created group is a new object: asked again).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return ""
    c10d = getattr(dist, "distributed_c10d", None)
    world = getattr(getattr(c10d, "GroupMember", None), "WORLD", None)
    if world is None or world is not _RANK[0]:
        label = f"rank={'0' if dist.get_rank() == 0 else 'n'}/{dist.get_world_size()}"
        if world is None:
            return label
        _RANK[:] = [world, label]
    return str(_RANK[1])


def _process_labels() -> list[str]:
    out = []
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out.append(f"grad={int(torch.is_grad_enabled())}")
            dist = getattr(torch, "distributed", None)
            if dist is not None:
                rank = _rank_label(dist)
                if rank:
                    out.append(rank)
        except Exception:
            pass
    for k in sorted(_labels):
        out.append(f"{k}={_labels[k]}")
    return out


_MISSING = object()
_UIDS: "weakref.WeakKeyDictionary[PathMapper, dict[CodeType, object]]" = weakref.WeakKeyDictionary()


class _CodeState:
    __slots__ = ("rel", "qualname", "calls", "sigs")

    def __init__(self, rel: str, qualname: str) -> None:
        self.rel = rel
        self.qualname = qualname
        self.calls = 0
        self.sigs: set[str] = set()


class ContextProfiler:
    """Collect capped context signatures per repo unit from calls the plug-in reports."""

    def __init__(self, mapper: PathMapper, *, full_calls: int = FULL_CALLS,
                 max_contexts: int = MAX_CONTEXTS) -> None:
        self.mapper = mapper
        self.full_calls = full_calls
        self.max_contexts = max_contexts
        self._states: dict[CodeType, _CodeState | None] = {}
        self._done: list[_CodeState] = []
        # Code object -> unit id (None: not repo code), shared by the profilers of one
        # mapper: pytest runs one recorder per test, and the answer never changes.
        self._uids: dict[CodeType, object] = _UIDS.setdefault(mapper, {})
        self._saved: list[tuple[dict[CodeType, _CodeState | None], list[_CodeState]]] = []

    def _info(self, code: CodeType) -> _CodeState | None:
        rel = self.mapper.rel(code.co_filename)
        st = None if rel is None else _CodeState(rel, code.co_qualname)
        self._states[code] = st
        return st

    def dynamic_source_filename(self, filename: str | None, frame: FrameType) -> str | None:
        """One call of repo code, as coverage.py's C tracer reports it to the plug-in.

        :func:`fastci.evidence.record.active.activate` makes this bound method the
        tracers' ``dynamic_source_filename``, so a call costs one Python frame: the
        common case (a call that is not sampled) is a dict lookup and a counter.
        Answers ``filename`` as the plug-in does (see :mod:`fastci.evidence.record.covplugin`).
        """
        code = frame.f_code
        try:
            st = self._states[code]
        except KeyError:
            st = self._info(code)
        if st is not None:
            n = st.calls = st.calls + 1
            if n <= self.full_calls or not n & (n - 1):
                self._sample(code, st, frame)
        return filename

    def on_start(self, frame: FrameType, *, every_call: bool) -> bool:
        """One start of repo code, as the ``sys.monitoring`` engine reports it
        (:mod:`fastci.evidence.record.monitor`): count and sample it.

        With ``every_call`` the engine reports every call and the C tracer's rule
        applies (:meth:`dynamic_source_filename`); without, the engine reports only
        the calls it is asked for, and each is sampled.

        Returns:
            Whether later calls of the code are still wanted (False: the engine
            switches them off until its next sampling period).
        """
        code = frame.f_code
        try:
            st = self._states[code]
        except KeyError:
            st = self._info(code)
        if st is None:
            return False
        n = st.calls = st.calls + 1
        if not every_call or n <= self.full_calls or not n & (n - 1):
            self._sample(code, st, frame)
        if every_call:
            return self._states.get(code) is not None
        return n < self.full_calls and self._states.get(code) is not None

    def _caller(self, frame: FrameType) -> str:
        """The nearest enclosing repo unit on the stack (skips torch/stdlib frames)."""
        f = frame.f_back
        uids = self._uids
        for _ in range(_CALLER_DEPTH):
            if f is None:
                break
            code = f.f_code
            uid = uids.get(code, _MISSING)
            if uid is _MISSING:
                rel = self.mapper.rel(code.co_filename)
                uid = None if rel is None else f"{rel}::{code.co_qualname}"
                uids[code] = uid
            if uid is not None:
                return str(uid)
            f = f.f_back
        return "-"

    def on_call(self, frame: FrameType) -> None:
        """Inspect one call of repo code (the line-mode profile hook, the collection recorder)."""
        self.dynamic_source_filename(None, frame)

    def _sample(self, code: CodeType, st: _CodeState, frame: FrameType) -> None:
        """Add the signature of this call of ``code``; retire the unit once it has enough."""
        try:
            st.sigs.add(call_signature(frame, self._caller(frame)))
        except Exception:  # an odd object must never break the test
            st.sigs.add("?")
        if len(st.sigs) >= self.max_contexts:
            self._done.append(st)
            self._states[code] = None

    def start(self) -> None:
        """Become the active profiler of the coverage plug-in."""
        active.activate(self)

    def begin_segment(self) -> None:
        """Collect into fresh state until :meth:`end_segment` (segments nest)."""
        self._saved.append((self._states, self._done))
        self._states, self._done = {}, []

    def end_segment(self) -> dict[tuple[str, str], tuple[set[str], int]]:
        """Return what the innermost segment collected; go on with the state before it."""
        out = self._collect()
        self._states, self._done = self._saved.pop()
        return out

    def stop(self) -> dict[tuple[str, str], tuple[set[str], int]]:
        """Deactivate; return (path, qualname) -> (signatures, calls seen)."""
        if active.ACTIVE is self:
            active.activate(None)
        return self._collect()

    def _collect(self) -> dict[tuple[str, str], tuple[set[str], int]]:
        out: dict[tuple[str, str], tuple[set[str], int]] = {}
        # A snapshot first: a profile hook may add this very generator's code meanwhile.
        states = list(self._states.values())
        for st in [*(s for s in states if s is not None), *self._done]:
            key = (st.rel, st.qualname)
            sigs, calls = out.get(key, (set(), 0))
            out[key] = (sigs | st.sigs, calls + st.calls)
        return out
