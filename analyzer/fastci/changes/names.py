"""Import-time changes resolved to the names they bind, and the units that use those names.

A module-level import or assignment acts when its module is imported, so coverage of
the module cannot say which tests depend on it, and the selector used to take every
test whose evidence touches the module. Most such edits only (re)bind a few names:
``from typing import Optional`` added, ``MAX_LEN = 512`` changed. :func:`narrow`
follows those names through the head tree to the units (functions, methods, class
bodies inside functions) that load them, in the module and in every module that
imports them (``from m import NAME``, ``m.NAME``, re-exports), so the selector can
take the tests that executed those units instead.

Module-level code that loads a changed name is followed too: a plain binding with a
side-effect-free value (``B = C * 2``, ``def f(x=C)``, a plain class body) changes the
names it binds, which are followed in turn; anything else evaluated at import time
(a call, an ``if``, a registry update, a decorator not known to be pure) gives up.

It answers None, meaning "stay module-wide, as before", whenever it cannot be sure:
an unparsable side, a change that is not only bindings, an import of a module whose
import may have side effects (anything but the standard library, unless the module
was imported already), dynamic access to a module's namespace (``globals()``,
``getattr(m, name)``, ``from m import *``, ``m.__dict__``, module ``__getattr__``,
``eval``/``exec``), dunder names, or too many files to read. Pure: sources and a
read-only view of the head tree in, a value out.
"""

from __future__ import annotations

import ast
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from fastci.changes.semantic_diff import ChangeKind, UnitChange
from fastci.changes.static_facts import (PURE_BUILTINS, Import, dotted, imports_of, module_bindings,
                                         module_imports, module_name, names_module, open_namespace,
                                         parse, pure_decorator, pure_expression,
                                         registrable_classes, resolve_dotted)
from fastci.changes.static_reach import (MAX_FILES, HeadTree, member_discoverers,
                                         member_searches)
from fastci.config import DEFAULT_PURE_CALLABLES
from fastci.types import RelPath, UnitId
from fastci.units.index import MODULE_QUALNAME, statement_key

#: The change kinds :func:`narrow` can resolve; any other kind keeps the module-wide rule.
NARROWABLE = frozenset({ChangeKind.MODULE_IMPORT, ChangeKind.MODULE_ASSIGNMENT,
                        ChangeKind.CONFIG_LITERAL})
#: Rounds of following names from module to module before giving up.
MAX_ROUNDS = 20
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) - {"__future__", "__main__"}


@dataclass(frozen=True)
class NameReach:
    """What an import-time change of some module-level names reaches.

    Attributes:
        names: the names the change (re)binds in its module, sorted.
        units: the units at head that load any of those names, directly or through
            a binding that depends on them, in any module (sorted).
        modules_wide: modules whose every test stays selected (module-wide);
            reserved, empty today: every case that needs it answers None instead.
        why: the sentence a person reads (``binds Optional, which no unit references``).
    """

    names: tuple[str, ...]
    units: tuple[UnitId, ...]
    modules_wide: tuple[RelPath, ...] = ()
    why: str = ""


def narrow(change: UnitChange, old_source: str | bytes | None, new_source: str | bytes | None,
           tree: HeadTree | None, *,
           pure: Sequence[str] = DEFAULT_PURE_CALLABLES) -> NameReach | None:
    """Resolve an import-time change of a module's top level to the units using its names.

    Args:
        change: one unit change (only ``<module>`` changes of imports and assignments
            are resolved).
        old_source: the module before the change.
        new_source: the module after the change (the head side of ``tree``).
        tree: the head tree, to find the modules that import the names.
        pure: dotted-name globs of side-effect-free callables (``Config.pure_callables``).

    Returns:
        The names and the units that reference them, or None: keep the change
        module-wide (anything that cannot be resolved safely).
    """
    if change.qualname != MODULE_QUALNAME or not change.kinds or tree is None \
            or any(k not in NARROWABLE for k in change.kinds):
        return None
    old, new = parse(old_source), parse(new_source)
    if old is None or new is None:
        return None
    names = _changed_names(change, old, new, tree, pure)
    if not names:
        return None
    walk = _Walk(tree, pure, change.path, new)
    if not walk.run({change.path: set(names)}):
        return None
    units = tuple(sorted(walk.units))
    shown = ", ".join(sorted(names))
    if not units:
        why = f"binds {shown}, which no unit references"
    else:
        files = len({u.partition("::")[0] for u in units})
        why = (f"binds {shown}, referenced by {len(units)} unit{'s' * (len(units) != 1)} "
               f"in {files} module{'s' * (files != 1)}")
    return NameReach(tuple(sorted(names)), units, (), why)


