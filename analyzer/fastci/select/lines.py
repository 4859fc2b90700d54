"""Line granularity (``granularity: line``): a test that entered a changed function but
ran none of its changed code is not affected by the change.

Selection by units takes every test whose evidence executed a changed function. With
line evidence (the executed lines of each file, recorded by ``fastci calibrate`` at the
test's full workload, :mod:`fastci.evidence.store.calibrations`) a body change can be narrowed
further. A run of the old version behaves exactly like a run of the new one until
control first reaches code that differs; :func:`reach_lines` gives, in the old version's
line numbers, lines at least one of which every run reaching the changed code executes:

* a replaced or deleted statement: its own lines (every statement that runs produces a
  line event inside its range); a change inside a compound statement's header or
  between its clauses (``elif``/``else``/``except``): every line of that statement;
* an insertion (or a replaced statement that compiles to nothing, such as a string
  constant): the code before it in its block, i.e. every line of the innermost
  enclosing statement, or at a function's top level every line of the statement just
  before it (control reaches the insertion only by finishing that statement); an
  insertion before a function's first statement reaches every run of the function.

Only a change of kind ``function body changed`` (for that test's own version of the
file) is narrowed: signatures, defaults, decorators, class and module bodies act at
definition or import time and stay unit- or module-wide. Anything this module cannot
read (a merged unit, a change touching the ``def`` lines, an unparsable side) answers
a reason instead of lines, and the test stays selected. So does an edit that acts
beyond its lines when compiled (:func:`_scope_change`: a new binding of a name the
function read as a global, ``global``/``nonlocal``, a ``yield``). A repository whose
Python text names a compiler or tracer (:data:`COMPILER_MARKERS`) gets no line
facts at all: compiled frames produce no line events.

:func:`line_facts` reads it for a selection (also for prioritization: a test that ran
changed lines is likelier to fail) and :func:`narrow_by_lines` applies it: every
reason of a selected test must be such a body change, its line evidence must come from a passing, complete
full-workload calibration of the test's current declaration, the unit's checksum
there must equal the one in the test's own evidence (the lines describe the code the
test's evidence describes), the calibrated version of the file must be in the
history, and the calibration must still describe the plan's tree
(:func:`fastci.changes.since.drift`: a caller changed since may now take the changed
lines the old run never took). A test none of whose changed functions' reach lines it executed is skipped,
with the lines in its ``why``.
"""

from __future__ import annotations

import ast
import dis
import inspect
import logging
from dataclasses import dataclass, replace
from types import CodeType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from fastci.changes.semantic_diff import ChangeKind
from fastci.changes.since import drift
from fastci.select.decisions import Decision, DecisionKind, Reason, Selection
from fastci.types import RelPath, TestId, UnitId
from fastci.units.index import split_unit_id
from fastci.units.lines import changed_hunks, line_ranges, source_lines

if TYPE_CHECKING:
    from fastci.changes.versions import Versions
    from fastci.evidence.store.calibrations import CalibrationStore, Rung

LOG = logging.getLogger(__name__)

_BLOCKS = ("body", "orelse", "finalbody")
#: Clauses whose statements are visited, but which are no node of their own: a change
#: to an ``except`` or ``case`` line counts for every run that enters the whole statement.
_CLAUSES = ("handlers", "cases")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class _Node:
    """A statement inside the unit (``except``/``case`` clauses are not nodes: their
    statements are, one level deeper), with its line range."""

    start: int
    end: int
    depth: int
    code: bool  # produces bytecode (a line event) when it runs


def _start(node: ast.stmt) -> int:
    decorators: list[ast.expr] = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decorators])


def _end(node: ast.stmt) -> int:
    return node.end_lineno or node.lineno


def _has_code(node: ast.AST) -> bool:
    """Whether running ``node`` produces a line event (a bare constant or ``global``
    statement compiles to nothing)."""
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return False
    return not isinstance(node, (ast.Global, ast.Nonlocal))


