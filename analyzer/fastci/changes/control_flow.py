"""Inserted or changed control flow in a function body (issue 34 item 2).

Reduction keeps a rung when it reaches every changed line, arc and context the full run
did (:mod:`fastci.plan.reduce`): a check made against the *old* code. Code inserted under
a condition on a reduced dimension (``if layer >= 2:``, ``if micro_step >= num_stages:``,
``if step == warmup:``) passes it, since the lines around the insertion run at every
workload, while the new code runs only at the full one. The same holds for a changed
condition, a changed loop bound, a ``break`` added to a loop, and the branches of a
conditional expression or a comprehension, which share one line with their condition.

:func:`control_changes` compares the *control skeleton* of each function on both sides:
in order, with its nesting depth, every ``if``/``elif``/``else``, loop (target, iterable
or condition, ``else``), ``with`` (its items), ``try`` (handlers, ``else``, ``finally``),
``match`` (subject, patterns, guards), jump (``break``, ``continue``, ``return``,
``raise``: where they are, not what they return), and every conditional expression,
``and``/``or`` and comprehension (whole: their branches are on their condition's line).
Any difference is a control-flow change; its sentence names the first one. Plain
statements moved between existing branches are not (retention sees them: the lines
around them are inside the branch). Nested functions and classes are units of their own.

Pure and cheap: only functions whose body changed are compared
(:mod:`fastci.changes.semantic_diff` calls it), each parsed alone where its lines are
known, else one :func:`ast.parse` per side of the file.
"""

from __future__ import annotations

