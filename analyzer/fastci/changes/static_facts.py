"""Syntax facts about one Python source that line evidence cannot see (pure: source in).

Coverage only records Python line events, and only for code that runs as Python.
This module reads one file's syntax tree for what that misses:

- **compiled or traced functions** (:func:`compiler_of`; the per-function answer is
  :func:`fastci.changes.compiled_code.compiled_functions`): bodies under
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


def discovers_files(tree: ast.Module) -> str | None:
    """How this file discovers modules or files dynamically (glob, listdir, pkgutil,
    ``importlib.import_module`` of a computed name), else None."""
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        func = dotted(n.func) or (n.func.attr if isinstance(n.func, ast.Attribute) else "")
        last = func.rsplit(".", 1)[-1]
        if last in _FILE_LISTERS or func in _OS_LISTERS:
            return f"calls {func}() at line {n.lineno}"
        if _is_dynamic_import(n) and not (n.args and _const_str(n.args[0])):
            return f"imports a computed module name ({func}) at line {n.lineno}"
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

__all__ = ["COMPILERS", "Import", "Def", "FUNC_NODES", "defs_of", "referenced", "resolve_alias", "open_namespace", "registrable_classes",
           "imports_of", "discovers_members", "discovers_files", "module_name", "names_module",
           "parse", "aliases", "compiler_of", "dotted", "PURE_BUILTINS", "module_imports",
           "resolve_dotted", "matches", "pure_expression", "pure_decorator", "module_bindings"]
