"""Module scope: how many imported modules are the repository's, and how many lie outside.

A recorded process imports modules from the repository (measured), from the
interpreter and installed packages, Bazel runfiles trees and FastCI itself (not
counted), and maybe from elsewhere, e.g. an editable install of another checkout:
code that runs but that no evidence can name. :func:`module_scope` counts both kinds
for the trace's ``ModuleScope``, classifying each module once per process.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections import Counter
from typing import Any, Mapping

from fastci.evidence.record.children import is_child_site_file
from fastci.evidence.record.files import PathMapper

#: FastCI's own package: machinery wherever it is installed, never "code outside the repo".
FASTCI_CODE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
# module_scope's running answers, by (pid, repo root).
_SCOPES: dict[tuple[int, str], _Scope] = {}
_INTERPRETER_DIRS: tuple[str, ...] | None = None
# Path components of installed (third-party) code, wherever the environment lives.
_INSTALLED_PARTS = frozenset({"site-packages", "dist-packages", ".venv"})


def _interpreter_dirs() -> tuple[str, ...]:
    """The interpreter's own folders (prefixes, stdlib, site-packages), real paths + ``/``."""
    global _INTERPRETER_DIRS
    if _INTERPRETER_DIRS is None:
        # Not the bare prefixes: under /usr/local may live another checkout too.
        dirs = {v for k, v in sysconfig.get_paths().items()
                if k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")}
        try:
            dirs.update(site.getsitepackages())
            dirs.add(site.getusersitepackages())
        except AttributeError:  # an old virtualenv's site module lacks them
            pass
        found = {os.path.realpath(d).rstrip(os.sep) + os.sep for d in dirs if d}
        found |= {os.path.abspath(d).rstrip(os.sep) + os.sep for d in dirs if d}
        # Bazel's runfiles trees: other repositories there (external/, pip repositories,
        # the launcher stub) are dependencies, and the workspace's own files map inside.
        found |= {os.path.realpath(os.environ[v]).rstrip(os.sep) + os.sep
                  for v in ("RUNFILES_DIR", "TEST_SRCDIR") if os.environ.get(v)}
        found.add(FASTCI_CODE_DIR.rstrip(os.sep) + os.sep)
        _INTERPRETER_DIRS = tuple(sorted(found))
    return _INTERPRETER_DIRS


def _import_root(name: str, real: str) -> str:
    """The ``sys.path`` entry module ``name`` was imported from (its file's folder if unsure)."""
    parts = name.split(".")
    folder = os.path.dirname(real)
    if os.path.basename(real).split(".", 1)[0] == "__init__":
        tail = parts  # a package: its folder is the last name
    else:
        tail = parts[:-1]
    for part in reversed(tail):
        if os.path.basename(folder) != part:
            return os.path.dirname(real)  # loaded from a path, not by its name
        folder = os.path.dirname(folder)
    return folder


def _classify(mapper: PathMapper, name: str, filename: str) -> tuple[str, str]:
    """``("repo", "")``, ``("outside", <import root>)`` or ``("", "")`` (not counted)."""
    if not os.path.isabs(filename):
        return "", ""  # a made-up name (torch.ops has "_ops.py"), not a file imported
    absn = os.path.normpath(filename)
    if name == "sitecustomize" and is_child_site_file(absn):
        return "", ""  # FastCI's own child-recording hook (fastci.evidence.record.children)
    # Cheap string tests first: most modules are the interpreter's or installed ones
    # (which the mapper never maps into the repo either), so few need a realpath.
    if absn.startswith(_interpreter_dirs()) or _INSTALLED_PARTS.intersection(absn.split(os.sep)):
        return "", ""
    if mapper.rel(filename) is not None:
        return "repo", ""
    real = os.path.realpath(absn)
    for path in (real, absn):
        # Under the repository but not evidence (.venv, bazel-out, ...): not "outside".
        if any(path.startswith(root + os.sep) for root in mapper.roots):
            return "", ""
        if path.startswith(_interpreter_dirs()):
            return "", ""
        if _INSTALLED_PARTS.intersection(path.split(os.sep)):
            return "", ""
    marker = os.sep + "external" + os.sep
    if marker in real:
        base = real.split(marker, 1)[0]
        if os.path.isdir(os.path.join(base, "execroot")) or \
                os.path.basename(os.path.dirname(base)) == "execroot":
            return "", ""  # a Bazel output base's external repository: a dependency
    if not os.path.isfile(real):
        return "", ""  # not a file on disk (a zip member, a made-up name)
    return "outside", _import_root(name, real)


def module_scope(mapper: PathMapper) -> tuple[int, int, str]:
    """Count the imported modules' files under the repository and outside it (``ModuleScope``).

    Outside means: not a repo path of ``mapper`` and not under the interpreter's
    folders, an installed package, a Bazel runfiles tree or FastCI itself, e.g. an
    editable install of another checkout. Such code is never evidence. Each module
    is classified once per process: a stop looks only at the modules imported (or
    removed) since the previous one, a set difference over ``sys.modules``' names.

    Returns:
        (repo modules, outside modules, the ``sys.path`` entry most outside modules
        came from, ``""`` when none).
    """
    scope = _SCOPES.get((os.getpid(), mapper.repo_root))
    if scope is None:
        scope = _SCOPES[(os.getpid(), mapper.repo_root)] = _Scope()
    scope.update(mapper, sys.modules)
    roots = Counter(scope.outside_root[f] for f in scope.outside)
    example = roots.most_common(1)[0][0] if roots else ""
    return len(scope.repo), len(scope.outside), example


class _Scope:
    """The running answer of :func:`module_scope` for one process and repository.

    By file: one module may sit in sys.modules under two names (__main__, __mp_main__),
    so files are counted with multiplicity and reported once.
    """

    def __init__(self) -> None:
        self.known: dict[str, tuple[str, str, str]] = {}  # name -> (file, where, root)
        self.repo: Counter[str] = Counter()
        self.outside: Counter[str] = Counter()
        self.outside_root: dict[str, str] = {}

    def update(self, mapper: PathMapper, modules: Mapping[str, Any]) -> None:
        names = set(modules)  # a copy: another thread may import meanwhile
        for name in self.known.keys() - names:
            self._count(self.known.pop(name), -1)
        for name in names - self.known.keys():
            filename = getattr(modules.get(name), "__file__", None)
            if not isinstance(filename, str) or not filename:
                entry = ("", "", "")
            else:
                try:
                    where, root = _classify(mapper, name, filename)
                except (OSError, ValueError):  # an odd file name: not counted either way
                    where, root = "", ""
                entry = (filename, where, root)
            self.known[name] = entry
            self._count(entry, 1)

    def _count(self, entry: tuple[str, str, str], delta: int) -> None:
        filename, where, root = entry
        counter = self.repo if where == "repo" else self.outside if where == "outside" else None
        if counter is None:
            return
        counter[filename] += delta
        if counter[filename] <= 0:
            del counter[filename]
        elif where == "outside":
            self.outside_root[filename] = root