import ast
import difflib
import functools
import textwrap
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_EXPRS = (ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


@dataclass(frozen=True)
class _Step:
    """One element of a control skeleton: compared by ``key``, shown as ``text``."""

    key: tuple[int, str]  # (depth, the element as ast.dump writes it, without positions)
    text: Callable[[], str]  # how it reads (only a reported step is unparsed: it is slow)
    line: int


#: A function's lines on the old and the new side (first, last; decorators included).
Spans = Mapping[str, tuple[tuple[int, int], tuple[int, int]]]


def control_changes(old: bytes, new: bytes, qualnames: Collection[str],
                    spans: Spans | None = None) -> dict[str, str]:
    """Qualname -> what changed in its control flow, for the functions of ``qualnames``
    whose control skeleton differs between ``old`` and ``new`` (a sentence). A side that
    does not parse marks every one of them (nothing can be shown).

    ``spans`` (optional, per qualname): where the function is on each side. Such a
    function is parsed alone (its lines, dedented), not with the whole file: the
    change analysis knows the spans of the units it re-hashed, and a file's other code
    need not be parsed again. A segment that does not parse alone (a string literal
    whose lines are not indented) falls back to the whole file.
    """
    out: dict[str, str] = {}
    rest = set(qualnames)
    if spans:
        a_lines, b_lines = _lines(old), _lines(new)
        for q in sorted(rest & set(spans)):
            (a0, a1), (b0, b1) = spans[q]
            before, after = _alone(a_lines, a0, a1), _alone(b_lines, b0, b1)
            if before is None or after is None:
                continue
            rest.discard(q)
            why = _compare(_skeleton(before), _skeleton(after))
            if why is not None:
                out[q] = why
    if not rest:
        return out
    try:
        a, b = ast.parse(old), ast.parse(new)
    except (SyntaxError, ValueError):
        return {**out, **{q: "control flow cannot be compared (a side does not parse)"
                          for q in rest}}
    before_all, after_all = _functions(a, rest), _functions(b, rest)
    for q in sorted(rest):
        why = _compare(_skeleton(before_all.get(q, [])), _skeleton(after_all.get(q, [])))
        if why is not None:
            out[q] = why
    return out


def _lines(source: bytes) -> list[str]:
    return source.decode("utf-8", errors="replace").splitlines(keepends=True)


def _alone(lines: list[str], first: int, last: int
           ) -> list[ast.FunctionDef | ast.AsyncFunctionDef] | None:
    """The one def on lines ``first..last``, parsed alone (None: it does not parse so)."""
    try:
        tree = ast.parse(textwrap.dedent("".join(lines[first - 1:last])))
    except (SyntaxError, ValueError):
        return None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(defs) != 1 or len(tree.body) != 1:
        return None
    ast.increment_lineno(tree, first - 1)  # the file's line numbers, in what is reported
    return defs


def _functions(tree: ast.Module, wanted: Collection[str]
               ) -> dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]:
    """The defs of each wanted qualname (several for a merged unit: a property and its
    setter, a def in both arms of an ``if``)."""
    out: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}

    def visit(body: Iterable[ast.AST], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{node.name}"
                if name in wanted:
                    out.setdefault(name, []).append(node)
                visit(node.body, f"{name}.<locals>.")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            else:  # defs are statements: only statement blocks can hold one
                for block in _BLOCKS:
                    for part in getattr(node, block, None) or []:
                        visit(part.body if isinstance(part, (ast.ExceptHandler, ast.match_case))
                              else [part], prefix)

    visit(tree.body, "")
    return out


def _skeleton(fns: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> list[_Step]:
    out: list[_Step] = []

    def add(depth: int, node: ast.AST, key: str, text: Callable[[], str]) -> None:
        out.append(_Step((depth, key), text, getattr(node, "lineno", 0)))

    def exprs(node: ast.AST, depth: int) -> None:
        """Conditional expressions in ``node``'s own expressions (not its blocks)."""
        for field, value in ast.iter_fields(node):
            if field in _BLOCKS:
                continue
            for part in value if isinstance(value, list) else [value]:
                if not isinstance(part, ast.AST):
                    continue
                for sub in ast.walk(part):
                    if isinstance(sub, _EXPRS):
                        add(depth, sub, ast.dump(sub), functools.partial(ast.unparse, sub))

    def visit(stmts: Iterable[ast.stmt], depth: int) -> None:
        for s in stmts:
            if isinstance(s, _SCOPES):
                continue  # a unit of its own
            header = _header(s)
            if header is not None:
                key, text = header
                add(depth, s, key, text)
            exprs(s, depth)
            for block in ("body", "orelse", "finalbody"):
                visit(getattr(s, block, None) or [], depth + 1)
            for h in getattr(s, "handlers", None) or []:
                add(depth + 1, h, "except:" + (ast.dump(h.type) if h.type else "") + f":{h.name}",
                    functools.partial(_except_text, h))
                visit(h.body, depth + 2)
            for c in getattr(s, "cases", None) or []:
                add(depth + 1, c, f"case:{ast.dump(c.pattern)}:"
                    + (ast.dump(c.guard) if c.guard else ""),
                    functools.partial(_case_text, c))
                visit(c.body, depth + 2)

    for fn in fns:
        visit(fn.body, 0)
    return out


def _except_text(h: ast.ExceptHandler) -> str:
    return "except" + (f" {ast.unparse(h.type)}" if h.type else "") + ":"


def _case_text(c: ast.match_case) -> str:
    return f"case {ast.unparse(c.pattern)}" + (f" if {ast.unparse(c.guard)}" if c.guard else "") + ":"


def _header(s: ast.stmt) -> tuple[str, Callable[[], str]] | None:
    """A control statement's key (its header, without positions) and how it reads."""
    if isinstance(s, ast.If):
        return f"if:{ast.dump(s.test)}:{bool(s.orelse)}", lambda: f"if {ast.unparse(s.test)}:"
    if isinstance(s, (ast.For, ast.AsyncFor)):
        loop = s
        return (f"for:{ast.dump(loop.target)}:{ast.dump(loop.iter)}:{bool(loop.orelse)}",
                lambda: f"for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}:")
    if isinstance(s, ast.While):
        return f"while:{ast.dump(s.test)}:{bool(s.orelse)}", lambda: f"while {ast.unparse(s.test)}:"
    if isinstance(s, (ast.With, ast.AsyncWith)):
        items = s.items
        return ("with:" + ":".join(ast.dump(i) for i in items),
                lambda: "with " + ", ".join(ast.unparse(i) for i in items) + ":")
    if isinstance(s, (ast.Try, ast.TryStar)):
        return f"try:{bool(s.orelse)}:{bool(s.finalbody)}", lambda: "try:"
    if isinstance(s, ast.Match):
        return f"match:{ast.dump(s.subject)}", lambda: f"match {ast.unparse(s.subject)}:"
    if isinstance(s, (ast.Break, ast.Continue, ast.Return, ast.Raise)):
        word = type(s).__name__.lower()
        return word, lambda: word
    return None


def _compare(old: list[_Step], new: list[_Step]) -> str | None:
    """The first difference between two skeletons, as a sentence (None: the same)."""
    a, b = [s.key for s in old], [s.key for s in new]
    if a == b:
        return None
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if j2 > j1:
            step = new[j1]
            verb = "inserts" if tag == "insert" else "changes"
            return f"control flow changed: {verb} `{_short(step.text())}` (line {step.line})"
        step = old[i1]
        return f"control flow changed: removes `{_short(step.text())}` (old line {step.line})"
    return "control flow changed"


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."
