"""What a change did to the code, unit by unit (pure: sources in, values out).

:func:`diff_sources` compares a file's old and new source through the unit index
(:mod:`fastci.units.index`): units whose semantic checksum differs are changed, and the
differing *parts* say the kind of change (function body, signature/defaults,
decorator, class attribute, module-level assignment/import, config literal, new,
deleted or renamed unit). Comment, docstring and formatting edits leave every
checksum alone, so they change nothing. A file that does not parse is reported as
such; the selector widens for it. A function body change also says whether it inserts,
removes or changes control flow (``UnitChange.control``,
:mod:`fastci.changes.control_flow`), which reduction cannot prove by retention.

Reading revisions and the evidence store happens in :mod:`fastci.changes.scan`.
"""

from __future__ import annotations

import ast
import builtins
import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from fastci.config import DEFAULT_PURE_CALLABLES
from fastci.types import Checksum, RelPath, UnitId
from fastci.changes.control_flow import Spans, control_changes
from fastci.changes.fast_diff import quick_diff
from fastci.changes.compiled_code import Compiled, compiled_units
from fastci.changes.static_facts import (module_bindings, module_imports,
                                         open_namespace, pure_decorator, registrable_classes,
                                         resolve_dotted)
from fastci.units.index import (MODULE_QUALNAME, FileUnits, ParseFailure, Unit, UnitKind,
                                index_source, unit_id)


class ChangeKind(enum.Enum):
    """The kind of a unit's change; the value is the sentence a person reads."""

    BODY = "function body changed"
    DOCTEST = "doctest in its docstring changed"
    SIGNATURE = "signature or defaults changed"
    DECORATOR = "decorator changed"
    CLASS_HEADER = "class bases or decorators changed"
    CLASS_ATTRIBUTE = "class attribute changed"
    CLASS_METHODS = "methods added, removed or redecorated in the class body"
    MODULE_ASSIGNMENT = "module-level constant or assignment changed"
    MODULE_IMPORT = "module-level import changed"
    MODULE_STATEMENT = "module-level statement changed"
    MODULE_DEFINITIONS = "module-level definitions removed, renamed or redecorated"
    CONFIG_LITERAL = "config literal or registry changed"
    ADDED = "new unit"
    DELETED = "unit deleted"
    RENAMED = "unit renamed or moved"
    STALE = "differs from the checksum recorded in the evidence"
    COMPILED = ("compiled or traced code changed (it never produces Python line events, so "
                "no evidence records which tests run it)")
    NEW_NAME_DYNAMIC = "new module-level name in a module whose namespace is read dynamically"
    NEW_SUBCLASS = "new class whose base or metaclass may register it when it is defined"


#: Kinds whose effect happens when the module is imported or the class is defined,
#: where coverage of the unit cannot see every test that depends on it.
IMPORT_TIME_KINDS = frozenset({
    ChangeKind.SIGNATURE, ChangeKind.DECORATOR, ChangeKind.CLASS_HEADER,
    ChangeKind.CLASS_ATTRIBUTE, ChangeKind.CLASS_METHODS, ChangeKind.MODULE_ASSIGNMENT,
    ChangeKind.MODULE_IMPORT, ChangeKind.MODULE_STATEMENT, ChangeKind.MODULE_DEFINITIONS,
    ChangeKind.CONFIG_LITERAL, ChangeKind.DELETED, ChangeKind.RENAMED, ChangeKind.STALE,
    ChangeKind.NEW_NAME_DYNAMIC, ChangeKind.NEW_SUBCLASS,
})