# --------------------------------------------------------------------------- the change


def _keyed(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level statements by the part key :mod:`fastci.units.index` gives them."""
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring is no part
    out: dict[str, ast.stmt] = {}
    for stmt in body:
        key = base = statement_key(stmt)
        n = 2
        while key in out:
            key = f"{base}#{n}"
            n += 1
        out[key] = stmt
    return out


def _changed_names(change: UnitChange, old: ast.Module, new: ast.Module, tree: HeadTree,
                   pure: Sequence[str]) -> set[str] | None:
    """The names the changed parts bind, or None when a part is more than a binding."""
    if not change.names:
        return None
    before, after = _keyed(old), _keyed(new)
    names: set[str] = set()
    imported: tuple[dict[str, set[str]], dict[str, set[str]]] = ({}, {})
    for key in change.names:
        prefix, _, rest = key.partition(":")
        if prefix not in ("import", "assign"):
            return None
        for i, (side, stmt) in enumerate(((old, before.get(key)), (new, after.get(key)))):
            if stmt is None:
                continue
            bound = _binding(stmt, side, pure)
            if bound is None:
                return None
            if prefix == "import":
                for name, origin in _import_origins(stmt).items():
                    imported[i].setdefault(name, set()).add(origin)
                names |= _package_attributes(stmt)
            else:
                names |= bound
        if prefix == "import" and not _imports_inert(change.path, key, before, after, old, new,
                                                     tree, pure):
            return None
    # ``from typing import List`` -> ``from typing import List, Optional`` rebinds List to
    # the same object: only Optional changed.
    names |= {n for n in set(imported[0]) | set(imported[1])
              if imported[0].get(n) != imported[1].get(n)}
    machinery = {n for n in names if n.startswith("__") and n.endswith("__")}
    if machinery and (machinery != {"__all__"} or not (_plain_all(old) and _plain_all(new))):
        return None  # __getattr__, __path__...: module machinery
    # ``__all__`` bound to strings only says what ``from m import *`` takes (and what
    # reads ``m.__all__``): a star import widens the walk and a load of ``__all__`` is
    # followed like any name, so a re-export's longer list is a binding like others.
    return names


def _package_attributes(stmt: ast.stmt) -> set[str]:
    """What an import sets besides the names it binds: importing ``pkg.utils`` (also
    through ``from pkg.utils import x``) makes ``utils`` an attribute of ``pkg``, which a
    test may read (``pkg.utils.scale``); adding or dropping the import changes it."""
    if isinstance(stmt, ast.Import):
        modules = [a.name for a in stmt.names]
    elif isinstance(stmt, ast.ImportFrom) and stmt.module:
        modules = [stmt.module]
    else:
        return set()
    return {part for m in modules for part in m.split(".")[1:]}


def _plain_all(tree: ast.Module) -> bool:
    """Whether ``tree`` binds ``__all__`` (if at all) only to lists or tuples of strings,
    at top level, with ``=`` or ``+=``."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(n, ast.Name) and n.id == "__all__" for t in targets
                   for n in ast.walk(t)):
            continue
        value = getattr(node, "value", None)
        if node not in tree.body or len(targets) != 1 or not isinstance(targets[0], ast.Name) \
                or isinstance(node, ast.AugAssign) and not isinstance(node.op, ast.Add) \
                or not isinstance(value, (ast.List, ast.Tuple)) \
                or not all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                           for e in value.elts):
            return False
    return True


