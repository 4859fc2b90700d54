"""What a change reaches with no evidence row in between: a static scan of the head tree.

Line evidence ties a change to tests only through code that ran as Python. Some
changes act on code they never call:

- a **compiled or traced** function (``@triton.jit``, ``torch.compile``...) is run by
  its callers, but never traced itself: the units that reference its name
  (:class:`ReachKind.COMPILED`) are its callers;
- a **new Python file** is picked up by modules that import its dotted name (also
  inside ``try: ... except ImportError`` or through ``importlib.import_module("...")``)
  or that discover files of its package dynamically (glob, ``os.listdir``,
  ``pkgutil.iter_modules``, ``importlib`` with a computed name); a **deleted** file
  likewise (its importers fall back or fail);
- a new or deleted ``__init__.py`` turns a directory into a package or a namespace
  package, which changes how every module below it is imported;
- a **new module-level name** is found by modules that list the module's members
  (``getattr(mod, name)``, ``dir(mod)``, ``inspect.getmembers(mod)``, ``mod.__dict__``,
  ``from mod import *``).

The scan is on demand: nothing is read unless the change has such a file or name,
and ``git grep`` narrows the files parsed to those naming the module or function.
"""

from __future__ import annotations

import ast
import enum
import functools
import logging
import posixpath
from dataclasses import dataclass
from typing import Iterable, Sequence

from fastci.changes.semantic_diff import ChangeKind, FileDiff, UnitChange
from fastci.integrations.git.repository import Git
from fastci.changes.compiled_code import Compiled, compile_facts
from fastci.changes.static_facts import (Import, discovers_files,
                                         discovers_members, imports_of, module_name,
                                         names_module, parse)
from fastci.units.lines import MODULE_QUALNAME
from fastci.types import RelPath, UnitId

LOG = logging.getLogger(__name__)

#: At most this many files are parsed per search; beyond it the search gives up (and the
#: module-level rules still apply), so a one-letter module name cannot stall a plan.
MAX_FILES = 2000


class ReachKind(enum.Enum):
    """What kind of static connection a :class:`Reach` is; the value is what a person reads."""

    COMPILED = "calls compiled or traced code"
    NEW_FILE = "imports or discovers a new Python file"
    DELETED_FILE = "imports or discovers a deleted Python file"
    PACKAGE = "sits under a directory whose __init__.py was added or deleted"
    DISCOVERED_NAME = "discovers the members of a module that has a new name"


@dataclass(frozen=True)
class Reach:
    """One static connection: tests touching ``module`` (or executing ``unit``) are reached.

    Attributes:
        kind: the kind of connection.
        path: the changed file.
        change: what changed there, as a phrase (``new file pkg/fast.py``).
        how: how the target connects to it (``pkg/app.py imports pkg.fast (line 3)``).
        module: tests whose evidence touches this module are reached.
        unit: tests whose evidence executed this unit are reached.
        changed_unit: the changed unit, when one led here.
    """

    kind: ReachKind
    path: RelPath
    change: str
    how: str
    module: RelPath | None = None
    unit: UnitId | None = None
    changed_unit: UnitId | None = None


#: Words in a module that may list another module's members dynamically
#: (:func:`member_discoverers` reads the files that hold one).
DISCOVERY_WORDS = ("getattr", "hasattr", "dir(", "vars(", "getmembers", "__dict__", "import *")


