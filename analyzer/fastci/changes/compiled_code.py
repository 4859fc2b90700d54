"""Compiled and traced code in one file: how each function is compiled, and its witnesses.

Built on :mod:`fastci.changes.static_facts` (pure: source in). A function is compiled
when a decorator or a call applies a compiler to it (``@triton.jit``,
``torch.compile(f)``), also through ``functools.partial`` (``partial(torch.compile,
mode=...)``), a configured decorator (``torch.compile(mode=...)``) or a *compile
wrapper* (a function that applies a compiler to its argument: this file's, or other
modules' that the caller passes); an instance compiles its class's methods
(``torch.compile(net)`` after ``net = Net()``, ``net.compile()``, ``self.compile()``).
Functions nested in a compiled one and helpers of this file that a compiled body names
are compiled through it. :func:`compiled_units` also says whether only dynamo compiles
each (its traced frames are recorded at run time) and which units witness a test
running it; :func:`compile_facts` what a file compiles of other modules, and the
wrappers it defines (:func:`fastci.changes.static_reach.compile_context`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

from fastci.changes.static_facts import (FUNC_NODES as _FuncNode, Def as _Def, aliases,
                                         compiler_of, defs_of as _defs, dotted, parse,
                                         referenced as _referenced, resolve_alias as _resolve)
from fastci.units.lines import MODULE_QUALNAME


#: Compilers that trace with dynamo: the frames they trace are recorded at run time
#: (:mod:`fastci.evidence.record.traced`), so evidence can say which tests ran such code.
DYNAMO_COMPILERS = frozenset({"torch.compile", "torch._dynamo.optimize", "torch._dynamo.explain",
                              "torch.compiler.compile"})
_PARTIALS = frozenset({"functools.partial", "partial"})
#: ``<instance>.compile()``: ``nn.Module.compile`` compiles the instance's ``forward``.
MODULE_COMPILE = "nn.Module.compile"


@dataclass(frozen=True)
class Compiled:
    """How a function is compiled or traced, and what evidence shows a test running it.

    Attributes:
        how: the reason people read (``@torch.compile``, ``torch.compile(step) at line 9``).
        lazy: every compiler reaching it traces with dynamo (whose frames are recorded).
        witnesses: unit ids whose execution shows a test may run it compiled: the compiled
            function itself and the function holding a compile call (a call at a module's
            top level is no witness: dynamo compiles on the first call, not on the wrap).
    """

    how: str
    lazy: bool
    witnesses: frozenset[str] = frozenset()

    def join(self, other: Compiled) -> Compiled:
        """Both ways at once (``how`` of the first)."""
        return Compiled(self.how, self.lazy and other.lazy, self.witnesses | other.witnesses)


@dataclass(frozen=True)
class CompileFacts:
    """What one file compiles that another file defines, and the compile wrappers it defines.

    Attributes:
        targets: (dotted name of an imported function or class, how, qualname of the unit
            holding the compile call, lazy) per compile of an imported target.
        wrappers: qualname of a module-level function -> the compiler it applies to its
            argument (``def compiled(fn): return torch.compile(fn)``).
    """

    targets: tuple[tuple[str, str, str, bool], ...]
    wrappers: dict[str, str]


def _is_lazy(compiler: str) -> bool:
    return compiler in DYNAMO_COMPILERS or compiler == MODULE_COMPILE or \
        compiler.startswith(("torch._dynamo.", "torch.compiler."))


class _Compilers:
    """Resolves decorator and callee expressions of one file to the compiler they apply."""

    def __init__(self, tree: ast.Module, wrappers: dict[str, str]) -> None:
        self.names = aliases(tree)
        self.wrappers = wrappers  # dotted name (another module's) -> compiler
        self.local: dict[str, str] = {}
        for _ in range(3):  # wrappers of wrappers, a few levels deep
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    how = self._made(node.value)
                    if how is not None:
                        self.local.setdefault(node.targets[0].id, how)
                elif isinstance(node, _FuncNode):
                    how = self.wrapped_by(node)
                    if how is not None:
                        self.local.setdefault(node.name, how)

    def _made(self, value: ast.expr) -> str | None:
        """A compiler bound under a new name: ``partial(torch.compile, ...)`` or a
        configured decorator ``torch.compile(mode=...)``."""
        if isinstance(value, ast.Call):
            if (dotted(value.func) or "") in _PARTIALS or \
                    _resolve(dotted(value.func) or "", self.names) == "functools.partial":
                return self.of(value.args[0]) if value.args else None
            if not value.args:
                return self.of(value.func)
        return None

    def wrapped_by(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
        """The compiler ``fn`` applies to one of its parameters, directly or through a
        nested decorator, or returns configured (``partial``); None if it does not."""
        params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args)}
        body = [n for stmt in fn.body for n in ast.walk(stmt)]  # not its own decorators
        for n in body:
            if isinstance(n, ast.Call):
                how = self.of(n.func)
                if how is not None and n.args and isinstance(n.args[0], ast.Name):
                    if n.args[0].id in params or any(
                            isinstance(d, _FuncNode) and n.args[0].id in
                            {a.arg for a in d.args.args} for d in body):
                        return how
                made = self._made(n)
                if made is not None:
                    return made
        return None

    def of(self, node: ast.AST) -> str | None:
        """The compiler a decorator or callee expression applies, else None."""
        if isinstance(node, ast.Call):
            made = self._made(node)
            if made is not None and (dotted(node.func) or "").rsplit(".", 1)[-1] == "partial":
                return made
            node = node.func
        name = dotted(node)
        if name is None:
            return None
        if name in self.local:
            return self.local[name]
        found = compiler_of(node, self.names)
        if found is not None:
            return found
        full = _resolve(name, self.names)
        for wrapper, how in self.wrappers.items():
            if full == wrapper or wrapper.endswith("." + full) or full.endswith("." + wrapper):
                return how
        return None


def _instances(tree: ast.Module) -> dict[str, str]:
    """Variable name -> the (dotted) class of the instance assigned to it (``x = Net()``)."""
    out: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Call):
            cls = dotted(n.value.func)
            if cls is not None and cls.rsplit(".", 1)[-1][:1].isupper():
                out[n.targets[0].id] = cls
    return out


def _owners(defs: list[_Def], tree: ast.Module) -> dict[int, str]:
    """id(node) -> qualname of the function that holds it (absent: a module top level or a
    class body)."""
    out: dict[int, str] = {}
    for d in defs:
        if isinstance(d.node, ast.ClassDef):
            continue
        todo: list[ast.AST] = list(d.node.body)
        while todo:
            n = todo.pop()
            if isinstance(n, (*_FuncNode, ast.ClassDef, ast.Lambda)) and n is not d.node:
                if not isinstance(n, ast.Lambda):
                    continue
            out[id(n)] = d.qualname
            todo.extend(ast.iter_child_nodes(n))
    return out


def _compile_sites(tree: ast.Module, comp: _Compilers, defs: list[_Def]) \
        -> Iterator[tuple[str, ast.expr, ast.Call, bool]]:
    """(compiler, target expression, the call, whether the target is an instance) for each
    compile call: ``torch.compile(f)``, ``partial``s and wrappers, ``x.compile()``."""
    instances = _instances(tree)
    class_of_self = {id(n): d.qualname.rsplit(".", 1)[0] for d in defs
                     if not isinstance(d.node, ast.ClassDef) and "." in d.qualname
                     for n in ast.walk(d.node)}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if call.args:
            how = comp.of(call.func)
            if how is not None:
                target = call.args[0]
                instance = isinstance(target, ast.Name) and target.id in instances
                yield how, target, call, instance
                continue
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "compile" and not call.args:
            recv = func.value
            if isinstance(recv, ast.Name) and recv.id == "self" and id(call) in class_of_self:
                yield MODULE_COMPILE, ast.Name(id=class_of_self[id(call)].rsplit(".", 1)[-1]), \
                    call, True
            elif isinstance(recv, ast.Call) or (isinstance(recv, ast.Name)
                                                 and recv.id in instances):
                yield MODULE_COMPILE, recv, call, True


def compile_facts(tree: ast.Module | None, wrappers: dict[str, str] | None = None) -> CompileFacts:
    """Compiles of imported functions and classes, and the compile wrappers ``tree`` defines
    (:class:`CompileFacts`), for the repository-wide scan of
    :func:`fastci.changes.static_reach.repo_compiles`."""
    if tree is None:
        return CompileFacts((), {})
    comp = _Compilers(tree, wrappers or {})
    defs = list(_defs(tree.body))
    local = {d.node.name for d in defs}
    owners = _owners(defs, tree)
    instances = _instances(tree)
    out: list[tuple[str, str, str, bool]] = []
    for how, target, call, _ in _compile_sites(tree, comp, defs):
        if isinstance(target, ast.Call):
            target = target.func
        name = dotted(target)
        if name is None:
            continue
        name = instances.get(name, name)
        if name.split(".")[0] in local:
            continue
        full = _resolve(name, comp.names)
        if full != name or "." in full:
            out.append((full, f"{how}({ast.unparse(call.args[0]) if call.args else name}) at "
                              f"line {call.lineno}", owners.get(id(call), MODULE_QUALNAME),
                        _is_lazy(how)))
    wrappers_here = {d.qualname: how for d in defs if d.parent is None and "." not in d.qualname
                     for how in [comp.local.get(d.qualname)] if how is not None}
    return CompileFacts(tuple(out), wrappers_here)


def compiled_units(source: bytes | str | None, path: str = "", *,
                   wrappers: dict[str, str] | None = None,
                   external: dict[str, Compiled] | None = None) -> dict[str, Compiled]:
    """Function qualname -> how it is compiled or traced (:class:`Compiled`), for one file.

    Methods and nested functions included; functions nested in a compiled one and
    helpers of this file that a compiled body references (transitively) count too,
    since the compiler traces through them.

    Args:
        source: the file.
        path: its repository path (witnesses are unit ids ``path::qualname``).
        wrappers: compile wrappers other modules define (dotted name -> compiler).
        external: qualnames of this file that another file compiles (``torch.compile(Net())``
            where ``Net`` is imported from here), with how.
    """
    if source is None:
        return {}
    text = source if isinstance(source, bytes) else source.encode()
    if not external and not wrappers and not any(m in text for m in _COMPILE_WORDS):
        return {}
    tree = parse(source)
    if tree is None:
        return {}
    found = _Found(tree, path, wrappers or {})
    found.decorated()
    found.compile_calls()
    found.compiled_elsewhere(external or {})
    found.traced_through()
    return found.out


#: A file that names none of these (and is not compiled from elsewhere) compiles nothing.
_COMPILE_WORDS = (b"jit", b"compile", b"optimize", b"vectorize", b"autotune", b"heuristics",
                  b"script", b"trace", b"fuse", b"rawkernel", b"explain")


class _Found:
    """The compiled units of one file (``out``: qualname -> :class:`Compiled`), as
    :func:`compiled_units` finds them, one kind of evidence per method."""

    def __init__(self, tree: ast.Module, path: str, wrappers: dict[str, str]) -> None:
        self.tree, self.path = tree, path
        self.comp = _Compilers(tree, wrappers)
        self.defs = list(_defs(tree.body))
        self.out: dict[str, Compiled] = {}

    def uid(self, qual: str) -> str:
        return f"{self.path}::{qual}"

    def add(self, qual: str, c: Compiled) -> None:
        self.out[qual] = self.out[qual].join(c) if qual in self.out else c

    def methods(self, cls: str) -> list[str]:
        return [m.qualname for m in self.defs if m.qualname.startswith(cls + ".")
                and not isinstance(m.node, ast.ClassDef)]

    def decorated(self) -> None:
        """Functions under a compiler's decorator, and every method of a decorated class."""
        for d in self.defs:
            for deco in d.node.decorator_list:
                how = self.comp.of(deco)
                if how is None:
                    continue
                if isinstance(d.node, ast.ClassDef):  # every method of a scripted class
                    for m in self.methods(d.qualname):
                        self.add(m, Compiled(f"@{how} on class {d.qualname}", _is_lazy(how),
                                             frozenset({self.uid(m)})))
                else:
                    self.add(d.qualname, Compiled(f"@{how}", _is_lazy(how),
                                                  frozenset({self.uid(d.qualname)})))

    def compile_calls(self) -> None:
        """What a compile call of this file compiles (``torch.compile(fn)``; a class's
        methods for ``torch.compile(Model(...))``), witnessed by the unit that calls it."""
        owners = _owners(self.defs, self.tree)
        by_name: dict[str, list[_Def]] = {}
        for d in self.defs:
            by_name.setdefault(d.node.name, []).append(d)
        instances = _instances(self.tree)
        for how, target, call, _ in _compile_sites(self.tree, self.comp, self.defs):
            if isinstance(target, ast.Call):  # torch.compile(Model(...)): the class's methods
                target = target.func
            name = target.id if isinstance(target, ast.Name) else \
                target.attr if isinstance(target, ast.Attribute) else None
            if name in instances:
                name = instances[name].rsplit(".", 1)[-1]
            site = owners.get(id(call))
            shown = ast.unparse(call.args[0]) if call.args else ast.unparse(call.func)
            for d in by_name.get(name or "", []):
                if how == MODULE_COMPILE and not isinstance(d.node, ast.ClassDef):
                    continue  # x.compile() compiles a module instance, never a function
                quals = self.methods(d.qualname) if isinstance(d.node, ast.ClassDef) \
                    else [d.qualname]
                for q in quals:
                    self.add(q, Compiled(f"{how}({shown}) at line {call.lineno}", _is_lazy(how),
                                         frozenset({self.uid(q)} |
                                                   ({self.uid(site)} if site else set()))))

    def compiled_elsewhere(self, external: dict[str, Compiled]) -> None:
        """Functions and classes of this file that another file compiles."""
        for qual, c in external.items():
            for d in (d for d in self.defs if d.qualname == qual):
                for m in (self.methods(qual) if isinstance(d.node, ast.ClassDef) else [qual]):
                    self.add(m, Compiled(c.how, c.lazy, c.witnesses | {self.uid(m)}))

    def traced_through(self) -> None:
        """Nested functions and same-file helpers a compiled body references, transitively
        (the compiler traces through them)."""
        out = self.out
        todo = list(out)
        while todo:
            qual = todo.pop()
            node = next((d.node for d in self.defs if d.qualname == qual), None)
            if node is None:
                continue
            for d in self.defs:
                if isinstance(d.node, ast.ClassDef):
                    continue
                if d.qualname.startswith(qual + ".<locals>.") or d.node.name in _referenced(node):
                    how = f"called or traced from compiled {qual} ({out[qual].how})"
                    got = Compiled(how, out[qual].lazy, out[qual].witnesses | {self.uid(d.qualname)})
                    if d.qualname not in out:
                        out[d.qualname] = got
                        todo.append(d.qualname)
                    elif not (got.witnesses <= out[d.qualname].witnesses) or \
                            (out[d.qualname].lazy and not got.lazy):
                        out[d.qualname] = out[d.qualname].join(got)
                        todo.append(d.qualname)


__all__ = ["DYNAMO_COMPILERS", "MODULE_COMPILE", "Compiled", "CompileFacts", "compile_facts",
           "compiled_units"]