def _import_origins(stmt: ast.stmt) -> dict[str, str]:
    """Bound name -> what an import statement binds it to (``from typing import List``)."""
    out: dict[str, str] = {}
    if isinstance(stmt, ast.Import):
        for a in stmt.names:
            out[(a.asname or a.name).split(".")[0]] = f"import {a.name}" + \
                (f" as {a.asname}" if a.asname else "")
    elif isinstance(stmt, ast.ImportFrom):
        for a in stmt.names:
            out[a.asname or a.name] = f"from {'.' * stmt.level}{stmt.module or ''} import {a.name}"
    return out


def _binding(stmt: ast.stmt, tree: ast.Module, pure: Sequence[str]) -> set[str] | None:
    """Names a top-level import or assignment binds; None if it does more than bind."""
    if isinstance(stmt, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.ImportFrom):
        if stmt.module == "__future__" or any(a.name == "*" for a in stmt.names):
            return None
        return {a.asname or a.name for a in stmt.names}
    return _assigned(stmt, module_imports(tree), pure, module_bindings(tree))


def _assigned(stmt: ast.AST, names: dict[str, str], pure: Sequence[str],
              bound: frozenset[str]) -> set[str] | None:
    """Names a plain assignment with a side-effect-free value binds, else None."""
    targets: list[ast.expr]
    value: ast.expr | None
    if isinstance(stmt, ast.Assign):
        targets, value = stmt.targets, stmt.value
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets, value = [stmt.target], stmt.value
    else:
        return None
    out: set[str] = set()
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif not isinstance(n, (ast.Tuple, ast.List, ast.Starred, ast.expr_context)):
                return None  # x.attr = ..., x[k] = ...: a mutation of some object
    if value is not None and not pure_expression(value, names, pure, bound):
        return None
    return out


def _imports_inert(path: RelPath, key: str, before: dict[str, ast.stmt],
                   after: dict[str, ast.stmt], old: ast.Module, new: ast.Module,
                   tree: HeadTree, pure: Sequence[str] = DEFAULT_PURE_CALLABLES) -> bool:
    """Whether an import change loads or drops no module with possible import-time effects.

    A module the other side already imports (at top level, or through the repository
    modules it imports) changes nothing when it is loaded; the standard library is
    taken as inert, and so is a repository module whose top level only defines
    (:func:`_inert_module`: a package ``__init__`` re-exporting a helper from a module
    it did not import before); anything else (a plugin that registers or patches, an
    installed package) may act on import.
    """
    loaded_old, loaded_new = _loaded(path, old, tree), _loaded(path, new, tree)
    for stmt, other in ((after.get(key), loaded_old), (before.get(key), loaded_new)):
        if stmt is None:
            continue
        added = _loaded(path, ast.Module(body=[stmt], type_ignores=[]), tree) - other
        if not added:
            continue
        repo = _RepoModules(tree)
        own = module_name(path).split(".")  # the module and its packages: loaded already
        already = _closure(other | {".".join(own[:i]) for i in range(1, len(own) + 1)},
                           tree, repo, path)
        for mod in added - already:
            if mod.lstrip("?").split(".")[0] not in _STDLIB \
                    and not _inert_module(mod, tree, repo, pure, already, set(),
                                          (module_name(path),)):
                return False
    return True


#: Repository modules read to decide whether an import is inert (beyond: not inert).
MAX_INERT_MODULES = 50