class HeadTree:
    """The head side of a change (a commit or the working tree), read lazily and cached."""

    def __init__(self, git: Git, head: str) -> None:
        self.git = git
        self.head = head
        self.searched = 0  # files parsed, for the log
        self._greps: dict[tuple[str, ...], tuple[RelPath, ...]] = {}

    @functools.lru_cache(maxsize=4096)
    def tree(self, path: RelPath) -> ast.Module | None:
        """The parsed head version of ``path`` (None: absent or unparsable)."""
        self.searched += 1
        return parse(self.git.read(self.head, path))

    @functools.lru_cache(maxsize=256)
    def files(self, under: str) -> tuple[RelPath, ...]:
        """Files at head under a folder (recursive)."""
        return tuple(self.git.list_files(self.head, under))

    def python_in(self, folder: str, recursive: bool = False) -> list[RelPath]:
        """Python files at head in ``folder`` (directly, or with ``recursive`` below it)."""
        prefix = f"{folder}/" if folder else ""
        return [p for p in self.files(folder) if p.endswith(".py") and p.startswith(prefix)
                and (recursive or "/" not in p[len(prefix):])]

    def exists(self, path: RelPath) -> bool:
        """Whether ``path`` is a file at head."""
        return path in self.files(posixpath.dirname(path))

    def grep(self, words: tuple[str, ...]) -> tuple[RelPath, ...]:
        """Python files at head containing any of ``words``."""
        return self.grep_each(words)[0]

    def grep_each(self, *searches: tuple[str, ...]) -> list[tuple[RelPath, ...]]:
        """:meth:`grep` of each of ``searches``; those not searched yet run side by side."""
        todo = list(dict.fromkeys(w for w in searches if w not in self._greps))
        for words, found in zip(todo, self.git.grep_files_each(self.head, todo)):
            self._greps[words] = tuple(found)
        return [self._greps[w] for w in searches]

    @functools.lru_cache(maxsize=4096)
    def imports(self, path: RelPath) -> tuple[Import, ...]:
        """The imports of ``path`` at head."""
        tree = self.tree(path)
        return tuple(imports_of(tree, path)) if tree is not None else ()


def _last(dotted_name: str) -> str:
    return dotted_name.rsplit(".", 1)[-1]


def importers(tree: HeadTree, path: RelPath) -> Iterable[tuple[RelPath, Import]]:
    """Head files (other than ``path``) with an import that can load ``path``'s module."""
    full = module_name(path)
    if not full:
        return
    for cand in tree.grep((_last(full),))[:MAX_FILES]:
        if cand == path:
            continue
        for imp in tree.imports(cand):
            if any(names_module(full, t) for t in imp.targets()):
                yield cand, imp
                break


def _package_dirs(tree: HeadTree, path: RelPath) -> list[str]:
    """``path``'s folder and the package folders above it (while they hold ``__init__.py``)."""
    folder = posixpath.dirname(path)
    out = [folder]
    while folder and tree.exists(f"{folder}/__init__.py"):
        folder = posixpath.dirname(folder)
        out.append(folder)
    return out


def file_discoverers(tree: HeadTree, path: RelPath) -> Iterable[tuple[RelPath, str]]:
    """Head modules in ``path``'s folder or its packages that discover files dynamically
    with a call that can find ``path`` (a glob for ``*.pt`` finds no Python file; a
    pattern that is not a literal, or a directory listing, finds any)."""
    for folder in _package_dirs(tree, path):
        for cand in tree.python_in(folder)[:MAX_FILES]:
            parsed = tree.tree(cand) if cand != path else None
            how = discovers_files(parsed, path) if parsed is not None else None
            if how is not None:
                yield cand, how


def member_searches(path: RelPath) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two searches :func:`member_discoverers` makes for ``path`` (files that may
    list members dynamically, files that name its module), for a caller that runs
    them ahead, side by side (:meth:`HeadTree.grep_each`)."""
    return DISCOVERY_WORDS, (_last(module_name(path)),)


def member_discoverers(tree: HeadTree, path: RelPath) -> Iterable[tuple[RelPath, str]]:
    """Head modules that list the members of ``path``'s module dynamically."""
    full = module_name(path)
    listing, naming = tree.grep_each(*member_searches(path))
    hits = set(listing) & set(naming)
    for cand in sorted(hits)[:MAX_FILES]:
        parsed = tree.tree(cand)
        if cand == path or parsed is None:
            continue
        how = discovers_members(parsed, list(tree.imports(cand)), full)
        if how is not None:
            yield cand, how


