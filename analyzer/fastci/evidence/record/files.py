"""Map executed and opened files to repo-relative paths; record files a test reads.

Under Bazel a test executes its sources from the runfiles tree
(``$RUNFILES_DIR/<workspace>/pkg/mod.py`` or ``$TEST_SRCDIR/<workspace>/...``),
usually symlinks to the source tree. :class:`PathMapper` resolves symlinks and
strips those prefixes so every path the evidence names is repo-relative; files
of a virtual environment or ``site-packages`` are never kept.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from fastci.types import RelPath, is_tool_artifact

_EXCLUDED_PARTS = frozenset({".venv", "site-packages", "dist-packages", "__pycache__", ".git",
                             ".fastci"})
_SOURCE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyi")
#: The file that marks a folder as a cache (the Cache Directory Tagging spec: pytest's
#: ``cache_dir`` wherever it is configured, ruff's, cargo's), and how it must start.
CACHE_TAG = "CACHEDIR.TAG"
_CACHE_TAG_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"


def is_tagged_cache(folder: str) -> bool:
    """Whether ``folder`` holds a valid ``CACHEDIR.TAG``: a tool's cache, never an input."""
    try:
        with open(os.path.join(folder, CACHE_TAG), "rb") as f:
            return f.read(len(_CACHE_TAG_SIGNATURE)) == _CACHE_TAG_SIGNATURE
    except OSError:
        return False


def runfiles_roots(environ: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    """The runfiles directories of the current workspace, from Bazel's test environment.

    Only ``<runfiles>/<workspace>``: other repositories' runfiles (``<runfiles>/fastci``
    seen from another workspace, pip repositories) are not the repo under test.
    """
    env = os.environ if environ is None else environ
    workspace = env.get("TEST_WORKSPACE", "fastci")
    roots: list[str] = []
    for var in ("RUNFILES_DIR", "TEST_SRCDIR"):
        base = env.get(var)
        if base:
            cand = os.path.abspath(os.path.join(base, workspace))
            if os.path.isdir(cand) and cand not in roots:
                roots.append(cand)
    return roots


def symlink_source_roots(root: str, limit: int = 400) -> list[str]:
    """Source trees that the symlinks of a runfiles tree point into.

    coverage.py and frames see resolved (real) file names, so the recorder must
    measure the real source tree behind ``$RUNFILES_DIR/<workspace>``: for a
    symlink ``root/a/b.py -> /src/a/b.py`` that is ``/src``.
    """
    found: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "external" and not d.startswith(".")]
        for name in filenames:
            seen += 1
            if seen > limit:
                return found
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                continue
            rel = os.path.relpath(full, root)
            real = os.path.realpath(full)
            if real.endswith(os.sep + rel):
                base = real[: -len(rel) - 1]
                if base not in found and not any(p in _EXCLUDED_PARTS for p in base.split(os.sep)):
                    found.append(base)
                    if len(found) >= 2:
                        return found
    return found


