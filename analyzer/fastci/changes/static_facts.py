"""Syntax facts about one Python source that line evidence cannot see (pure: source in).

Coverage only records Python line events, and only for code that runs as Python.
This module reads one file's syntax tree for what that misses:

- **compiled or traced functions** (:func:`compiler_of`; the per-function answer is
  :func:`fastci.changes.compiled_code.compiled_units`): bodies under
  ``@triton.jit``, ``torch.jit.script``, ``torch.compile`` / ``torch._dynamo.optimize``,
  numba, jax and cupy decorators or call sites (``f2 = torch.compile(f)``,
  ``self.fwd = torch.compile(self._fwd)``), through ``functools.partial`` and compile
  wrappers (this file's, or other modules' given by the caller), instances
  (``torch.compile(net)``, ``net.compile()``); functions nested in them; and helpers of
  the same file that a compiled body calls (they are compiled through their caller).
  :mod:`fastci.changes.compiled_code` says more (how, witnesses, other modules);
- **open namespaces** (:func:`open_namespace`): a module whose new names change
  behaviour without being called (``from x import *``, a module ``__getattr__``,
  ``globals()`` / ``dir()`` / ``vars()`` / ``sys.modules[__name__]``);
- **registrable classes** (:func:`registrable_classes`): classes whose bases or
  keywords can register them at definition time (``__init_subclass__``, metaclasses);
- **imports** (:func:`imports_of`), **member discovery** (:func:`discovers_members`)
  and **file discovery** (:func:`discovers_files`), which :mod:`fastci.changes.static_reach`
  uses across the repository.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from fastci.types import RelPath

#: Dotted names of decorators / functions whose target never produces Python line events.
COMPILERS = frozenset({
    "triton.jit", "triton.autotune", "triton.heuristics",
    "torch.jit.script", "torch.jit.trace", "torch.jit.trace_module", "torch.jit.script_method",
    "torch.compile", "torch._dynamo.optimize", "torch._dynamo.explain",
    "torch.cuda.jiterator._create_jit_fn",
    "numba.jit", "numba.njit", "numba.cuda.jit", "numba.vectorize", "numba.guvectorize",
    "numba.stencil", "numba.cfunc", "numba.generated_jit",
    "jax.jit", "jax.pmap", "jax.vmap", "jax.grad", "jax.value_and_grad", "jax.checkpoint",
    "cupy.fuse", "cupyx.jit.rawkernel",
})
#: Bare names that compile when their origin is unknown (a star import, a re-export).
_BARE_COMPILERS = frozenset({"jit", "njit", "autotune", "heuristics", "script", "vectorize",
                             "guvectorize", "rawkernel"})
_COMPILER_PREFIXES = ("triton.", "numba.", "jax.", "cupy", "torch.jit", "torch.compile",
                      "torch._dynamo")

_BUILTIN_TYPES = frozenset(n for n in dir(builtins) if isinstance(getattr(builtins, n), type))
_FuncNode = (ast.FunctionDef, ast.AsyncFunctionDef)


def parse(source: bytes | str | None) -> ast.Module | None:
    """The syntax tree of ``source``, None when absent or unparsable."""
    if source is None:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it was imported (or assigned) from, file-wide."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            name = dotted(node.value)
            if name is not None:
                out.setdefault(node.targets[0].id, name)
    return out


def _resolve(name: str, names: dict[str, str]) -> str:
    seen: set[str] = set()
    while True:  # follow alias chains (jit = tl_jit = triton.jit), each name once
        head, _, rest = name.partition(".")
        full = names.get(head)
        if full is None or head in seen:
            return name
        seen.add(head)
        name = f"{full}.{rest}" if rest else full


def compiler_of(node: ast.AST, names: dict[str, str]) -> str | None:
    """The compiler a decorator or callee expression names (``torch.compile``), else None.

    ``@torch.compile(mode=...)`` and ``torch._dynamo.optimize("inductor")(f)`` count
    like their bare forms.
    """
    if isinstance(node, ast.Call):
        node = node.func
    name = dotted(node)
    if name is None:
        return None
    full = _resolve(name, names)
    if full in COMPILERS:
        return full
    if "." not in full and full in _BARE_COMPILERS:
        return full
    last = full.rsplit(".", 1)[-1]
    if full.startswith(_COMPILER_PREFIXES) and last in {"jit", "njit", "compile", "script",
                                                         "trace", "optimize", "autotune"}:
        return full
    return None


@dataclass
class _Def:
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    parent: str | None  # qualname of the enclosing function, if nested in one


def _defs(body: list[ast.stmt], prefix: str = "", parent: str | None = None) -> Iterator[_Def]:
    for stmt in body:
        for node in _nested_defs(stmt):
            qual = f"{prefix}{node.name}"
            yield _Def(qual, node, parent)
            if isinstance(node, ast.ClassDef):
                yield from _defs(node.body, f"{qual}.", parent)
            else:
                yield from _defs(node.body, f"{qual}.<locals>.", qual)


def _nested_defs(stmt: ast.stmt) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Defs bound by ``stmt``, looking through if/try/with blocks (not into defs)."""
    if isinstance(stmt, (*_FuncNode, ast.ClassDef)):
        yield stmt
        return
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(stmt, field, []) or []:
            if isinstance(child, ast.ExceptHandler):
                for c in child.body:
                    yield from _nested_defs(c)
            elif isinstance(child, ast.stmt):
                yield from _nested_defs(child)