def callers(tree: HeadTree, path: RelPath, qualname: str) -> Iterable[tuple[UnitId, str]]:
    """Units at head that reference the (compiled) function ``qualname`` of ``path``.

    In its own file: any function or module top level naming it (``f``, ``self.f``).
    Elsewhere: units of files that import ``path``'s module and name the function.
    """
    name = qualname.rsplit(".", 1)[-1]
    if not name.isidentifier():
        return
    full = module_name(path)
    named, importing = tree.grep_each((name,), (_last(full),))
    naming = sorted(set(named) & set(importing))
    own = [path] + [p for p in naming[:MAX_FILES] if p != path
                    and any(names_module(full, t) for imp in tree.imports(p)
                            for t in imp.targets())]
    for cand in own:
        parsed = tree.tree(cand)
        if parsed is None:
            continue
        for uid in _units_naming(cand, parsed, name):
            if uid != f"{path}::{qualname}":
                yield uid, f"{uid} references {name}"


def _units_naming(path: RelPath, tree: ast.Module, name: str) -> list[UnitId]:
    """Units of ``tree`` (functions, class bodies, ``<module>``) whose own code names ``name``."""
    out: list[UnitId] = []

    def visit(stmts: Sequence[ast.AST], owner: str, prefix: str) -> None:
        todo = list(reversed(stmts))
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                # Decorators, defaults and bases run in the enclosing unit.
                outer: list[ast.AST] = list(n.decorator_list)
                if isinstance(n, ast.ClassDef):
                    outer += [*n.bases, *n.keywords]
                else:
                    outer += [*n.args.defaults, *(d for d in n.args.kw_defaults if d)]
                todo.extend(outer)
                qual = prefix + n.name
                visit(n.body, qual, f"{qual}." if isinstance(n, ast.ClassDef)
                      else f"{qual}.<locals>.")
                continue
            if _names(n, name):
                uid = f"{path}::{owner}"
                if uid not in out:
                    out.append(uid)
            todo.extend(ast.iter_child_nodes(n))

    visit(tree.body, "<module>", "")
    return out