def _nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[_Node], list[_Node]]:
    """Every statement-like node in ``fn``'s body (not inside nested scopes' bodies),
    and its top-level statements."""
    out: list[_Node] = []
    top: list[_Node] = []

    def visit(stmts: Iterable[ast.stmt], depth: int) -> None:
        for s in stmts:
            node = _Node(_start(s), _end(s), depth, _has_code(s))
            out.append(node)
            if depth == 0:
                top.append(node)
            if isinstance(s, _SCOPES):
                continue  # a nested def or class is its own unit; its statement runs here
            for block in _BLOCKS:
                visit(getattr(s, block, None) or [], depth + 1)
            for clause in _CLAUSES:
                for c in getattr(s, clause, None) or []:
                    visit(c.body, depth + 2)

    visit(fn.body, 0)
    return out, top


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The one def whose qualified name is ``qualname`` (None: none, or several: a property
    and its setter, a def in both arms of an ``if``, which are one merged unit)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def visit(body: Iterable[ast.AST], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if f"{prefix}{node.name}" == qualname:
                    found.append(node)
                visit(node.body, f"{prefix}{node.name}.<locals>.")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            else:
                visit(ast.iter_child_nodes(node), prefix)

    visit(tree.body, "")
    return found[0] if len(found) == 1 else None


def reach_lines(old: bytes, new: bytes | None, path: RelPath, qualname: str) -> frozenset[int] | str:
    """Lines of ``old`` (1-based) at least one of which every run that reaches the changed
    code of function ``qualname`` executes, or why none can be given (a sentence).

    Args:
        old: the version the line evidence was recorded with.
        new: the head side (None: the file is gone; never narrowed).
        path: the file's repo-relative path (to index it).
        qualname: the function's qualified name.
    """
    from fastci.units.index import FileUnits, UnitKind, index_source

    if new is None:
        return f"{path} is deleted"
    index = index_source(path, old)
    if not isinstance(index, FileUnits):
        return f"{path} as recorded does not parse"
    unit = index.by_qualname().get(qualname)
    if unit is None or unit.kind is not UnitKind.FUNCTION:
        return f"{qualname} is not a function of {path} as recorded"
    try:
        tree = ast.parse(old)
    except (SyntaxError, ValueError):
        return f"{path} as recorded does not parse"
    fn = _function(tree, qualname)
    if fn is None or (_start(fn), _end(fn)) != (unit.start, unit.end):
        return f"{qualname} has several definitions in {path} (merged unit)"
    nodes, top = _nodes(fn)
    if not fn.body:
        return f"{qualname} has no body"
    first = _start(fn.body[0])
    a = source_lines(old)
    out: set[int] = set()
    touched = False
    for _tag, i1, i2 in changed_hunks(old, new):
        lo, hi = i1 + 1, i2  # the old lines replaced or deleted (hi < lo: an insertion)
        region = set(range(lo, hi + 1)) if hi >= lo else {i1, i1 + 1}
        if not region & set(range(unit.start, unit.end + 1)):
            continue  # another unit's hunk
        touched = True
        if hi >= lo and (lo < first or hi > unit.end):
            return f"the change to {qualname} touches its def lines or the code around it"
        if hi < lo and not (first <= i1 + 1 <= unit.end + 1):
            return f"the change to {qualname} inserts before its body"
        got = _region_reach(nodes, top, a, lo, hi, i1)
        if isinstance(got, str):
            return got
        out |= got
    if not touched or not out:
        return f"no changed line of {qualname} could be placed"
    scope = _scope_change(old, new, path, qualname)
    if scope is not None:
        return scope
    return frozenset(out)


#: Code flags that change how every call of a function runs (generator, coroutine...).
_CALL_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
               | inspect.CO_ITERABLE_COROUTINE | inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)


def _code(source: bytes, path: RelPath, qualname: str) -> CodeType | None:
    try:
        top = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    found: list[CodeType] = []
    todo = [top]
    while todo:
        code = todo.pop()
        if code.co_qualname == qualname:
            found.append(code)
        todo.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return found[0] if len(found) == 1 else None