def _referenced(node: ast.AST) -> set[str]:
    """Names a body loads, and attribute names it reads (``self.helper``)."""
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def open_namespace(tree: ast.Module | None) -> str | None:
    """Why any new module-level name can change behaviour, else None.

    A star import (a new def may shadow an imported name), a module ``__getattr__``
    (a new name wins over it) or code that reads the module's own namespace
    (``globals()``, bare ``dir()``/``vars()``, ``sys.modules[__name__]``).
    """
    if tree is None:
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            return f"the module star-imports from {'.' * stmt.level}{stmt.module or ''}"
        if isinstance(stmt, _FuncNode) and stmt.name in ("__getattr__", "__dir__"):
            return f"the module defines {stmt.name}"
    top_level = {id(n) for s in tree.body if not isinstance(s, (*_FuncNode, ast.ClassDef))
                 for n in ast.walk(s)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            if n.func.id == "globals" or (n.func.id in ("dir", "vars", "locals") and not n.args
                                          and id(n) in top_level):
                return f"the module reads its own namespace ({n.func.id}())"
        if isinstance(n, ast.Subscript) and dotted(n.value) == "sys.modules" \
                and isinstance(n.slice, ast.Name) and n.slice.id == "__name__":
            return "the module reads its own namespace (sys.modules[__name__])"
    return None


def registrable_classes(tree: ast.Module | None) -> dict[str, str]:
    """Class qualname -> why its definition may register it somewhere, for every class.

    Any base other than a builtin type (``object``, ``Exception``...) may define
    ``__init_subclass__`` or a metaclass, in this repo or outside it, so it counts;
    so does any class keyword (``metaclass=``, registration arguments).
    """
    out: dict[str, str] = {}
    if tree is None:
        return out
    for d in _defs(tree.body):
        node = d.node
        if not isinstance(node, ast.ClassDef):
            continue
        if node.keywords:
            out[d.qualname] = f"class keywords ({', '.join(k.arg or '**' for k in node.keywords)})"
            continue
        bases = [ast.unparse(b) for b in node.bases]
        others = [b for b in bases if b not in _BUILTIN_TYPES]
        if others:
            out[d.qualname] = f"base {others[0]} may register subclasses"
    return out


@dataclass(frozen=True)
class Import:
    """One import in a file: ``module`` (absolute, dotted), the ``name`` taken from it.

    ``ref`` is the local expression that refers to the imported module (``np``,
    ``a.b.c``) when it binds one; ``guarded`` when inside ``try: ... except ImportError``.
    """

    module: str
    name: str | None = None
    ref: str | None = None
    guarded: bool = False
    line: int = 0

    def targets(self) -> list[str]:
        """Dotted modules this import may load: ``a.b`` and, for ``from a.b import c``, ``a.b.c``."""
        if self.name and self.name != "*":
            return [self.module, f"{self.module}.{self.name}"]
        return [self.module]


def module_name(path: RelPath) -> str:
    """The dotted name of a file path, from the repo root (``pkg/sub/__init__.py`` -> ``pkg.sub``)."""
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def names_module(full: str, dotted_name: str) -> bool:
    """Whether an import of ``dotted_name`` can load the file whose repo dotted name is ``full``.

    Suffix match, since the import root (``src/``, ``examples/x/``) is not known.
    """
    return bool(dotted_name) and (full == dotted_name or full.endswith("." + dotted_name))


def _guarded_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Try):
            for stmt in n.body:
                out.update(id(x) for x in ast.walk(stmt))
    return out


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def imports_of(tree: ast.Module, path: RelPath) -> list[Import]:
    """Every import in ``tree`` (any depth), relative ones resolved against ``path``.

    ``importlib.import_module("a.b")`` and ``__import__("a.b")`` with constant names count.
    """
    package = module_name(path) if path.endswith("/__init__.py") else \
        module_name(path).rpartition(".")[0]
    guarded = _guarded_nodes(tree)
    out: list[Import] = []

    def absolute(mod: str | None, level: int) -> str:
        if not level:
            return mod or ""
        base = package.split(".") if package else []
        base = base[:len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, *([mod] if mod else [])])

    assigned: dict[int, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            assigned[id(n.value)] = n.targets[0].id
    for n in ast.walk(tree):
        g = id(n) in guarded
        if isinstance(n, ast.Import):
            for a in n.names:
                out.append(Import(a.name, None, a.asname or a.name, g, n.lineno))
        elif isinstance(n, ast.ImportFrom):
            mod = absolute(n.module, n.level)
            for a in n.names:
                out.append(Import(mod, a.name, None if a.name == "*" else a.asname or a.name,
                                  g, n.lineno))
        elif isinstance(n, ast.Call) and _is_dynamic_import(n):
            name = _const_str(n.args[0]) if n.args else None
            if name is not None:
                level = len(name) - len(name.lstrip("."))
                out.append(Import(absolute(name.lstrip(".") or None, level), None,
                                  assigned.get(id(n)), g, n.lineno))
    return out


def _is_dynamic_import(call: ast.Call) -> bool:
    name = dotted(call.func) or ""
    return name in ("__import__", "import_module") or name.endswith(".import_module")


#: Calls that list a module's members.
_MEMBER_LISTERS = frozenset({"getattr", "hasattr", "dir", "vars", "getmembers",
                             "getmembers_static"})


def discovers_members(tree: ast.Module, imported: list[Import], full: str) -> str | None:
    """How this file discovers the members of module ``full`` dynamically, else None.

    ``from m import *``, ``getattr(m, name)`` with a non-constant name, ``dir(m)``,
    ``vars(m)``, ``inspect.getmembers(m)``, ``m.__dict__`` where ``m`` is bound to the
    module by an import (or ``importlib.import_module``).
    """
    refs: set[str] = set()
    for imp in imported:
        if imp.name == "*" and names_module(full, imp.module):
            return f"star-imports {imp.module} (line {imp.line})"
        if imp.ref and any(names_module(full, t) for t in imp.targets()[-1:]):
            refs.add(imp.ref)
    if not refs:
        return None
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.args:
            func = dotted(n.func) or ""
            last = func.rsplit(".", 1)[-1]
            if last not in _MEMBER_LISTERS or dotted(n.args[0]) not in refs:
                continue
            if last in ("getattr", "hasattr") and len(n.args) > 1 and _const_str(n.args[1]):
                continue  # a constant attribute is a plain reference
            return f"calls {func}({dotted(n.args[0])}, ...) at line {n.lineno}"
        if isinstance(n, ast.Attribute) and n.attr == "__dict__" and dotted(n.value) in refs:
            return f"reads {dotted(n.value)}.__dict__ at line {n.lineno}"
    return None


#: Calls that list files or modules, whatever object they are called on.
_FILE_LISTERS = frozenset({"glob", "iglob", "rglob", "iterdir", "iter_modules", "walk_packages",
                           "spec_from_file_location"})
#: Calls that list files only as functions of ``os`` (``ast.walk`` lists no files).
_OS_LISTERS = frozenset({"os.listdir", "os.scandir", "os.walk", "listdir", "scandir"})


#: Listers that take a name pattern as their first argument (``glob.glob(p)``,
#: ``Path.glob(p)``, ``Path.rglob(p)``, ``glob.iglob(p)``).
_PATTERN_LISTERS = frozenset({"glob", "iglob", "rglob"})
#: Listers of modules (a new Python file in their folder is always among what they find).
_MODULE_LISTERS = frozenset({"iter_modules", "walk_packages"})


@dataclass(frozen=True)
class FileDiscovery:
    """One call that finds files or modules at run time (issue 38: only a pattern that can
    match a new file connects it).

    Attributes:
        line: the call's line.
        how: what a person reads (``calls Path.glob('*.pt') at line 4``).
        patterns: what it can find, as ``fnmatch`` patterns: every group must have one
            that matches (a glob's pattern; the literal filters of a comprehension or
            loop over a directory listing, each an alternative of its group). Over the
            file's name for file listers, over the module's dotted name for computed
            imports. Empty: it can find anything (no pattern, or one that is not a
            literal).
        modules: the patterns are over dotted module names (``importlib.import_module``).
    """

    line: int
    how: str
    patterns: tuple[tuple[str, ...], ...] = ()
    modules: bool = False

    def can_find(self, path: RelPath) -> bool:
        """Whether this call may find the file ``path`` (a module by its dotted name,
        matched on any suffix since the import root is unknown)."""
        if not self.modules:
            # The pattern may name any level below the listed folder (``plugin_*`` finds
            # ``plugin_b/``, whose ``main.py`` is then run) or a whole path: every folder
            # name, the file's name and every path suffix are candidates.
            parts = path.split("/")
            names = {*parts, *("/".join(parts[i:]) for i in range(len(parts)))}
            return all(any(fnmatch.fnmatchcase(x, p) for p in group for x in names)
                       for group in self.patterns)
        parts = module_name(path).split(".")
        suffixes = [".".join(parts[i:]) for i in range(len(parts))]
        # A relative name resolves somewhere up the path: its dots are dropped.
        return all(any(fnmatch.fnmatchcase(x, p.lstrip(".")) for p in group for x in suffixes)
                   for group in self.patterns)


def _listing_filters(tree: ast.Module) -> dict[int, tuple[tuple[str, ...], ...]]:
    """Directory listings whose entries are filtered by literal name tests, by the id of
    the listing call: ``[f for f in os.listdir(d) if f.endswith(".pt")]``,
    ``for p in sorted(d.iterdir()): if p.suffix == ".pt": ...``."""
    out: dict[int, tuple[tuple[str, ...], ...]] = {}

    def listing(node: ast.AST) -> ast.AST:
        while isinstance(node, ast.Call) and dotted(node.func) in ("sorted", "list") \
                and len(node.args) == 1:
            node = node.args[0]
        return node

    for n in ast.walk(tree):
        if isinstance(n, ast.comprehension) and isinstance(n.target, ast.Name):
            groups = [g for g in (_name_test(c, n.target.id) for c in n.ifs) if g]
        elif isinstance(n, ast.For) and isinstance(n.target, ast.Name) and len(n.body) == 1 \
                and isinstance(n.body[0], ast.If) and not n.body[0].orelse and not n.orelse:
            groups = [g for g in [_name_test(n.body[0].test, n.target.id)] if g]
        else:
            continue
        if groups:
            out[id(listing(n.iter))] = tuple(groups)
    return out


def _name_test(test: ast.expr, target: str) -> tuple[str, ...]:
    """The name patterns a condition on ``target`` requires (``t.endswith(".pt")`` ->
    ``*.pt``), or () when it is not such a test (it then filters nothing we know of)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for v in test.values:  # every part must hold: one literal test is enough
            got = _name_test(v, target)
            if got:
                return got
        return ()

    def on_target(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and dotted(node.func) == "str" and len(node.args) == 1:
            node = node.args[0]
        if isinstance(node, ast.Attribute) and node.attr in ("name", "path"):
            node = node.value
        return isinstance(node, ast.Name) and node.id == target

    def consts(node: ast.AST) -> tuple[str, ...]:
        if _const_str(node) is not None:
            return (_const_str(node) or "",)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) \
                and all(_const_str(e) is not None for e in node.elts):
            return tuple(_const_str(e) or "" for e in node.elts)
        return ()

    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.args:
        got = consts(test.args[0])
        if test.func.attr == "endswith" and on_target(test.func.value):
            return tuple(f"*{c}" for c in got)
        if test.func.attr == "startswith" and on_target(test.func.value):
            return tuple(f"{c}*" for c in got)
    if isinstance(test, ast.Call) and (dotted(test.func) or "").rsplit(".", 1)[-1] in (
            "fnmatch", "fnmatchcase") and len(test.args) == 2 and on_target(test.args[0]):
        return consts(test.args[1])
    if isinstance(test, ast.Compare) and len(test.ops) == 1 \
            and isinstance(test.left, ast.Attribute) and test.left.attr == "suffix" \
            and on_target(test.left.value) and isinstance(test.ops[0], (ast.Eq, ast.In)):
        return tuple(f"*{c}" for c in consts(test.comparators[0]))
    return ()


def _literal_pattern(node: ast.AST | None) -> str | None:
    """The last path component of a literal path pattern, as an ``fnmatch`` pattern.

    ``"*.pt"``, ``f"{d}/ckpt_*.pt"``, ``os.path.join(d, "*.pt")`` and ``d / "*.pt"``
    end in a literal component; anything else (a variable, a call) gives None.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.rstrip("/").rsplit("/", 1)[-1] or None
    if isinstance(node, ast.JoinedStr) and node.values:
        tail = _const_str(node.values[-1])
        if tail is not None and "/" in tail:
            return tail.rstrip("/").rsplit("/", 1)[-1] or None
        if all(isinstance(v, ast.Constant) or isinstance(v, ast.FormattedValue)
               for v in node.values) and tail is not None:
            # ``f"ckpt_{step}.pt"``: each placeholder is any text.
            text = "".join(_const_str(v) or "*" for v in node.values)
            return text.rsplit("/", 1)[-1] or None
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _literal_pattern(node.right)
    if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("path.join") \
            and node.args:
        return _literal_pattern(node.args[-1])
    return None


def _module_pattern(node: ast.AST | None) -> str | None:
    """A computed module name as an ``fnmatch`` pattern (``f"models.{name}"`` ->
    ``models.*``); None when nothing of it is literal."""
    if isinstance(node, ast.JoinedStr):
        text = "".join(c if (c := _const_str(v)) is not None else "*" for v in node.values)
        return None if not text.strip("*.") else text
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        if left is not None or right is not None:
            text = f"{left if left is not None else '*'}{right if right is not None else '*'}"
            return None if not text.strip("*.") else text
    return None


def file_discoveries(tree: ast.Module) -> list[FileDiscovery]:
    """Every call in ``tree`` that discovers files or modules dynamically, with what it
    can find: glob patterns (``Path.glob("*.pt")`` finds no Python file), module
    listers (``pkgutil.iter_modules``: any module), directory listings (``os.listdir``,
    ``iterdir``, ``os.walk``: any file, unless a comprehension or loop over them keeps
    only literal names) and ``importlib`` with a computed name (a module pattern, when
    part of the name is literal)."""
    out: list[FileDiscovery] = []
    filters = _listing_filters(tree)
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        func = dotted(n.func) or (n.func.attr if isinstance(n.func, ast.Attribute) else "")
        last = func.rsplit(".", 1)[-1]
        arg = n.args[0] if n.args else None
        if last in _PATTERN_LISTERS:
            pattern = _literal_pattern(arg)
            why = f"names matching {pattern!r}" if pattern is not None \
                else "a pattern that is not a literal: any file"
            out.append(FileDiscovery(n.lineno, f"calls {func}() at line {n.lineno} ({why})",
                                     ((pattern,),) if pattern is not None else ()))
        elif last in _FILE_LISTERS or func in _OS_LISTERS:
            kept = filters.get(id(n), ()) if last not in _MODULE_LISTERS else ()
            what = "lists modules" if last in _MODULE_LISTERS else \
                "loads a file by path" if last == "spec_from_file_location" else \
                f"keeps names matching {' and '.join('/'.join(g) for g in kept)}" if kept \
                else "lists every file"
            out.append(FileDiscovery(n.lineno, f"calls {func}() at line {n.lineno} ({what})",
                                     kept))
        elif _is_dynamic_import(n) and not (n.args and _const_str(n.args[0])):
            pattern = _module_pattern(arg)
            shown = f" {pattern!r}" if pattern is not None else ""
            out.append(FileDiscovery(n.lineno, f"imports a computed module name{shown} "
                                               f"({func}) at line {n.lineno}",
                                     ((pattern,),) if pattern is not None else (),
                                     modules=True))
    return sorted(out, key=lambda d: d.line)


def discovers_files(tree: ast.Module, path: RelPath | None = None) -> str | None:
    """How this file discovers modules or files dynamically (glob, listdir, pkgutil,
    ``importlib.import_module`` of a computed name), else None. With ``path``, only a
    discovery that can find that file counts (:meth:`FileDiscovery.can_find`)."""
    for d in file_discoveries(tree):
        if path is None or d.can_find(path):
            return d.how
    return None


# --------------------------------------------------------------------------- purity
#
# Which decorators and expressions act at import time only on the object they make
# (so a new def using them is a new unit, and a binding using them changes only its
# name's value). Names resolve through the module's own imports; a name the module
# binds any other way, or binds two ways, resolves to nothing and is never pure.

#: Builtins that compute a value and touch nothing else (iterating their arguments
#: is pure when those are).
PURE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "bytes", "chr", "dict", "divmod", "enumerate", "float",
    "frozenset", "hash", "int", "isinstance", "issubclass", "len", "list", "max", "min",
    "object", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice", "sorted",
    "str", "sum", "tuple", "type", "zip",
})