def _names(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or \
        (isinstance(node, ast.Attribute) and node.attr == name)


def _file_reach(tree: HeadTree, path: RelPath, kind: ReachKind, change: str) -> list[Reach]:
    out: list[Reach] = []
    for mod, imp in importers(tree, path):
        guard = " inside try/except" if imp.guarded else ""
        what = imp.module + (f".{imp.name}" if imp.name and imp.name != "*" else "")
        out.append(Reach(kind, path, change, f"{mod} imports {what}{guard} (line {imp.line})",
                         module=mod))
    for mod, how in file_discoverers(tree, path):
        out.append(Reach(kind, path, change, f"{mod} discovers modules dynamically: {how}",
                         module=mod))
    if path.endswith("/__init__.py") or path == "__init__.py":
        folder = posixpath.dirname(path)
        for mod in tree.python_in(folder, recursive=True)[:MAX_FILES]:
            if mod != path:
                out.append(Reach(ReachKind.PACKAGE, path, change,
                                 f"{mod} is below {folder or 'the repository root'}/, now "
                                 f"{'a regular' if kind is ReachKind.NEW_FILE else 'a namespace'}"
                                 " package", module=mod))
    return out


def static_reach(tree: HeadTree, files: Sequence[FileDiff]) -> list[Reach]:
    """Every static connection the changed files need (empty when none applies)."""
    out: list[Reach] = []
    for f in files:
        if f.failure:
            continue  # a file that does not parse widens on its own
        if f.status in ("A", "R"):
            out += _file_reach(tree, f.path, ReachKind.NEW_FILE, f"new file {f.path}")
        if f.status == "D" or (f.status == "R" and f.old_path):
            old = f.old_path or f.path
            out += _file_reach(tree, old, ReachKind.DELETED_FILE, f"deleted file {old}")
        added = [u for u in f.units if ChangeKind.ADDED in u.kinds and "." not in u.qualname
                 and u.qualname != "<module>"]
        if added and f.status == "M":
            names = ", ".join(u.qualname for u in added)
            for mod, how in member_discoverers(tree, f.path):
                out.append(Reach(ReachKind.DISCOVERED_NAME, f.path,
                                 f"new name{'s' * (len(added) > 1)} {names} in {f.path}",
                                 f"{mod} {how}", module=mod, changed_unit=added[0].unit))
        for u in f.units:
            if ChangeKind.COMPILED in u.kinds:
                out += _compiled_reach(tree, u)
    LOG.debug("static reach: %d connection(s), %d file(s) parsed", len(out), tree.searched)
    return out


#: Words of a file that may name a compiler (so may define a compile wrapper): files
#: without any are not parsed (``re.compile`` is not one).
COMPILE_WORDS = ("torch.compile", "_dynamo", "jit", "import compile", "numba", "cupy", "jax")
#: Words of a file that may compile another module's class (``net.compile()`` too, which,
#: unlike ``re.compile(pattern)``, takes no positional argument).
COMPILE_CALL_WORDS = COMPILE_WORDS + (".compile()", ".compile(backend", ".compile(mode",
                                      ".compile(fullgraph", ".compile(dynamic",
                                      ".compile(options", ".compile(**")


def compile_context(tree: HeadTree, path: RelPath) -> tuple[dict[str, str], dict[str, Compiled]]:
    """What other files say about compiling ``path``'s code, at head.

    Returns:
        the compile wrappers of the modules ``path`` imports (dotted name -> compiler:
        ``def compiled(fn): return torch.compile(fn)`` in ``pkg/jit.py``), and the
        functions and classes of ``path`` that another file compiles (qualname ->
        :class:`~fastci.changes.compiled_code.Compiled`: ``torch.compile(net)`` after
        ``net = Net()``, ``net.compile()``), with the unit holding that call as witness.
    """
    full = module_name(path)
    if not full:
        return {}, {}
    compiling, calling, naming = tree.grep_each(COMPILE_WORDS, COMPILE_CALL_WORDS,
                                                (_last(full),))
    # Only modules whose name the file's text holds can be imported by it: most files
    # are never parsed here.
    text = tree.git.read(tree.head, path) or b"" if compiling else b""
    maybe = [c for c in compiling[:MAX_FILES] if c != path
             and _last(module_name(c)).encode() in text]
    imported = {t for imp in tree.imports(path) for t in imp.targets()} if maybe else set()
    wrappers: dict[str, str] = {}
    for cand in maybe:
        mod = module_name(cand)
        if any(names_module(mod, t) for t in imported):
            found = compile_facts(tree.tree(cand)).wrappers
            wrappers.update({f"{mod}.{q}": how for q, how in found.items()})
    external: dict[str, Compiled] = {}
    for cand in sorted(set(calling) & set(naming))[:MAX_FILES]:
        if cand == path:
            continue
        for target, how, site, lazy in compile_facts(tree.tree(cand)).targets:
            mod, _, qual = target.rpartition(".")
            if names_module(full, mod):
                c = Compiled(f"{how} in {cand}", lazy, frozenset(
                    () if site == MODULE_QUALNAME else (f"{cand}::{site}",)))
                external[qual] = external[qual].join(c) if qual in external else c
    return wrappers, external


def _compiled_reach(tree: HeadTree, u: UnitChange) -> list[Reach]:
    return [Reach(ReachKind.COMPILED, u.path, f"{u.qualname} ({u.detail})", how, unit=uid,
                  changed_unit=u.unit)
            for uid, how in callers(tree, u.path, u.qualname)]


__all__ = ["Reach", "ReachKind", "HeadTree", "static_reach", "importers", "file_discoverers",
           "member_discoverers", "callers", "compile_context", "COMPILE_WORDS"]