class _RepoModules:
    """The head tree's Python files by the last component of their module name."""

    def __init__(self, tree: HeadTree) -> None:
        self.by_last: dict[str, list[tuple[str, RelPath]]] = {}
        for p in tree.files(""):
            full = module_name(p) if p.endswith(".py") else ""
            if full:
                self.by_last.setdefault(full.rsplit(".", 1)[-1], []).append((full, p))

    def file(self, dotted_name: str) -> RelPath | None:
        """The file of module ``dotted_name`` (matched by suffix), if exactly one."""
        name = dotted_name.lstrip("?")
        found = [p for full, p in self.by_last.get(name.rsplit(".", 1)[-1], ())
                 if names_module(full, name)]
        return found[0] if len(found) == 1 else None


def _closure(loaded: set[str], tree: HeadTree, repo: _RepoModules, changed: RelPath) -> set[str]:
    """``loaded`` and what the repository modules among them load at top level, transitively
    (the changed module's loads are ``loaded``: its head side is what is being judged).

    Other modules are read at head. One that newly loads a module in the same change is
    a change of its own: judged the same way, it is module-wide unless that load is
    inert, and every test that imported the changed module executed its body too.
    """
    out = set(loaded)
    todo = sorted(loaded)
    while todo and len(out) < 10 * MAX_INERT_MODULES:
        path = repo.file(todo.pop())
        parsed = tree.tree(path) if path is not None and path != changed else None
        if path is None or parsed is None:
            continue
        for mod in _loaded(path, parsed, tree) - out:
            out.add(mod)
            todo.append(mod)
    return out


def _inert_module(mod: str, tree: HeadTree, repo: _RepoModules, pure: Sequence[str],
                  already: set[str], seen: set[str], partial: tuple[str, ...]) -> bool:
    """Whether importing repository module ``mod`` only binds names: its top level holds
    a docstring, defs and plain classes with pure decorators and defaults, assignments of
    side-effect-free values, and imports of the standard library, of modules loaded
    already, or of modules inert in turn. Anything else, or a module outside the
    repository, may act on import. ``partial``: modules being imported when ``mod`` is
    (the changed module, then each module on the way): importing from one of them is a
    cycle, which may fail (a name not bound yet), so it is not inert."""
    if mod in seen:
        return True  # an import cycle: judged where it started
    if len(seen) >= MAX_INERT_MODULES:
        return False
    path = repo.file(mod)
    parsed = tree.tree(path) if path is not None else None
    if path is None or parsed is None or open_namespace(parsed) is not None:
        return False
    seen.add(mod)
    partial = (*partial, module_name(path))
    aliases, bound = module_imports(parsed), module_bindings(parsed)
    walk = _Walk(tree, pure, path, parsed)
    for i, stmt in enumerate(parsed.body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and i == 0:
            continue  # the docstring
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            if isinstance(stmt, ast.ImportFrom) and (
                    stmt.module == "__future__" or any(a.name == "*" for a in stmt.names)):
                if stmt.module == "__future__":
                    continue
                return False
            if any(names_module(full, imp.module) for imp in imports_of(
                    ast.Module(body=[stmt], type_ignores=[]), path) for full in partial):
                return False  # reads a module still being imported: a cycle may fail
            for sub in _loaded(path, ast.Module(body=[stmt], type_ignores=[]), tree) - already:
                if sub.lstrip("?").split(".")[0] not in _STDLIB \
                        and not _inert_module(sub, tree, repo, pure, already, seen, partial):
                    return False
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not all(pure_decorator(d, aliases, pure, bound) for d in stmt.decorator_list) \
                    or not all(pure_expression(d, aliases, pure, bound)
                               for d in [*stmt.args.defaults, *stmt.args.kw_defaults] if d):
                return False
        elif isinstance(stmt, ast.ClassDef):
            if not walk._plain_class(stmt, parsed, aliases, bound):
                return False
        elif _assigned(stmt, aliases, pure, bound) is None:
            return False  # a call, an if, a loop, a registry update...
    return True


def _loaded(path: RelPath, tree: ast.Module, tree_: HeadTree) -> set[str]:
    """Modules the top-level, unconditional imports of ``tree`` load (``?``: maybe a module)."""
    top = ast.Module(body=[s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))],
                     type_ignores=[])
    out: set[str] = set()
    for imp in imports_of(top, path):
        parts = imp.module.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        if imp.name and imp.name != "*" and parts[0] not in _STDLIB:
            sub = f"{imp.module}.{imp.name}"
            # ``from pkg import x`` loads pkg/x.py when x is a submodule: known for the
            # repository's own packages, unknown (so assumed) for installed ones.
            if _repo_has(tree_, sub) or not _repo_has(tree_, imp.module):
                out.add(f"?{sub}")
    return out