def module_imports(tree: ast.Module) -> dict[str, str]:
    """Module-scope name -> the dotted name its import binds, for unambiguous imports only.

    ``import torch as t`` gives ``t -> torch``, ``from pytest import mark`` gives
    ``mark -> pytest.mark``; a relative import keeps its dots (``.x.y``), so it
    matches no absolute pattern. A name also bound by an assignment, a def, a loop
    or a second, different import (``try: import x / except: x = None``) is left out.
    """
    imported: dict[str, set[str]] = {}
    other: set[str] = set()

    def scan(stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname:
                        imported.setdefault(a.asname, set()).add(a.name)
                    else:
                        head = a.name.split(".")[0]
                        imported.setdefault(head, set()).add(head)
            elif isinstance(stmt, ast.ImportFrom):
                base = "." * stmt.level + (stmt.module or "")
                for a in stmt.names:
                    if a.name == "*":
                        continue
                    sep = "" if base.endswith(".") else "."
                    imported.setdefault(a.asname or a.name, set()).add(f"{base}{sep}{a.name}")
            elif isinstance(stmt, (*_FuncNode, ast.ClassDef)):
                other.add(stmt.name)
            else:
                for n in ast.walk(stmt):
                    if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                        other.add(n.id)
                    elif isinstance(n, (ast.Import, ast.ImportFrom)):
                        other.update((a.asname or a.name).split(".")[0] for a in n.names)
                    elif isinstance(n, ast.ExceptHandler) and n.name:
                        other.add(n.name)

    scan(tree.body)
    return {k: next(iter(v)) for k, v in imported.items() if len(v) == 1 and k not in other}


def resolve_dotted(node: ast.AST, names: dict[str, str], bound: frozenset[str] = frozenset()) \
        -> str | None:
    """The full dotted name ``node`` refers to (through ``names``), else None.

    A bare name the module does not import resolves to itself only if it is a builtin
    that the module (``bound``: every name it binds) does not rebind.
    """
    text = dotted(node)
    if text is None:
        return None
    head, _, rest = text.partition(".")
    if head in names:
        return f"{names[head]}.{rest}" if rest else names[head]
    if head in _BUILTIN_NAMES and head not in bound:
        return text
    return None


_BUILTIN_NAMES = frozenset(dir(builtins))


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a dotted name matches one of the glob ``patterns`` (``pytest.mark.*``)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def pure_expression(node: ast.AST, names: dict[str, str], pure: Sequence[str],
                    bound: frozenset[str] = frozenset()) -> bool:
    """Whether evaluating ``node`` only computes a value: no call except to ``pure`` callables.

    Constants, names, attributes, operators, subscripts, containers, f-strings,
    comprehensions and lambdas of pure parts; calls of :data:`PURE_BUILTINS`, of
    names matching ``pure``, or of methods of a constant (``", ".join(...)``).
    Anything else (a call of an unknown function, ``await``, ``:=``) is not pure.
    """
    for n in ast.walk(node):
        if isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(n, ast.Call):
            func = n.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Constant):
                continue
            target = resolve_dotted(func, names, bound)
            if target is None:
                return False
            if not (target in PURE_BUILTINS or matches(target, pure)):
                return False
    return True