@dataclass(frozen=True)
class UnitChange:
    """One unit that changed, with the kinds of change and the names it touched."""

    unit: UnitId
    path: RelPath
    qualname: str
    kinds: tuple[ChangeKind, ...]
    names: tuple[str, ...] = ()  # part keys that differ, e.g. ``assign:MAX_LEN``
    before: Checksum | None = None
    after: Checksum | None = None
    renamed_to: UnitId | None = None
    detail: str | None = None  # why a COMPILED / NEW_* kind applies (``@triton.jit``)
    #: A function body change that inserts, removes or changes control flow: what it did
    #: (:mod:`fastci.changes.control_flow`; reduction cannot prove it by retention).
    control: str | None = None

    @property
    def import_time(self) -> bool:
        """Whether the change acts at import/definition time (static widening applies)."""
        return any(k in IMPORT_TIME_KINDS for k in self.kinds)

    def describe(self) -> str:
        """A one-line description: ``path::qual: function body changed``."""
        text = "; ".join(k.value for k in self.kinds)
        names = [n.split(":", 1)[-1] for n in self.names if not n.startswith("stmt:")]
        if names:
            text += f" ({', '.join(names)})"
        if self.renamed_to:
            text += f" -> {self.renamed_to}"
        if self.detail:
            text += f" [{self.detail}]"
        return f"{self.unit}: {text}"


@dataclass(frozen=True)
class FileDiff:
    """The semantic diff of one Python file."""

    path: RelPath
    status: str  # git status: A, D, M, R
    old_path: RelPath | None = None
    units: tuple[UnitChange, ...] = ()
    failure: str | None = None  # set when the new (or old) source does not parse
    current: FileUnits | None = field(default=None, repr=False, compare=False)


