"""The third-party distributions a process imported: ``{name: version}``.

The recorder asks at every trace stop (:func:`imported`), so the answer must cost
little: ``importlib.metadata.packages_distributions()`` reads every installed
distribution's metadata (a quarter of a second in a small venv, once per test
process). Instead, a module's file tells where it was imported from; only a folder
that holds ``*.dist-info``/``*.egg-info`` entries (a site-packages, a Bazel pip
repository, a ``--target`` folder) is indexed, once per process, and only when a
module was imported from it. The index maps top-level import names to the
distributions that ship them: ``top_level.txt`` where a distribution has one, its
``RECORD`` otherwise. Results are cached per top-level name, so a later stop
costs one pass over ``sys.modules`` names.

Not listed: the standard library and any folder without distribution metadata
(the repository's own sources, an editable install's source tree), editable
distributions (the repository's own packages: their metadata points at a source
folder) and FastCI itself. Names are canonical (PEP 503: lower case, runs of
``-_.`` as ``-``), so a requirement line and a recorded import compare equal.

This module needs only the standard library (it runs inside every test process).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Mapping

#: FastCI's own package: the recorder's machinery, never a test's dependency.
FASTCI_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Module-name prefixes of editable-install hooks (setuptools, hatch): the repo's own packages.
_EDITABLE_HOOKS = ("__editable__", "_editable_impl_")
_META_SUFFIXES = (".dist-info", ".egg-info")
_RECORD_FIRST = re.compile(r"^(?:\./)?([^/,\r\n]+)", re.MULTILINE)
_RECORD_TWO = re.compile(r"^(?:\./)?([^/,\r\n]+/[^/,\r\n]+)/", re.MULTILINE)
_CANONICAL = re.compile(r"[-_.]+")

#: Folder -> its index (None: no distribution metadata there: stdlib, sources).
_ROOTS: dict[str, _Root | None] = {}
#: Import head ("yaml", "google.protobuf") -> its distributions; _NAMESPACE marks a
#: namespace package, whose distributions are found per two-part head.
_HEADS: dict[str, tuple[tuple[str, str], ...] | None] = {}
_NAMESPACE: tuple[tuple[str, str], ...] = (("", ""),)


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it: ``PyYAML`` and ``pyyaml`` are one."""
    return _CANONICAL.sub("-", name).lower()


@dataclass
class _Dist:
    """One installed distribution's metadata folder."""

    meta: str  # the .dist-info / .egg-info path
    name: str  # canonical
    version: str
    tops: frozenset[str] | None  # from top_level.txt; None: not there
    _record: frozenset[str] | None = field(default=None, repr=False)
    _editable: bool | None = field(default=None, repr=False)

    def record_paths(self) -> frozenset[str]:
        """The first path part, and the first two, of every file its RECORD lists."""
        if self._record is None:
            text = _read(os.path.join(self.meta, "RECORD")) or \
                _read(os.path.join(self.meta, "installed-files.txt")) or ""
            # Two regex passes over the whole text (C speed: torch lists 15k files).
            parts = set(_RECORD_FIRST.findall(text))
            parts.update(_RECORD_TWO.findall(text))
            self._record = frozenset(parts)
        return self._record

    def top_names(self) -> frozenset[str]:
        """Top-level import names it ships."""
        if self.tops is not None:
            return self.tops
        return frozenset(_module_name(p) for p in self.record_paths() if "/" not in p)

    @property
    def editable(self) -> bool:
        """Whether it is an editable install (PEP 660 ``direct_url.json``): the repo's own code."""
        if self._editable is None:
            try:
                info = json.loads(_read(os.path.join(self.meta, "direct_url.json")) or "{}")
                self._editable = bool(info.get("dir_info", {}).get("editable", False))
            except (ValueError, AttributeError):
                self._editable = False
        return self._editable


def _module_name(entry: str) -> str:
    """``yaml`` from ``yaml``, ``six.py``, ``_yaml.cpython-311-x86_64-linux-gnu.so``."""
    return entry.split(".", 1)[0]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _parse_meta(folder: str, entry: str) -> _Dist | None:
    meta = os.path.join(folder, entry)
    stem = entry.rsplit(".", 1)[0]
    name, _, version = stem.partition("-")
    if entry.endswith(".egg-info"):
        version = version.split("-py", 1)[0]
    if not version:  # a folder named without its version: read it from the metadata
        text = _read(os.path.join(meta, "METADATA")) or _read(os.path.join(meta, "PKG-INFO")) or ""
        found = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
        version = found.group(1) if found else ""
    tops_text = _read(os.path.join(meta, "top_level.txt"))
    tops = None if tops_text is None else frozenset(
        t.strip().split("/", 1)[0] for t in tops_text.splitlines() if t.strip())
    return _Dist(meta, canonical(name), version, tops) if name else None


class _Root:
    """The distributions installed in one folder, and the import names they ship (lazy)."""

    def __init__(self, dists: list[_Dist]) -> None:
        self.dists = dists
        self._by_top: dict[str, list[_Dist]] | None = None

    def owners(self, top: str) -> list[_Dist]:
        """The distributions that ship top-level name ``top``.

        Cheapest first: ``top_level.txt`` claims, else a distribution without one
        named like the module (``typing_extensions``), else every ``RECORD``
        (read once, only when the cheap ways found nobody).
        """
        if self._by_top is None:
            by_top: dict[str, list[_Dist]] = {}
            for d in self.dists:
                for t in d.tops or ():
                    by_top.setdefault(t, []).append(d)
            self._by_top = by_top
        found = self._by_top.get(top)
        if found is not None:
            return found
        unlisted = [d for d in self.dists if d.tops is None]
        found = [d for d in unlisted if d.name == canonical(top)] or \
            [d for d in unlisted if top in d.top_names()]
        self._by_top[top] = found
        return found