def pure_decorator(node: ast.expr, names: dict[str, str], pure: Sequence[str],
                   bound: frozenset[str] = frozenset()) -> bool:
    """Whether a decorator only wraps or marks its function, with no other import-time effect.

    ``@torch.no_grad``, ``@torch.inference_mode()``, ``@pytest.mark.parametrize("x", [1, 2])``:
    the decorator (or the callee of a decorator call) resolves to a name matching
    ``pure`` and every argument is a :func:`pure_expression`.
    """
    target = node.func if isinstance(node, ast.Call) else node
    full = resolve_dotted(target, names, bound)
    if full is None or not matches(full, pure):
        return False
    return pure_expression(node, names, pure, bound)


def module_bindings(tree: ast.Module) -> frozenset[str]:
    """Every name the module scope binds (imports, assignments, defs, loops, ...)."""
    out: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (*_FuncNode, ast.ClassDef)):
            out.add(n.name)
            todo.extend(n.decorator_list)
            continue
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        todo.extend(ast.iter_child_nodes(n))
    return frozenset(out)


#: Public names of the syntax helpers :mod:`fastci.changes.compiled_code` builds on.
Def = _Def
FUNC_NODES = _FuncNode
defs_of = _defs
referenced = _referenced
resolve_alias = _resolve

__all__ = ["COMPILERS", "Import", "Def", "FUNC_NODES", "defs_of", "referenced", "resolve_alias",
           "open_namespace", "registrable_classes",
           "imports_of", "discovers_members", "discovers_files", "file_discoveries",
           "FileDiscovery", "module_name", "names_module",
           "parse", "aliases", "compiler_of", "dotted", "PURE_BUILTINS", "module_imports",
           "resolve_dotted", "matches", "pure_expression", "pure_decorator", "module_bindings"]