def _literal(node: ast.AST | None) -> bool:
    """Whether ``node`` is a literal: constants and containers of literals."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is None or _literal(k) for k in node.keys) and all(_literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in {"dict", "field", "frozenset", "tuple", "set"}:
        return all(_literal(a) for a in node.args) and all(_literal(k.value) for k in node.keywords
                                                           if k.arg != "default_factory")
    return False


@dataclass(frozen=True)
class ScopeFacts:
    """Syntax facts about one scope (module or class body) that checksums do not say."""

    literals: frozenset[str] = frozenset()  # names bound to config literals
    decorated: frozenset[str] = frozenset()  # defs/classes with a decorator not known pure
    open: str | None = None  # why any new name in this module matters (star import...)
    registrable: tuple[tuple[str, str], ...] = ()  # (class name, why it may register itself)
    test_class: bool = False  # a class where a new ``test*`` method overrides nothing


#: Bases a class may have and still take a new ``test*`` method as a new unit: they
#: define no attribute whose name starts with ``test``.
_TEST_BASES = frozenset({"object", "unittest.TestCase", "unittest.IsolatedAsyncioTestCase"})
#: Module-level functions that test frameworks call without any reference to them
#: (xunit-style setup, ``load_tests``, pytest hooks), so a new one changes existing tests.
_IMPLICIT_HOOKS = frozenset({"setup_module", "teardown_module", "setup_function",
                             "teardown_function", "setup", "teardown", "setUpModule",
                             "tearDownModule", "load_tests"})


def _implicit(name: str) -> bool:
    """Whether a module-level def of this name is called by a framework or the import system."""
    return name in _IMPLICIT_HOOKS or name.startswith("pytest_") \
        or (name.startswith("__") and name.endswith("__"))


def scope_facts(source: bytes | None, *,
                pure: Sequence[str] = DEFAULT_PURE_CALLABLES) -> dict[str, ScopeFacts]:
    """Per scope qualname (module or class), the config-literal names and decorated defs.

    A config literal is a name bound to a literal table (dict, list, tuple, set of
    constants: registries, presets) or any field of a ``@dataclass`` class (its
    defaults are configuration). A def counts as decorated unless every decorator
    is pure (:func:`fastci.changes.static_facts.pure_decorator` with ``pure``).
    """
    out: dict[str, ScopeFacts] = {}
    if source is None:
        return out
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return out
    names, bound = module_imports(tree), module_bindings(tree)

    def pure_decorators(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        return all(pure_decorator(d, names, pure, bound) for d in node.decorator_list)

    def scan(body: list[ast.stmt], scope: str, dataclass_: bool, test_class: bool) -> None:
        literals: set[str] = set()
        decorated: set[str] = set()
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if dataclass_ or (isinstance(stmt.value, (ast.Dict, ast.List, ast.Set, ast.Tuple,
                                                          ast.Call))
                                  and _literal(stmt.value)):
                    literals.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                if not pure_decorators(stmt):
                    decorated.add(stmt.name)
                if isinstance(stmt, ast.ClassDef):
                    is_dc = any("dataclass" in ast.unparse(d) for d in stmt.decorator_list)
                    inner = stmt.name if scope == MODULE_QUALNAME else f"{scope}.{stmt.name}"
                    bases = [resolve_dotted(b, names, bound) for b in stmt.bases]
                    plain = not stmt.keywords and pure_decorators(stmt) \
                        and all(b in _TEST_BASES for b in bases)
                    scan(stmt.body, inner, is_dc, plain)
        out[scope] = ScopeFacts(frozenset(literals), frozenset(decorated), test_class=test_class)

    scan(tree.body, MODULE_QUALNAME, False, False)
    # New names that act without being called (static_facts): module scope only, since in
    # a class every new method already counts.
    module = out[MODULE_QUALNAME]
    out[MODULE_QUALNAME] = ScopeFacts(module.literals, module.decorated, open_namespace(tree),
                                      tuple((q, why) for q, why in registrable_classes(tree).items()
                                            if "." not in q))
    return out


def _part_kinds(unit: Unit, old: dict[str, Checksum], new: dict[str, Checksum],
                facts: ScopeFacts) -> tuple[list[ChangeKind], list[str], str | None]:
    kinds: list[ChangeKind] = []
    keys: list[str] = []
    detail: str | None = None
    in_class = unit.kind == UnitKind.CLASS
    for key in sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)):
        prefix, _, names = key.partition(":")
        bound = set(names.split("#")[0].split(","))
        if key == "doctest":
            # The docstring's examples changed: not an import-time change, and not a body
            # change either (line evidence cannot speak for docstring lines).
            kind = ChangeKind.DOCTEST
        elif unit.kind == UnitKind.FUNCTION:
            kind = {"body": ChangeKind.BODY, "signature": ChangeKind.SIGNATURE,
                    "decorators": ChangeKind.DECORATOR}.get(key, ChangeKind.BODY)
        elif prefix == "header":
            kind = ChangeKind.CLASS_HEADER
        elif prefix in ("def", "class"):
            new_name = key not in old and not bound & facts.decorated \
                and not bound & (_bound_before(old) | _BUILTINS)
            if new_name and in_class and facts.test_class and prefix == "def" \
                    and all(n.startswith("test") for n in bound):
                # A new test method (no decorator, or only pure ones) in a class whose
                # bases define no test* name: it overrides nothing and acts only when
                # called, so it is a new unit (ADDED), and a new test.
                continue
            if new_name and unit.kind == UnitKind.MODULE and not any(map(_implicit, bound)):
                # A plain new function or class shadowing nothing: its own unit is ADDED and
                # whatever calls it changed too. (In a class, a new method may override a
                # base class's, so it always counts.) Unless the name acts without a call:
                # a class its base or metaclass registers, or a name that a star import,
                # module __getattr__ or a globals() lookup makes visible.
                registers = dict(facts.registrable)
                hit = sorted(bound & set(registers)) if prefix == "class" else []
                if hit:
                    kind, detail = ChangeKind.NEW_SUBCLASS, f"{hit[0]}: {registers[hit[0]]}"
                elif facts.open:
                    kind, detail = ChangeKind.NEW_NAME_DYNAMIC, facts.open
                else:
                    continue
                keys.append(key)
                if kind not in kinds:
                    kinds.append(kind)
                continue
            kind = ChangeKind.CLASS_METHODS if in_class else ChangeKind.MODULE_DEFINITIONS
        elif prefix == "assign" and bound & facts.literals:
            kind = ChangeKind.CONFIG_LITERAL
        elif prefix == "assign":
            kind = ChangeKind.CLASS_ATTRIBUTE if in_class else ChangeKind.MODULE_ASSIGNMENT
        elif prefix == "import":
            kind = ChangeKind.MODULE_IMPORT
        else:
            kind = ChangeKind.CLASS_ATTRIBUTE if in_class else ChangeKind.MODULE_STATEMENT
        keys.append(key)
        if kind not in kinds:
            kinds.append(kind)
    return kinds, keys, detail


_BUILTINS = frozenset(dir(builtins))


def _bound_before(parts: dict[str, Checksum]) -> set[str]:
    """Names a scope bound before the change (from its part keys)."""
    names: set[str] = set()
    for key in parts:
        prefix, _, rest = key.partition(":")
        if prefix != "stmt":
            names.update(n.rsplit(".", 1)[-1] for n in rest.split("#")[0].split(","))
    return names


def _merge(a: ScopeFacts | None, b: ScopeFacts | None) -> ScopeFacts:
    a, b = a or ScopeFacts(), b or ScopeFacts()
    return ScopeFacts(a.literals | b.literals, a.decorated | b.decorated, b.open or a.open,
                      tuple(sorted(set(a.registrable) | set(b.registrable))),
                      a.test_class and b.test_class)


def diff_units(path: RelPath, old: FileUnits | None, new: FileUnits | None,
               old_source: bytes | None = None, new_source: bytes | None = None, *,
               pure: Sequence[str] = DEFAULT_PURE_CALLABLES) -> list[UnitChange]:
    """Compare two indexes of one file (either may be None for added/deleted files).

    ``pure`` names the decorators a new def may carry and still be only a new unit
    (the ``pure_callables`` key of ``fastci.yaml``).
    """
    old_units = old.by_qualname() if old else {}
    new_units = new.by_qualname() if new else {}
    facts_old = scope_facts(old_source, pure=pure)
    facts_new = scope_facts(new_source, pure=pure)
    changes: list[UnitChange] = []
    added = [q for q in new_units if q not in old_units]
    deleted = [q for q in old_units if q not in new_units]
    by_checksum = {new_units[q].checksum: q for q in added if q != MODULE_QUALNAME}
    old_ids = {q: u.id for q, u in old_units.items()}
    for qual in sorted(set(old_units) & set(new_units)):
        o, n = old_units[qual], new_units[qual]
        if o.checksum == n.checksum and o.id == n.id:
            continue
        if o.checksum == n.checksum:  # same code, new path (file renamed)
            changes.append(UnitChange(o.id, o.path, qual, (ChangeKind.RENAMED,), (), o.checksum,
                                      n.checksum, renamed_to=n.id))
            continue
        facts = _merge(facts_old.get(qual), facts_new.get(qual))
        kinds, keys, detail = _part_kinds(n, o.parts_dict, n.parts_dict, facts)
        if not kinds:  # only plain new definitions: their units are reported as ADDED
            continue
        changes.append(UnitChange(n.id, path, qual, tuple(kinds), tuple(keys), o.checksum,
                                  n.checksum, detail=detail))
        if o.id != n.id:
            changes.append(UnitChange(o.id, o.path, qual, (ChangeKind.RENAMED,), (), o.checksum,
                                      n.checksum, renamed_to=n.id))
    for qual in deleted:
        o = old_units[qual]
        target = by_checksum.get(o.checksum)
        if target is not None:
            changes.append(UnitChange(old_ids[qual], o.path, qual, (ChangeKind.RENAMED,), (),
                                      o.checksum, o.checksum, renamed_to=new_units[target].id))
        else:
            changes.append(UnitChange(o.id, o.path, qual, (ChangeKind.DELETED,), (), o.checksum, None))
    for qual in added:
        n = new_units[qual]
        changes.append(UnitChange(n.id, path, qual, (ChangeKind.ADDED,), (), None, n.checksum))
    return changes


def diff_sources(path: RelPath, old: bytes | None, new: bytes | None, *, status: str = "M",
                 old_path: RelPath | None = None, quick: bool = True,
                 pure: Sequence[str] = DEFAULT_PURE_CALLABLES,
                 compiles: CompileContext | None = None) -> FileDiff:
    """Semantic diff of one Python file between two sources (None = absent).

    With ``quick``, a modified file whose units kept their names is diffed by
    re-hashing only the units whose text changed (:mod:`fastci.changes.fast_diff`); the
    result then has no ``current`` index (callers index the file if they need it).
    ``pure``: dotted-name globs of decorators with no import-time side effect
    (``Config.pure_callables``): a new def decorated only with them, shadowing
    nothing, is reported as ADDED alone, not as a change of its module or class.
    ``compiles``: what other files say about compiling this file's code (wrappers,
    compiled classes), asked only when a function changed.
    """
    if quick and old is not None and new is not None and not old_path:
        pairs = quick_diff(path, old, new)
        if pairs is not None:
            spans = {n.qualname: ((o.start, o.end), (n.start, n.end)) for o, n in pairs}
            return FileDiff(path, status, None, _mark_control(
                _mark_compiled(_pair_changes(path, pairs, old, new, pure), old, new, compiles),
                old, new, spans))
    old_rel = old_path or path
    old_idx = index_source(old_rel, old) if old is not None else None
    new_idx = index_source(path, new) if new is not None else None
    if isinstance(new_idx, ParseFailure):
        return FileDiff(path, status, old_path, failure=new_idx.message)
    if isinstance(old_idx, ParseFailure):
        # The old side never parsed, so nothing recorded can be compared part by part:
        # every unit of the new file counts as changed.
        units = tuple(UnitChange(u.id, path, u.qualname, (ChangeKind.STALE,), (), None, u.checksum)
                      for u in (new_idx.units if new_idx else ()))
        return FileDiff(path, status, old_path, units, current=new_idx)
    changes = diff_units(path, old_idx, new_idx, old, new, pure=pure)
    return FileDiff(path, status, old_path, _mark_control(_mark_compiled(changes, old, new, compiles), old, new),
                    current=new_idx)


def _mark_control(changes: tuple[UnitChange, ...], old: bytes | None, new: bytes | None,
                  spans: Spans | None = None) -> tuple[UnitChange, ...]:
    """Set ``control`` on the function body changes that insert, remove or change control
    flow (only when some function body changed; ``spans``: where each function is on both
    sides, so it is parsed alone)."""
    body = {u.qualname for u in changes if ChangeKind.BODY in u.kinds}
    if not body or old is None or new is None:
        return changes
    found = control_changes(old, new, body, spans)
    return tuple(replace(u, control=found[u.qualname])
                 if u.qualname in found and ChangeKind.BODY in u.kinds else u for u in changes)


#: What other files say about compiling a file's code (compile wrappers it may use, its
#: functions they compile): :func:`fastci.changes.static_reach.compile_context`.
CompileContext = Callable[[RelPath], tuple[dict[str, str], dict[str, Compiled]]]


def _mark_compiled(changes: list[UnitChange], old: bytes | None, new: bytes | None,
                   context: CompileContext | None = None) -> tuple[UnitChange, ...]:
    """Add COMPILED to changed functions that a compiler traces (either side of the diff)."""
    kept = {ChangeKind.ADDED, ChangeKind.DELETED, ChangeKind.RENAMED}
    if not any(u.qualname != MODULE_QUALNAME and not kept & set(u.kinds) for u in changes):
        return tuple(changes)
    path = changes[0].path
    wrappers, external = context(path) if context is not None else ({}, {})
    compiled = compiled_units(old, path, wrappers=wrappers, external=external)
    for qual, c in compiled_units(new, path, wrappers=wrappers, external=external).items():
        compiled[qual] = compiled[qual].join(c) if qual in compiled else c
    return tuple(replace(u, kinds=u.kinds + (ChangeKind.COMPILED,),
                         detail=compiled[u.qualname].how)
                 if u.qualname in compiled and not kept & set(u.kinds) else u for u in changes)


def _pair_changes(path: RelPath, pairs: list[tuple[Unit, Unit]], old: bytes,
                  new: bytes, pure: Sequence[str]) -> list[UnitChange]:
    if not pairs:
        return []
    scoped = any(n.kind != UnitKind.FUNCTION for _, n in pairs)  # only scopes use the syntax facts
    facts_old, facts_new = (scope_facts(old, pure=pure), scope_facts(new, pure=pure)) \
        if scoped else ({}, {})
    out = []
    for o, n in pairs:
        facts = _merge(facts_old.get(n.qualname), facts_new.get(n.qualname))
        kinds, keys, detail = _part_kinds(n, o.parts_dict, n.parts_dict, facts)
        if kinds:
            out.append(UnitChange(n.id, path, n.qualname, tuple(kinds), tuple(keys), o.checksum,
                                  n.checksum, detail=detail))
    return out


__all__ = ["ChangeKind", "UnitChange", "FileDiff", "diff_sources", "diff_units",
           "scope_facts", "ScopeFacts", "unit_id", "IMPORT_TIME_KINDS"]