class PathMapper:
    """Turn absolute file names into repo-relative paths (``None`` = not ours)."""

    def __init__(self, repo_root: Path, extra_roots: list[str] | None = None,
                 omit_dirs: tuple[str, ...] = ()) -> None:
        real = os.path.realpath(repo_root)
        self.omit_dirs = tuple(os.path.realpath(d).rstrip(os.sep) + os.sep for d in omit_dirs)
        roots = [real, os.path.abspath(repo_root)]
        if extra_roots is None:
            extra_roots = runfiles_roots()
            if os.path.realpath(repo_root) != real or not os.path.isdir(os.path.join(real, ".git")):
                extra_roots = extra_roots + [real]
            for r in list(extra_roots):
                extra_roots += symlink_source_roots(r)
        roots += extra_roots
        # Longest first: a runfiles tree may live under the repo (bazel-out symlink).
        self.roots = sorted({r.rstrip(os.sep) for r in roots}, key=len, reverse=True)
        self.repo_root = real
        self._cache: dict[str, RelPath | None] = {}
        self._local: dict[RelPath, Path] = {}
        self._tagged: dict[str, bool] = {}

    def rel(self, filename: str) -> RelPath | None:
        """Map ``filename`` (absolute, or relative to the cwd) to a repo path."""
        hit = self._cache.get(filename, "")
        if hit != "":
            return hit
        result = self._map(filename)
        self._cache[filename] = result
        return result

    def _map(self, filename: str) -> RelPath | None:
        if not filename or filename.startswith("<"):
            return None
        absn = os.path.abspath(filename)
        real = os.path.realpath(absn)
        if self.omit_dirs and real.startswith(self.omit_dirs):
            return None
        for cand in (real, absn):
            rel = self._strip(cand)
            if rel is not None:
                return rel
        return None

    def _strip(self, path: str) -> RelPath | None:
        for root in self.roots:
            if path.startswith(root + os.sep):
                rel = path[len(root) + 1:]
                parts = rel.split(os.sep)
                if any(p in _EXCLUDED_PARTS or p.startswith("bazel-") for p in parts) \
                        or is_tool_artifact("/".join(parts)):
                    return None  # not the repo's code or data (install/runner artifacts)
                if parts[0] == "external":  # another Bazel repository
                    return None
                if self._under_cache(root, parts):
                    return None  # a tool's cache folder, whatever its name
                return "/".join(parts)
        return None

    def _under_cache(self, root: str, parts: list[str]) -> bool:
        """Whether a folder between ``root`` and the file is a tagged cache (each folder
        looked at once: :func:`is_tagged_cache`)."""
        folder = root
        for part in parts[:-1]:
            folder = os.path.join(folder, part)
            hit = self._tagged.get(folder)
            if hit is None:
                hit = self._tagged[folder] = is_tagged_cache(folder)
            if hit:
                return True
        return False

    def local_path(self, rel: RelPath) -> Path | None:
        """Where to read ``rel`` from now: the repo, else a runfiles tree."""
        hit = self._local.get(rel)
        if hit is not None and hit.is_file():
            return hit
        for root in [self.repo_root, *self.roots]:
            cand = Path(root, rel)
            if cand.is_file():
                self._local[rel] = cand
                return cand
        return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, ``""`` if it cannot be read."""
    try:
        with open(path, "rb") as f:  # in chunks: a declared model file may not fit in memory
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return ""


def _is_read(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return "r" in mode or "+" in mode
    if isinstance(flags, int):
        return (flags & os.O_ACCMODE) in (os.O_RDONLY, os.O_RDWR)
    return True


def _is_write(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    if isinstance(flags, int):
        return (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR) or bool(flags & os.O_CREAT)
    return False


#: Which audit hook carries the events: ``auto`` (the C hook of
#: :mod:`fastci.evidence.record.native_audit` where it is built, else a Python one) or
#: ``python`` (always the Python hook). Read once, when the hook is installed.
AUDIT_ENV = "FASTCI_AUDIT_HOOK"


def native_hook() -> Any:
    """The C audit hook module, or None (not built here, or ``FASTCI_AUDIT_HOOK=python``)."""
    if os.environ.get(AUDIT_ENV, "auto") == "python":
        return None
    try:
        from fastci.evidence.record import native_audit  # type: ignore[attr-defined]
    except ImportError:
        return None
    return native_audit


class _Auditor:
    """The process-wide audit hook (hooks cannot be removed, so it is installed once).

    Only the events some sink wants reach the sinks (:meth:`wanted`): ``open`` while an
    open or write sink is set, ``exec`` while an exec sink is, and the other sink's
    events. With the C hook (:mod:`fastci.evidence.record.native_audit`) every other event
    stays in C; the Python hook (the fallback) is called for every event and drops the
    others with one set lookup. Whoever sets a sink calls :meth:`changed`.
    """

    def __init__(self) -> None:
        self.sink: Callable[[str], None] | None = None
        # Files opened for writing: what a test writes and reads back is output, not input.
        self.write_sink: Callable[[str], None] | None = None
        # Called with the code object of every ``exec`` (module bodies included:
        # importlib runs them with ``exec``); the pytest collection recorder uses it.
        self.exec_sink: Callable[[Any], None] | None = None
        # Called with (event, args) of the events in ``other_events`` (programs started,
        # modules imported); the recorder uses it (children that leave no trace, torch).
        self.other_sink: Callable[[str, tuple[Any, ...]], None] | None = None
        self.other_events: set[str] = set()
        self.installed = False
        # What :meth:`wanted` said last; changed in place (never rebound): the Python hook
        # holds it, no attribute lookup.
        self._wanted: set[str] = set()
        self._native: Any = None
        self.lock = threading.Lock()

    @property
    def kind(self) -> str:
        """Which hook carries the events: ``c`` or ``python`` ("" before one is installed)."""
        if not self.installed:
            return ""
        return "python" if self._native is None else "c"

    def install(self) -> None:
        """Install the hook once per process (audit hooks cannot be removed)."""
        with self.lock:
            if self.installed:
                return
            native = native_hook()
            if native is not None:
                try:
                    native.install(self._dispatch, sorted(self._wanted))
                except (RuntimeError, ValueError, TypeError):  # refused: the Python hook
                    native = None
            if native is None:
                sys.addaudithook(self._make_hook())
            self._native = native
            self.installed = True

    def wanted(self) -> set[str]:
        """The audit events some sink wants now."""
        names = set(self.other_events) if self.other_sink is not None else set()
        if self.sink is not None or self.write_sink is not None:
            names.add("open")
        if self.exec_sink is not None:
            names.add("exec")
        return names

    def changed(self) -> None:
        """A sink or the other events changed: the hook (installed at the first event
        wanted) passes on what is wanted now. The new names are added before the old
        ones go, so an event wanted before and after is never dropped in between."""
        now = self.wanted()
        self._wanted.update(now)
        self._wanted.intersection_update(now)
        if now and not self.installed:
            self.install()
        if self._native is not None:
            self._native.set_events(sorted(now))

    def _dispatch(self, event: str, args: tuple[Any, ...]) -> None:
        """Hand one wanted event to its sink (both hooks call this, for wanted events only)."""
        if event == "open":
            self.on_open(args)
        elif event == "exec":
            self.on_exec(args)
        else:
            self.on_other(event, args)

    def _make_hook(self) -> Callable[[str, tuple[Any, ...]], None]:
        """The function given to ``sys.addaudithook`` (where the C hook is not built).

        It sees every audit event of the process, and most are not ours: Python 3.11
        audits each ``frame.f_code`` read (``object.__getattr__``), which the context
        profiler does on every call of repo code. So the common path is one plain
        function frame and one set lookup. ``__cantrace__`` is set (False: tracers stay
        off inside the hook, the default) because the interpreter looks it up on the
        hook at every event, and a missing attribute costs an AttributeError each time
        (measured: a sixth of the hook's cost).
        """
        wanted, dispatch = self._wanted, self._dispatch

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if event in wanted:
                dispatch(event, args)

        hook.__cantrace__ = False  # type: ignore[attr-defined]
        return hook

    def on_exec(self, args: tuple[Any, ...]) -> None:
        """An ``exec`` audit event: hand its code object to the exec sink, if any."""
        sink = self.exec_sink
        if sink is not None and args:
            sink(args[0])

    def on_other(self, event: str, args: tuple[Any, ...]) -> None:
        """One of ``other_events``: hand it to the other sink, if any."""
        sink = self.other_sink
        if sink is not None:
            sink(event, args)

    def on_open(self, args: tuple[Any, ...]) -> None:
        """An ``open`` audit event: a file name opened for reading goes to the sink."""
        sink = self.sink
        if sink is None or not args:
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        try:
            mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else None)
            name = os.fsdecode(os.fspath(path))
            if _is_write(mode, flags):
                on_write = self.write_sink
                if on_write is not None:
                    on_write(name)
            if not _is_read(mode, flags):
                return
        except Exception:  # never break the test over bookkeeping
            return
        if name.endswith(_SOURCE_SUFFIXES):
            return
        sink(name)


_AUDITOR = _Auditor()


def set_open_sink(sink: Callable[[str], None] | None) -> None:
    """Receive every file name opened for reading (not Python sources); ``None`` stops it."""
    _AUDITOR.sink = sink
    _AUDITOR.changed()


def set_exec_sink(sink: Callable[[Any], None] | None) -> None:
    """Receive the code object of every ``exec`` in this process (``None`` stops it)."""
    _AUDITOR.exec_sink = sink
    _AUDITOR.changed()


def set_event_sink(sink: Callable[[str, tuple[Any, ...]], None] | None,
                   events: frozenset[str] = frozenset()) -> None:
    """Receive the audit events named in ``events`` as ``sink(event, args)``; ``None``
    stops it. The hook calls the sink from whatever thread raised the event."""
    _AUDITOR.other_events = set(events) if sink is not None else set()
    _AUDITOR.other_sink = sink
    _AUDITOR.changed()


class OpenRecorder:
    """Collect files opened for reading under the repo while active."""

    def __init__(self, mapper: PathMapper) -> None:
        self.mapper = mapper
        self.raw: set[str] = set()
        # Reads while a segment (shared evidence, see the recorder) is open go to it.
        self.segment: str | None = None
        self.by_segment: dict[str, set[str]] = {}
        self.written: set[str] = set()

    def start(self) -> None:
        """Become the process's open-file sink."""
        _AUDITOR.sink = self._add
        _AUDITOR.write_sink = self._wrote
        _AUDITOR.changed()

    def _wrote(self, name: str) -> None:
        self.written.add(os.path.abspath(name))

    def _add(self, name: str) -> None:
        if not os.path.isabs(name):
            name = os.path.join(os.getcwd(), name)
        if self.segment is None:
            self.raw.add(name)
        else:
            self.by_segment.setdefault(self.segment, set()).add(name)

    def stop(self) -> dict[RelPath, str]:
        """Stop collecting; return repo path -> sha256 of each file read."""
        if _AUDITOR.sink == self._add:
            _AUDITOR.sink = None
        if _AUDITOR.write_sink == self._wrote:
            _AUDITOR.write_sink = None
        _AUDITOR.changed()
        return self.resolve(self.raw)

    def resolve(self, names: set[str]) -> dict[RelPath, str]:
        """Repo path -> sha256 of each of ``names`` under the repo that is an input.

        Not inputs: directories, files this process opened for writing (a checkpoint
        it saved and loads back), and files gone by now (temporary files it made and
        removed): none of them can differ before the next run starts.
        """
        out: dict[RelPath, str] = {}
        for name in sorted(names):
            rel = self.mapper.rel(name)
            if rel is None or rel in out or os.path.isdir(name) \
                    or os.path.abspath(name) in self.written or not os.path.exists(name):
                continue
            out[rel] = sha256_file(Path(name))
        return out
