"""Line ownership of units, without checksums.

The recorder runs in every test process, where hashing every file it touches
would be overhead; it only needs to know which unit owns each executed line.
:func:`line_index` gives exactly the qualnames and ownership of
:func:`fastci.units.index.index_source` (both walk :func:`scoped_defs`; a test checks
they agree); checksums are computed later, at ingest. Re-exported by
:mod:`fastci.units.index`.
"""

from __future__ import annotations

import ast
import difflib
import enum
import re
from dataclasses import dataclass, field
from typing import Iterable, Union

from fastci.types import RelPath

MODULE_QUALNAME = "<module>"

#: A ``def`` or ``class`` statement: the statements that start a unit of their own.
AstDef = Union[ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef]


class UnitKind(enum.StrEnum):
    """What a unit is. A ``str`` enum: it compares equal to its value (``"function"``)."""

    MODULE = "module"
    CLASS = "class"
    FUNCTION = "function"


#: The scopes enclosing a def, outermost first: (name, kind) per enclosing def/class.
Scope = tuple[tuple[str, UnitKind], ...]


@dataclass(frozen=True)
class ParseFailure:
    """A file that could not be indexed; callers must widen, never narrow."""

    path: RelPath
    message: str


def scoped_qualname(scope: Scope, name: str) -> str:
    """The ``co_qualname`` of ``name`` defined in ``scope`` (``Outer.meth``, ``f.<locals>.g``)."""
    parts: list[str] = []
    for scope_name, kind in scope:
        parts.append(scope_name)
        if kind == UnitKind.FUNCTION:
            parts.append("<locals>")
    parts.append(name)
    return ".".join(parts)


def body_start(a: AstDef) -> int:
    """First line a def/class owns: its first statement (a function's docstring excluded).

    The lines before it (decorators, the header) run when the enclosing scope runs,
    so they belong to the enclosing unit.
    """
    body = a.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        return body[1].lineno if not isinstance(a, ast.ClassDef) else body[0].lineno
    return body[0].lineno


@dataclass(frozen=True)
class LineIndex:
    """Which unit owns each line of a file, from the stdlib ``ast`` alone (no checksums).

    Cheap enough for every recorded test process (``ast`` is C); the same
    qualnames and ownership as :func:`index_source`.
    """

    path: RelPath
    qualnames: tuple[str, ...]  # index 0 is the module
    _owner: tuple[int, ...] = field(default=(), repr=False)

    def qualname_for_line(self, line: int) -> str:
        """The qualname of the innermost unit owning ``line``; the module for unknown lines."""
        if 1 <= line <= len(self._owner):
            return self.qualnames[self._owner[line - 1]]
        return MODULE_QUALNAME


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")  # where statements nest


def _ast_scoped_defs(node: ast.AST, scope: Scope, out: list[tuple[AstDef, Scope]]) -> None:
    # A def is a statement, so only statement blocks are searched, never expressions.
    for name in _BLOCKS:
        for child in getattr(node, name, None) or ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((child, scope))
                kind = UnitKind.CLASS if isinstance(child, ast.ClassDef) else UnitKind.FUNCTION
                _ast_scoped_defs(child, scope + ((child.name, kind),), out)
            elif isinstance(child, ast.AST):
                _ast_scoped_defs(child, scope, out)


def scoped_defs(tree: ast.AST) -> list[tuple[AstDef, Scope]]:
    """Every def/class of ``tree`` in source order, with its enclosing (name, kind) scopes."""
    defs: list[tuple[AstDef, Scope]] = []
    _ast_scoped_defs(tree, (), defs)
    defs.sort(key=lambda d: (d[0].lineno, d[0].col_offset))
    return defs


def line_index(path: RelPath, source: str | bytes) -> LineIndex | ParseFailure:
    """Line ownership of one file (see :class:`LineIndex`)."""
    raw = source.encode() if isinstance(source, str) else source
    try:
        tree = ast.parse(raw)
    except (SyntaxError, ValueError) as exc:
        return ParseFailure(path, f"{path}: does not parse: {str(exc).splitlines()[0]}")
    n_lines = raw.count(b"\n") + 1
    quals = [MODULE_QUALNAME]
    owner = [0] * n_lines
    for a, scope in scoped_defs(tree):
        quals.append(scoped_qualname(scope, a.name))
        for line in range(body_start(a), (a.end_lineno or a.lineno) + 1):
            if line <= n_lines:
                owner[line - 1] = len(quals) - 1
    return LineIndex(path, tuple(quals), tuple(owner))


def line_ranges(lines: Iterable[int]) -> str:
    """``1, 2, 3, 7`` -> ``1–3, 7`` (``none`` when empty): line numbers as people read them."""
    parts: list[list[int]] = []
    for x in sorted(lines):
        if parts and x == parts[-1][1] + 1:
            parts[-1][1] = x
        else:
            parts.append([x, x])
    return ", ".join(f"{a}" if a == b else f"{a}\u2013{b}" for a, b in parts) or "none"


#: Line breaks as the compiler counts them (``str.splitlines`` also splits on ``\f``,
#: ``\x1c``, ``\u2028``..., which would shift every later line number).
_NEWLINE = re.compile(r"\r\n|\r|\n")


def source_lines(data: bytes) -> list[str]:
    """``data``'s lines, numbered as ``ast`` and coverage.py number them (line ``n`` at
    index ``n - 1``)."""
    return _NEWLINE.split(data.decode("utf-8", "replace"))


def changed_hunks(old: bytes, new: bytes) -> list[tuple[str, int, int]]:
    """The differing hunks of a line diff ``old`` -> ``new``: (``replace`` | ``delete`` |
    ``insert``, i1, i2) with ``old`` lines ``i1 + 1 .. i2`` (1-based) replaced or deleted,
    or, for an insertion (``i1 == i2``), new lines inserted after old line ``i1``."""
    matcher = difflib.SequenceMatcher(None, source_lines(old), source_lines(new), autojunk=False)
    return [(tag, i1, i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]
