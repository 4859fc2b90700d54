"""A fast path for the semantic diff of one file: re-hash only the units whose text changed.

Indexing a whole file costs milliseconds to tens of milliseconds; a typical
edit touches one or two functions. A unit's checksum depends only on its own text
(a function or class is hashed from its own span; the module's top level from
the statements outside the def/class bodies). So when both versions parse, define
the same units in the same order and have the same module *skeleton* (the text
with top-level def/class bodies removed), only units whose span text differs can
have changed, and each is re-hashed alone: its span is indexed as a file, under
an ``if 1:`` when it is indented, so its text (string literals included) parses
exactly as it does in place and gets the checksum the full index gives it.

Whenever that reasoning does not apply (a unit added, removed or renamed, the
skeleton changed, a span does not index on its own) :func:`quick_diff` returns
None and the caller does the full diff. ``tests/test_changes.py`` checks that the
two agree on random edits.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

from fastci.types import RelPath
from fastci.units.lines import body_start
from fastci.units.index import MODULE_QUALNAME, FileUnits, Unit, index_source, unit_id


@dataclass(frozen=True)
class _Def:
    qualname: str
    start: int  # first line, decorators included
    end: int
    body_start: int  # first body line (== start line of the def for one-liners)
    top: bool  # defined in the module scope (possibly inside if/try...)
    owned_start: int  # first line the unit owns (as in the full index)


def _layout(source: bytes) -> tuple[list[_Def], list[str]] | None:
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
        if encoding not in ("utf-8", "utf-8-sig"):
            return None  # a span re-indexed alone is read as UTF-8, the file is not
        text = source.decode("utf-8")
        tree = ast.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None
    defs: list[_Def] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                qual = ".".join((*scope, child.name))
                defs.append(_Def(qual, start, child.end_lineno or child.lineno,
                                 child.body[0].lineno, not scope, body_start(child)))
                inner = (*scope, child.name) if isinstance(child, ast.ClassDef) \
                    else (*scope, child.name, "<locals>")
                visit(child, inner)
            elif isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                visit(child, scope)

    visit(tree, ())
    defs.sort(key=lambda d: (d.start, d.qualname))
    # Lines as the compiler counts them (\n, \r\n, \r): str.splitlines also breaks at
    # \f, \x1c, \u2028... inside strings and comments, which would shift every span.
    return defs, io.StringIO(text, newline="").readlines()


def _skeleton(defs: list[_Def], lines: list[str]) -> str:
    keep = [True] * len(lines)
    for d in defs:
        if d.top and d.body_start > d.start:
            for i in range(d.body_start - 1, d.end):
                keep[i] = False
    return "".join(line for line, k in zip(lines, keep) if k)


def _segment(d: _Def, lines: list[str]) -> str:
    return "".join(lines[d.start - 1:d.end])


def _alone(path: RelPath, d: _Def, segment: str) -> Unit | None:
    """Index one def's span on its own; None if that does not work.

    An indented span goes under ``if 1:`` rather than being dedented: dedenting
    would also strip the margin of lines inside multi-line strings (and blank
    out whitespace-only ones), changing their values and so the checksum.
    """
    if segment[:1] in (" ", "\t", "\f"):
        segment = "if 1:\n" + segment
    idx = index_source(path, segment)
    if not isinstance(idx, FileUnits) or len(idx.units) < 2:
        return None
    unit = idx.units[1]
    if unit.qualname != d.qualname.rsplit(".", 1)[-1]:
        return None
    return Unit(unit_id(path, d.qualname), path, d.qualname, unit.kind, d.start, d.end,
                d.owned_start, unit.checksum, unit.parts)


def quick_diff(path: RelPath, old: bytes, new: bytes) -> list[tuple[Unit, Unit]] | None:
    """Pairs (old unit, new unit) whose checksums differ, or None to ask for the full diff."""
    a, b = _layout(old), _layout(new)
    if a is None or b is None:
        return None
    (old_defs, old_lines), (new_defs, new_lines) = a, b
    if [d.qualname for d in old_defs] != [d.qualname for d in new_defs]:
        return None
    if len({d.qualname for d in new_defs}) != len(new_defs):
        return None  # a name defined twice: positions matter, use the full diff
    if _skeleton(old_defs, old_lines) != _skeleton(new_defs, new_lines):
        return None
    changed: list[tuple[Unit, Unit]] = []
    for od, nd in zip(old_defs, new_defs):
        oseg, nseg = _segment(od, old_lines), _segment(nd, new_lines)
        if oseg == nseg:
            continue
        ou, nu = _alone(path, od, oseg), _alone(path, nd, nseg)
        if ou is None or nu is None or ou.kind != nu.kind:
            return None
        if ou.checksum != nu.checksum:
            changed.append((ou, nu))
    return changed


__all__ = ["quick_diff", "MODULE_QUALNAME"]