def _globals(code: CodeType) -> set[str]:
    """Names ``code`` reads, writes or deletes as globals (or builtins)."""
    return {str(i.argval) for i in dis.get_instructions(code)
            if i.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME")}


def _scope_change(old: bytes, new: bytes, path: RelPath, qualname: str) -> str | None:
    """Why a body edit acts beyond its own lines, or None.

    Compiling decides some things for the whole function: binding a name anywhere
    (an assignment, an import, a ``del``) makes it local everywhere, so a line that
    read a global or an enclosing variable raises ``UnboundLocalError`` in runs that
    never reach the new binding; ``global``/``nonlocal`` move a name the other way;
    a ``yield`` or ``await`` changes what every call returns.
    """
    a, b = _code(old, path, qualname), _code(new, path, qualname)
    if a is None or b is None:
        return f"{qualname} cannot be compiled on both sides"
    if (a.co_flags & _CALL_FLAGS) != (b.co_flags & _CALL_FLAGS):
        return f"the change makes {qualname} a generator or coroutine, or the other way round"
    old_local = set(a.co_varnames) | set(a.co_cellvars)
    new_local = set(b.co_varnames) | set(b.co_cellvars)
    old_outer = _globals(a) | set(a.co_freevars)
    new_outer = _globals(b) | set(b.co_freevars)
    # Names whose binding kind changed (an attribute such as ``self.qkv`` is not a name).
    moved = ((new_local - old_local) & old_outer) | ((old_local - new_local) & new_outer) \
        | (set(b.co_freevars) & _globals(a)) | (set(a.co_freevars) & _globals(b))
    if moved:
        return (f"the change rebinds {', '.join(sorted(moved)[:3])} in {qualname}'s scope "
                "(local vs global or enclosing), which every line using it sees")
    return None


def _blank(line: str) -> bool:
    text = line.strip()
    return not text or text.startswith("#")


def _region_reach(nodes: Sequence[_Node], top: Sequence[_Node], lines: Sequence[str], lo: int,
                  hi: int, i1: int) -> set[int] | str:
    """Reach lines of one hunk: old lines ``lo..hi`` replaced (``hi < lo``: an insertion
    after old line ``i1``)."""
    code = [ln for ln in range(lo, hi + 1) if not _blank(lines[ln - 1])] if hi >= lo else []
    out: set[int] = set()
    # Where code is inserted: (first, last) old lines its block must hold, the last old
    # line before it, and the statement it replaces (not a candidate block).
    gaps: list[tuple[int, int, int, _Node | None]] = []
    for ln in code:
        node = _deepest(nodes, ln, ln)
        if node is None:
            return f"changed line {ln} is outside every statement of the function"
        if node.code:
            out.update(range(node.start, node.end + 1))
        else:
            gaps.append((node.start, node.end, node.start - 1, node))
    if hi < lo:
        gaps.append((i1, i1 + 1, i1, None))
    elif not code:
        gaps.append((lo - 1, hi + 1, lo - 1, None))  # only blank or comment lines replaced
    for first, last, before, skip in gaps:
        got = _gap_reach(nodes, top, first, last, before, skip)
        if isinstance(got, str):
            return got
        out |= got
    return out


def _deepest(nodes: Sequence[_Node], lo: int, hi: int, skip: _Node | None = None) -> _Node | None:
    holding = [n for n in nodes if n.start <= lo and hi <= n.end and n is not skip]
    return max(holding, key=lambda n: (n.depth, -n.start)) if holding else None


def _gap_reach(nodes: Sequence[_Node], top: Sequence[_Node], first: int, last: int, before: int,
               skip: _Node | None) -> set[int] | str:
    """Reach lines of code inserted where old lines ``first..last`` are (after old line
    ``before``): every line of the innermost statement holding them, or at the
    function's top level the statement before."""
    inner = _deepest(nodes, first, last, skip)
    if inner is not None:
        return set(range(inner.start, inner.end + 1))
    previous = [n for n in top if n.end <= before and n.code]
    if not previous:
        return "code is inserted before the function's first statement (every run reaches it)"
    prior = max(previous, key=lambda n: n.end)
    return set(range(prior.start, prior.end + 1))


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Reach:
    """One changed function of a test, at line granularity.

    Attributes:
        unit: the changed function.
        lines: its reach lines (:func:`reach_lines`), old version's numbers.
        ran: how many of them the test's full-workload calibration executed.
    """

    unit: UnitId
    lines: frozenset[int]
    ran: int


#: Text that says a repository may compile or trace Python code (torch.compile,
#: TorchScript, dynamo, triton, numba, jax, cupy): code run that way produces few or no
#: line events, so executed lines cannot show which code a test ran.
COMPILER_MARKERS = ("torch.compile", "_dynamo", "torch.jit", "jit.script", "jit.trace",
                    "torch.export", "aot_function", "aot_module", "make_fx", "triton",
                    "numba", "jax", "cupy")


def line_facts(selection: Selection, versions: Versions | None,
               calibration: CalibrationStore | None, digests: Mapping[TestId, str],
               recorded: Mapping[TestId, Mapping[UnitId, str]], base: str | None
               ) -> dict[TestId, tuple[Reach, ...]]:
    """Per selected test whose every reason is a body change the line evidence can speak
    for, each changed function's reach lines and how many of them it ran.

    Args:
        selection: the unit-level selection.
        versions: file versions of the change (history lookups and the head side).
        calibration: where the line evidence is (None: no facts).
        digests: each test's current declaration digest (a test missing here: no facts).
        recorded: per test, the checksum of each unit in its own evidence.
        base: the change's base commit (where calibrated versions are looked up too).
    """
    if calibration is None or versions is None:
        return {}
    out: dict[TestId, tuple[Reach, ...]] = {}
    cache: _ReachCache = {}
    for d in selection.selected:
        if not d.reasons or d.test not in digests or not all(
                r.kind is DecisionKind.CHANGED_UNIT and r.unit and _body_only(r.change)
                for r in d.reasons):
            continue
        try:
            got = _reaches(d, calibration, versions, digests[d.test], recorded.get(d.test, {}),
                           base, cache)
        except Exception as exc:  # noqa: BLE001 - line precision is an optimisation: no facts
            LOG.warning("line evidence not used for %s: %s: %s", d.test, type(exc).__name__, exc)
            continue
        if got is not None:
            out[d.test] = got
    return out


def narrow_by_lines(selection: Selection, facts: Mapping[TestId, Sequence[Reach]]
                    ) -> tuple[Selection, list[TestId]]:
    """Skip the selected tests that ran none of their changed functions' reach lines.

    Args:
        selection: the unit-level selection.
        facts: :func:`line_facts` of it.

    Returns:
        The selection with those tests skipped (kind ``LINES_NOT_RUN``), and their ids.
    """
    skipped = {d.test: _skip(d, facts[d.test]) for d in selection.selected
               if facts.get(d.test) and not any(r.ran for r in facts[d.test])}
    if not skipped:
        return selection, []
    decisions = tuple(skipped.get(d.test, d) for d in selection.decisions)
    summary = (f"{selection.summary}; {len(skipped)} skipped by line granularity (they enter "
               "the changed functions but ran none of the changed lines)"
               if selection.summary else "")
    return replace(selection, decisions=decisions, summary=summary), sorted(skipped)


def _body_only(change: str | None) -> bool:
    """Whether a reason's change (:meth:`UnitChange.describe`'s phrase: kinds joined by
    ``; ``, then the parts in parentheses) is a function body change and nothing else."""
    body = ChangeKind.BODY.value
    return change is not None and (change == body or change.startswith(f"{body} ("))


def _full_rung(calibration: CalibrationStore, test: TestId, digest: str) -> Rung | None:
    return next((r for r in calibration.rungs(test, "full") if r.declaration == digest
                 and not r.overrides and r.usable), None)


#: :func:`reach_lines` by (path, digest of the calibrated version, qualname): tests
#: selected for one changed function share its reach lines (one diff, one compile).
_ReachCache = dict[tuple[RelPath, str, str], "frozenset[int] | str"]


def _reaches(d: Decision, calibration: CalibrationStore, versions: Versions, digest: str,
             recorded: Mapping[UnitId, str], base: str | None,
             cache: _ReachCache) -> tuple[Reach, ...] | None:
    """Each reason's unit, reach lines and how many of them the full rung ran; None when
    the line evidence cannot speak for every reason."""
    full = _full_rung(calibration, d.test, digest)
    if full is None:
        return None
    revs = [c for c in (full.commit, base) if c and not c.startswith("dirty:")]
    out: list[Reach] = []
    for r in d.reasons:
        assert r.unit is not None
        path, qualname = split_unit_id(r.unit)
        got = full.units.get(r.unit)
        mine = recorded.get(r.unit)
        if got is None or not mine or got[0] != mine:
            return None  # the line evidence describes other code than the test's evidence
        file_digest = full.digests.get(path)
        if not file_digest:
            return None
        key = (path, file_digest, qualname)
        if key not in cache:
            old = versions.find(path, file_digest, revs)
            if old is None:
                return None  # another test's revisions may hold it: not cached
            cache[key] = reach_lines(old, versions.now(path), path, qualname)
        lines = cache[key]
        if isinstance(lines, str):
            return None
        out.append(Reach(r.unit, lines, len(lines & full.lines.get(path, frozenset()))))
    # The lines were executed at the calibration's commit: a caller changed since may now
    # reach the changed lines the old run never ran (issue 34 item 1).
    stale = drift(full, versions, {r.unit for r in d.reasons if r.unit}, base)
    if stale is not None:
        LOG.info("line evidence not used for %s: %s", d.test, stale)
        return None
    return tuple(out)


def _skip(d: Decision, unreached: Sequence[Reach]) -> Decision:
    parts = [f"{u.unit} lines {line_ranges(u.lines)}" for u in unreached]
    sentence = ("not affected at line granularity: its full-workload calibration entered the "
                "changed function" + ("s" if len(parts) > 1 else "") + " but ran none of "
                + "; ".join(parts))
    reason = Reason(DecisionKind.LINES_NOT_RUN, sentence, unit=unreached[0].unit,
                    via="line evidence: the calibration's full rung (same unit checksum as the "
                        "test's evidence)")
    return Decision(d.test, (reason,) + tuple(d.reasons), d.est_gpu_s, 0.0)


def declaration_digests(declared: Mapping[TestId, Any]) -> dict[TestId, str]:
    """The declaration digest of each declared test (what its calibration is keyed by)."""
    from fastci.evidence.store.calibrations import declaration_digest

    return {t: declaration_digest(decl) for t, decl in declared.items()}