def _repo_has(tree: HeadTree, dotted_name: str) -> bool:
    return any(names_module(module_name(p), dotted_name) for p in tree.files("")
               if p.endswith(".py"))


# --------------------------------------------------------------------------- the walk


@dataclass
class _Walk:
    """Follows changed names from module to module over the head tree."""

    tree: HeadTree
    pure: Sequence[str]
    origin: RelPath
    origin_tree: ast.Module
    units: set[UnitId] = field(default_factory=set)
    changed: dict[RelPath, set[str]] = field(default_factory=dict)
    _checked: set[RelPath] = field(default_factory=set)
    _components: frozenset[str] | None = None

    def run(self, start: dict[RelPath, set[str]]) -> bool:
        """Fill :attr:`units`; False when anything cannot be resolved (widen)."""
        self.changed = {k: set(v) for k, v in start.items()}
        # The first round's searches (who lists a changed module's members, who names a
        # changed name, who imports its module), side by side.
        self.tree.grep_each(*self._words(),
                            *(s for mod in sorted(self.changed) if module_name(mod)
                              for s in member_searches(mod)))
        for _ in range(MAX_ROUNDS):
            size = sum(len(v) for v in self.changed.values())
            for mod in sorted(self.changed):
                if mod not in self._checked:
                    if not self._closed(mod):
                        return False
                    self._checked.add(mod)
            files = sorted(self._candidates() | set(self.changed))
            if len(files) > MAX_FILES:
                return False
            for path in files:
                parsed = self._parse(path)
                if parsed is None:
                    return False
                if not self._scan(path, parsed):
                    return False
            if sum(len(v) for v in self.changed.values()) == size:
                return True
        return False

    def _candidates(self) -> set[RelPath]:
        """Files that name a changed name *and* can import a changed module.

        A file loads a changed name through an import of its module (absolute or
        relative: the text holds the module's last component), through a module that
        re-exports it (which joins :attr:`changed` and its name is searched next round),
        or, for a package's ``__init__``, through a relative import from inside the
        package (``from . import NAME``), so every file below it counts. A file that
        only mentions the name (another module's ``NAME``, a string) is not read.
        """
        words, modules = self._words()
        found, importing = self.tree.grep_each(words, modules)
        naming = set(found)
        if not naming:
            return set()
        out = naming & set(importing) if modules else set()
        for path in self.changed:
            if posixpath.basename(path) == "__init__.py" or not module_name(path):
                folder = posixpath.dirname(path)
                out |= {p for p in naming if not folder or p.startswith(f"{folder}/")}
        return out

    def _words(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The changed names, and the last components of their modules' names."""
        words = tuple(sorted({n for v in self.changed.values() for n in v}))
        modules = tuple(sorted({module_name(p).rsplit(".", 1)[-1] for p in self.changed}
                               - {""}))
        return words, modules

    def _parse(self, path: RelPath) -> ast.Module | None:
        return self.origin_tree if path == self.origin else self.tree.tree(path)

    def _closed(self, path: RelPath) -> bool:
        """Whether nobody reads ``path``'s namespace dynamically (itself or its importers)."""
        parsed = self._parse(path)
        if parsed is None or open_namespace(parsed) is not None:
            return False
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in ("eval", "exec", "vars", "locals") for n in ast.walk(parsed)):
            return False
        return not any(True for _ in member_discoverers(self.tree, path))

    def _repo_component(self, head: str) -> bool:
        if self._components is None:
            parts: set[str] = set()
            for p in self.tree.files(""):
                if p.endswith(".py"):
                    parts.update(module_name(p).split("."))
            self._components = frozenset(parts)
        return head in self._components

    def _scan(self, path: RelPath, parsed: ast.Module) -> bool:
        """Add the units of ``path`` that load a changed name; False to widen."""
        imports = list(self.tree.imports(path)) if path != self.origin \
            else imports_of(parsed, path)
        local, relates = self._locals(path, imports)
        if local is None:
            return False
        attrs = {n for v in self.changed.values() for n in v}
        aliases = module_imports(parsed)
        changed_mods = [module_name(p) for p in self.changed]

        def loads(node: ast.AST) -> bool:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                return node.id in local
            if isinstance(node, ast.Attribute) and node.attr in attrs:
                return self._may_be_changed(node.value, aliases, changed_mods, relates)
            if isinstance(node, ast.Call) and dotted(node.func) in ("getattr", "hasattr") \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value in attrs:
                return self._may_be_changed(node.args[0], aliases, changed_mods, relates)
            return False

        finder = _Finder(loads)
        finder.visit_body(parsed.body)
        for owner, top in finder.hits:
            if top is None:
                self.units.add(f"{path}::{owner}")
                continue
            bound = self._import_time(path, parsed, top, finder)
            if bound is None:
                return False
            self.changed.setdefault(path, set()).update(bound)
        # ``from m import NAME`` at top level re-exports NAME: importers of this module
        # that take it from here are followed too.
        for stmt in parsed.body:
            if isinstance(stmt, ast.ImportFrom):
                for a in stmt.names:
                    if (a.asname or a.name) in local and a.name != "*":
                        self.changed.setdefault(path, set()).add(a.asname or a.name)
        return True

    def _locals(self, path: RelPath, imports: Iterable[Import]) -> tuple[set[str] | None, bool]:
        """Local names bound to a changed name, and whether ``path`` imports a changed module."""
        local = set(self.changed.get(path, ()))
        relates = path in self.changed
        for imp in imports:
            for mod, names in self.changed.items():
                full = module_name(mod)
                if imp.name == "*" and names_module(full, imp.module):
                    return None, True
                if imp.name and names_module(full, imp.module):
                    relates = True
                    if imp.name in names and imp.ref:
                        local.add(imp.ref)
                elif any(names_module(full, t) for t in imp.targets()[-1:]):
                    relates = True
        return local, relates

    def _may_be_changed(self, base: ast.AST, aliases: dict[str, str], changed_mods: list[str],
                        relates: bool) -> bool:
        """Whether ``base.NAME`` may read a changed module's NAME."""
        resolved = resolve_dotted(base, aliases)
        if resolved is None:
            # A local, a parameter, self, a call: only in a module that imports a
            # changed one can it hold that module (or an object it made).
            return relates
        if any(names_module(full, resolved) for full in changed_mods):
            return True
        # ``typing.Optional``, ``torch.float16``: another package's name, not ours.
        return self._repo_component(resolved.lstrip(".").split(".")[0]) or resolved.startswith(".")

    def _import_time(self, path: RelPath, parsed: ast.Module, top: ast.stmt,
                     finder: _Finder) -> set[str] | None:
        """A load of a changed name that runs at import: the names it rebinds, or None."""
        aliases, bound = module_imports(parsed), module_bindings(parsed)
        if isinstance(top, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return _assigned(top, aliases, self.pure, bound)
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not all(pure_decorator(d, aliases, self.pure, bound) for d in top.decorator_list) \
                    or not all(pure_expression(d, aliases, self.pure, bound)
                               for d in [*top.args.defaults, *top.args.kw_defaults] if d):
                return None
            self.units.add(f"{path}::{top.name}")
            return {top.name}
        if isinstance(top, ast.ClassDef):
            if not self._plain_class(top, parsed, aliases, bound) \
                    or any(finder.loads(e) for b in [*top.bases, *top.keywords]
                           for e in ast.walk(b)):
                return None
            # The class's attributes changed: every unit in it may read them.
            self.units.update(f"{path}::{q}" for q in finder.defs
                              if q.startswith(f"{top.name}."))
            return {top.name}
        return None  # a call, an if, a loop, a registry update...

    def _plain_class(self, node: ast.ClassDef, parsed: ast.Module, aliases: dict[str, str],
                     bound: frozenset[str]) -> bool:
        """A class whose body only binds, with pure decorators and no registering base."""
        if node.name in registrable_classes(parsed) or node.keywords:
            return False
        if not all(pure_decorator(d, aliases, self.pure, bound) for d in node.decorator_list):
            return False
        if any(resolve_dotted(b, aliases, bound) not in PURE_BUILTINS | {"object"}
               for b in node.bases):
            return False
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not all(pure_decorator(d, aliases, self.pure, bound)
                           for d in stmt.decorator_list) \
                        or not all(pure_expression(d, aliases, self.pure, bound)
                                   for d in [*stmt.args.defaults, *stmt.args.kw_defaults] if d):
                    return False
            elif isinstance(stmt, ast.ClassDef):
                if not self._plain_class(stmt, parsed, aliases, bound):
                    return False
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            elif isinstance(stmt, ast.Pass):
                continue
            elif _assigned(stmt, aliases, self.pure, bound) is None:
                return False
        return True


class _Finder:
    """Walks a module once: the unit owning each matching load, and every def's qualname.

    ``hits`` holds ``(owner qualname, None)`` for a load inside a function (its unit
    runs when called) and ``(owner, top-level statement)`` for a load that runs at
    import time (module level or a class body outside any function).
    """

    def __init__(self, loads: Callable[[ast.AST], bool]) -> None:
        self.loads = loads
        self.hits: list[tuple[str, ast.stmt | None]] = []
        self.defs: list[str] = []

    def visit_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if _main_guard(stmt):
                # Runs only when the file is the program: its module unit, not an import.
                assert isinstance(stmt, ast.If)
                for s in stmt.body:
                    self._visit(s, MODULE_QUALNAME, "", None)
                for s in stmt.orelse:
                    self._visit(s, MODULE_QUALNAME, "", stmt)
                continue
            self._visit(stmt, MODULE_QUALNAME, "", stmt)

    def _visit(self, node: ast.AST, owner: str, prefix: str, top: ast.stmt | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            header: list[ast.AST] = list(node.decorator_list)
            if isinstance(node, ast.ClassDef):
                header += [*node.bases, *node.keywords]
            else:
                header += [node.args] + ([node.returns] if node.returns else [])
            for h in header:  # evaluated where the def statement runs
                self._visit(h, owner, prefix, top)
            qual = prefix + node.name
            self.defs.append(qual)
            if isinstance(node, ast.ClassDef):  # the body runs now, in the enclosing frame's time
                for s in node.body:
                    self._visit(s, qual, f"{qual}.", top)
            else:  # the body runs when called: its own unit, at call time
                for s in node.body:
                    self._visit(s, qual, f"{qual}.<locals>.", None)
            return
        if self.loads(node):
            self.hits.append((owner, top))
        for child in ast.iter_child_nodes(node):
            self._visit(child, owner, prefix, top)


def _main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":``."""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    t = stmt.test
    sides = [t.left, *t.comparators]
    return len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) \
        and any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) \
        and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)


__all__ = ["NameReach", "narrow", "NARROWABLE"]