def _root(folder: str) -> _Root | None:
    if folder not in _ROOTS:
        try:
            entries = os.listdir(folder)
        except OSError:
            entries = []
        dists = [d for e in sorted(entries) if e.endswith(_META_SUFFIXES)
                 and (d := _parse_meta(folder, e)) is not None]
        _ROOTS[folder] = _Root(dists) if dists else None
    return _ROOTS[folder]


def _import_folder(head: str, filename: str) -> str | None:
    """The folder ``head`` was imported from (its file's path minus the dotted name), or None."""
    parts = head.split(".")
    path = os.path.normpath(filename)
    folder = os.path.dirname(path)
    if os.path.basename(path).split(".", 1)[0] == "__init__":
        tail = parts
    else:
        tail = parts[:-1]
        if os.path.basename(path).split(".", 1)[0] != parts[-1]:
            return None
    for part in reversed(tail):
        if os.path.basename(folder) != part:
            return None  # loaded from a path, not by its name
        folder = os.path.dirname(folder)
    return folder


def _resolve(head: str, module: ModuleType | None,
             exclude_dirs: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    filename = getattr(module, "__file__", None) if module is not None else None
    if not isinstance(filename, str) or not filename:
        if "." not in head and module is not None and hasattr(module, "__path__"):
            return _NAMESPACE  # google, nvidia: the second part says whose
        return None
    if not os.path.isabs(filename):
        return None  # a made-up name (torch.ops has "_ops.py"), not a file imported
    if filename.startswith(exclude_dirs):
        return None
    folder = _import_folder(head, filename)
    root = _root(folder) if folder is not None else None
    if root is None:
        return None
    top, _, sub = head.partition(".")
    # A namespace's part is usually shipped by the distribution named like it
    # (google.protobuf: protobuf): try that before reading every RECORD.
    owners = [d for d in root.dists if sub and d.name == canonical(sub)
              and f"{top}/{sub}" in d.record_paths()] or root.owners(top)
    if sub and len(owners) != 1:  # a namespace: the distributions that ship top/sub
        owners = [d for d in owners if f"{top}/{sub}" in d.record_paths()] or owners
    return tuple(sorted({(d.name, d.version) for d in owners if not d.editable}))


def imported(modules: Mapping[str, ModuleType] = sys.modules, *,
             exclude_dirs: tuple[str, ...] = (FASTCI_DIR,)) -> dict[str, str]:
    """The installed distributions the modules were imported from: canonical name -> version.

    For ``sys.modules`` the answer is kept per process and brought up to date from the
    modules imported since the previous call (a set difference over the names); a
    removed module starts it again from scratch.

    Args:
        modules: the imported modules (``sys.modules``).
        exclude_dirs: modules whose file lies under one of these folders are not
            counted (FastCI's own package by default).
    """
    excluded = tuple(d.rstrip(os.sep) + os.sep for d in exclude_dirs)
    names = set(modules)  # a copy: another thread may import meanwhile
    key = (os.getpid(), excluded)
    state = _RUNNING.get(key) if modules is sys.modules else None
    if state is None or state.names - names:
        state = _Running()
        if modules is sys.modules:
            _RUNNING[key] = state
    state.add(names - state.names, modules, excluded)
    return {name: state.out[name] for name in sorted(state.out)}


class _Running:
    """What :func:`imported` found so far in a set of module names."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.out: dict[str, str] = {}
        self.namespaces: set[str] = set()
        self.pending: set[str] = set()  # heads not answered for good yet (no module)

    def add(self, new: set[str], modules: Mapping[str, ModuleType],
            excluded: tuple[str, ...]) -> None:
        self.names |= new
        tops = {n.partition(".")[0] for n in new}
        heads = {h for h in self.pending if "." not in h} | tops
        for top in heads:
            if top.startswith(_EDITABLE_HOOKS):
                continue
            self._answer(top, _HEADS[top] if top in _HEADS else _head(top, modules, excluded))
        if self.namespaces:
            sub = {".".join(n.split(".", 2)[:2]) for n in new if "." in n
                   and n.partition(".")[0] in self.namespaces}
            sub |= {h for h in self.pending if "." in h}
            for head in sub:
                self._answer(head, _head(head, modules, excluded))

    def _answer(self, head: str, hit: tuple[tuple[str, str], ...] | None) -> None:
        if head in _HEADS:
            self.pending.discard(head)
        else:
            self.pending.add(head)
        if hit == _NAMESPACE:
            if head not in self.namespaces:  # its sub-packages imported so far count now
                self.namespaces.add(head)
                self.pending |= {".".join(n.split(".", 2)[:2]) for n in self.names
                                 if n.startswith(head + ".")}
        elif hit:
            self.out.update(hit)


#: :func:`imported`'s running answers for ``sys.modules``, by (pid, excluded folders).
_RUNNING: dict[tuple[int, tuple[str, ...]], _Running] = {}


def _head(head: str, modules: Mapping[str, ModuleType],
          excluded: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """The distributions of one import head, cached once its module is imported."""
    if head in _HEADS:
        return _HEADS[head]
    module = modules.get(head)
    hit = _resolve(head, module, excluded)
    if module is not None:
        _HEADS[head] = hit
    return hit
