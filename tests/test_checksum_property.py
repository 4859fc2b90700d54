"""Property: unit checksums change exactly when the code's ``ast`` changes (fastci.units.index).

For every Python file git tracks in this repository (the analyzer, the example
framework, the tests, the benches, the rules) and a variant of it that
hypothesis derives, the unit ids, checksums and parts of the two are all equal
**iff** their ``ast.dump`` (no positions, docstrings removed) is equal. Variants
are spellings the compiler does not see (comments, blank lines, quote style,
numeric spelling, parentheses, an ``ast.unparse`` round trip), which must keep
every checksum, and semantic mutations at hypothesis-chosen sites (slice bounds,
relative-import levels, f-string ``=``, comparison and arithmetic operators,
constants, dropped statements, argument order, keyword vs positional, ``*``,
``await``, ``yield from``, ``async``, ``global``...), which must change one.
The quick diff (:mod:`fastci.changes.fast_diff`) must also find exactly the units whose
checksums the full index says changed.
"""

from __future__ import annotations

import ast
import copy
import functools
import io
import json
import os
import re
import subprocess
import tokenize
import warnings
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from fastci.changes.fast_diff import quick_diff
from fastci.units.index import FileUnits, ParseFailure, index_source

REPO = Path(__file__).resolve().parents[1]


def _tracked_python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=REPO, check=True,
                         capture_output=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p)


FILES = _tracked_python_files()


@functools.lru_cache(maxsize=None)
def _source(path: str) -> bytes:
    return (REPO / path).read_bytes()


def spec(source: bytes) -> str | None:
    """The truth: ``ast.dump`` without positions and docstrings (None: does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:]
    return ast.dump(tree, include_attributes=False)


def checksums(source: bytes) -> tuple[object, ...] | None:
    """Every unit's id, checksum and parts, in order (None: does not index)."""
    res = index_source("pkg/f.py", source)
    if isinstance(res, ParseFailure):
        return None
    return tuple((u.id, u.checksum, u.parts) for u in res.units)


@functools.lru_cache(maxsize=None)
def _original(path: str) -> tuple[str | None, tuple[object, ...] | None]:
    src = _source(path)
    return spec(src), checksums(src)


def test_every_tracked_file_is_checked() -> None:
    """All tracked files are in the property; any that does not parse is named, not dropped."""
    assert len(FILES) > 50 and {p.split("/", 1)[0] for p in FILES} >= \
        {"analyzer", "examples", "tests", "bench", "rules"}
    unparsable = [p for p in FILES if _original(p)[0] is None]
    for p in unparsable:  # the index must say so too (the selector widens for it)
        assert isinstance(index_source(p, _source(p)), ParseFailure), p
    if unparsable:
        warnings.warn(f"{len(unparsable)} tracked file(s) do not parse under Python 3.11 "
                      f"and are checked only for a ParseFailure: {', '.join(unparsable)}")
    assert all(_original(p)[1] is not None for p in FILES if p not in unparsable)


# --------------------------------------------------------------------------- sources as bytes


class Src:
    """A source with byte offsets for ``ast`` positions (``col_offset`` counts UTF-8 bytes)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.tree = ast.parse(data)
        self.starts = [0]
        for line in io.BytesIO(data).readlines():
            self.starts.append(self.starts[-1] + len(line))
        self.tokens = list(tokenize.tokenize(io.BytesIO(data).readline))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        decos = getattr(node, "decorator_list", None)
        if decos:  # a def starts at its first decorator's '@'
            start = self.data.rindex(b"@", 0, self.offset(decos[0].lineno, decos[0].col_offset))
        return start, end

    def tok_span(self, tok: tokenize.TokenInfo) -> tuple[int, int]:
        # tokenize columns count characters, not bytes.
        def off(row: int, col: int) -> int:
            line = self.data[self.starts[row - 1]:self.starts[row]].decode("utf-8")
            return self.starts[row - 1] + len(line[:col].encode("utf-8"))
        return off(*tok.start), off(*tok.end)

    def replace(self, span: tuple[int, int], text: str) -> bytes:
        return self.data[:span[0]] + text.encode("utf-8", "surrogatepass") + self.data[span[1]:]


def _outside_fstrings(tree: ast.AST) -> list[ast.AST]:
    """Nodes with trustworthy positions (3.11 gives f-string internals odd ones)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, ast.JoinedStr):
            todo.extend(ast.iter_child_nodes(node))
    out.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0), type(n).__name__))
    return out


def _nodes(s: Src, *types: type) -> list[ast.AST]:
    return [n for n in _outside_fstrings(s.tree) if isinstance(n, types)]


Edit = Callable[[], bytes]  # a variant, built lazily once hypothesis picked the site


def _expr_edit(s: Src, node: ast.AST, new: ast.AST) -> Edit:
    if isinstance(new, ast.Slice):  # a slice cannot be parenthesized
        return lambda: s.replace(s.span(node), ast.unparse(new))
    return lambda: s.replace(s.span(node), f"({ast.unparse(new)})")


def _stmt_edit(s: Src, node: ast.stmt, new: ast.stmt) -> Edit:
    return lambda: s.replace(s.span(node), ast.unparse(new))


# --------------------------------------------------------------------------- compiler-invisible


def v_unparse(s: Src) -> list[Edit]:
    return [lambda: ast.unparse(s.tree).encode("utf-8", "surrogatepass")]


def v_comments(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for tok in s.tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.NL) and tok.end[0] <= len(s.starts) - 1:
            at = s.starts[tok.end[0]]  # start of the next line
            nl = s.tok_span(tok)[0]
            out.append(lambda at=at: s.data[:at] + b"# inserted comment\n" + s.data[at:])
            out.append(lambda at=at: s.data[:at] + b"\n\n" + s.data[at:])
            out.append(lambda nl=nl: s.data[:nl] + b"  # trailing" + s.data[nl:])
    return out


def _string_tokens(s: Src) -> list[tokenize.TokenInfo]:
    return [t for t in s.tokens if t.type == tokenize.STRING
            and not re.match(r"(?i)[rbu]*f", t.string)]


def v_quotes(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for tok in _string_tokens(s):
        value = ast.literal_eval(tok.string)
        span = s.tok_span(tok)
        spellings = [repr(value)]
        if isinstance(value, str):
            spellings.append(json.dumps(value, ensure_ascii=False))
            if len(value) > 1:  # implicit concatenation of two pieces
                k = len(value) // 2
                spellings.append(f"{value[:k]!r} {value[k:]!r}")
        for text in spellings:
            out.append(lambda span=span, text=text: s.replace(span, text))
    return out


def v_numbers(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for tok in s.tokens:
        if tok.type != tokenize.NUMBER:
            continue
        value = ast.literal_eval(tok.string)
        span = s.tok_span(tok)
        if isinstance(value, int):
            spellings = [hex(value), f"{value:_}", str(value)]
        else:
            spellings = [repr(value)]
        for text in spellings:
            # a space keeps `1if x` and `1 .real` tokenizing as before
            out.append(lambda span=span, text=text: s.replace(span, f" {text} "))
    return out


def v_parens(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.expr):
        if isinstance(node, (ast.Starred, ast.Slice)):
            continue
        a, b = s.span(node)
        out.append(lambda a=a, b=b: s.data[:a] + b"(" + s.data[a:b] + b")" + s.data[b:])
    return out


# --------------------------------------------------------------------------- semantic mutations


def m_slices(s: Src) -> list[Edit]:
    out: list[Edit] = []
    two = ast.Constant(2)
    for node in _nodes(s, ast.Slice):
        assert isinstance(node, ast.Slice)
        lo, up, st_ = node.lower, node.upper, node.step
        for new in (ast.Slice(up, lo, st_), ast.Slice(None, up, st_), ast.Slice(lo, None, st_),
                    ast.Slice(lo, up, None if st_ else two), ast.Slice(st_, up, lo)):
            out.append(_expr_edit(s, node, new))
    return out


def m_import_level(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.ImportFrom):
        assert isinstance(node, ast.ImportFrom)
        for level in (node.level + 1, node.level - 1):
            if level >= 0 and (level or node.module):
                out.append(_stmt_edit(s, node, ast.ImportFrom(node.module, node.names, level)))
    return out


_FIELD = re.compile(r"\{([A-Za-z_][\w.]*)(=?)\}")


def m_fstring_debug(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for tok in s.tokens:
        if tok.type == tokenize.STRING and re.match(r"(?i)[rbu]*f", tok.string):
            span = s.tok_span(tok)
            for m in _FIELD.finditer(tok.string):
                text = tok.string[:m.start()] + "{" + m.group(1) + ("" if m.group(2) else "=") \
                    + "}" + tok.string[m.end():]
                out.append(lambda span=span, text=text: s.replace(span, text))
    return out


_FLIP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                           ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot,
                           ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BINOP: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv,
                            ast.Div: ast.Mult, ast.FloorDiv: ast.Div, ast.Mod: ast.Mult,
                            ast.Pow: ast.Mult, ast.MatMult: ast.Mult, ast.BitAnd: ast.BitOr,
                            ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr, ast.LShift: ast.RShift,
                            ast.RShift: ast.LShift}


def m_operators(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.Compare, ast.BinOp, ast.BoolOp, ast.UnaryOp):
        new = copy.copy(node)
        if isinstance(node, ast.Compare) and isinstance(new, ast.Compare):
            for i, op in enumerate(node.ops):
                ops = list(node.ops)
                ops[i] = _FLIP[type(op)]()
                out.append(_expr_edit(s, node, ast.Compare(node.left, ops, node.comparators)))
            continue
        if isinstance(node, ast.BinOp) and isinstance(new, ast.BinOp):
            new.op = _BINOP[type(node.op)]()
        elif isinstance(node, ast.BoolOp) and isinstance(new, ast.BoolOp):
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.UnaryOp):
            out.append(_expr_edit(s, node, node.operand))  # drop the `-`/`not`/`~`
            continue
        out.append(_expr_edit(s, node, new))
    return out


def m_constants(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.Constant):
        assert isinstance(node, ast.Constant)
        v = node.value
        if isinstance(v, bool) or v is None or v is Ellipsis:
            news: list[object] = [not v] if isinstance(v, bool) else [0]
        elif isinstance(v, (int, float)):
            news = [v + 1, v - 1] if v >= 1 else [v + 1]
        elif isinstance(v, (str, bytes)):
            news = [v + v[:1] if v else v * 0 + ("x" if isinstance(v, str) else b"x")]
        else:
            news = [v * 2]
        for new in news:
            out.append(_expr_edit(s, node, ast.Constant(new)))
    return out


def _statements(s: Src) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    out = []
    for node in _outside_fstrings(s.tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                out.extend((stmt, block) for stmt in block if isinstance(stmt, ast.stmt))
    return out


def m_drop_statement(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for stmt, block in _statements(s):
        span = s.span(stmt)
        out.append(lambda span=span: s.replace(span, "pass"))
        line_start = s.starts[stmt.lineno - 1] if not getattr(stmt, "decorator_list", None) \
            else s.data.rfind(b"\n", 0, span[0]) + 1
        line_end = s.data.find(b"\n", span[1])
        whole = not s.data[line_start:span[0]].strip() and \
            not s.data[span[1]:line_end].split(b"#")[0].strip()
        if len(block) > 1 and whole and line_end >= 0:
            out.append(lambda a=line_start, b=line_end: s.data[:a] + s.data[b + 1:])
    return out


def m_calls(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.Call):
        assert isinstance(node, ast.Call)
        args, kws = node.args, node.keywords
        plain = all(not isinstance(a, ast.Starred) for a in args)
        if len(args) >= 2 and plain:  # swap two arguments
            new = copy.copy(node)
            new.args = [args[1], args[0], *args[2:]]
            out.append(_expr_edit(s, node, new))
        named = [k for k in kws if k.arg is not None]
        if named and plain:  # keyword -> positional
            new = copy.copy(node)
            new.args = [*args, named[0].value]
            new.keywords = [k for k in kws if k is not named[0]]
            out.append(_expr_edit(s, node, new))
        if args and not isinstance(args[-1], ast.Starred):  # positional -> keyword
            new = copy.copy(node)
            new.args = args[:-1]
            new.keywords = [ast.keyword("hyp", args[-1]), *kws]
            out.append(_expr_edit(s, node, new))
        if args:  # toggle `*` on the first argument
            new = copy.copy(node)
            first = args[0]
            new.args = [first.value if isinstance(first, ast.Starred) else ast.Starred(first),
                        *args[1:]]
            out.append(_expr_edit(s, node, new))
    return out


def m_names(s: Src) -> list[Edit]:
    out: list[Edit] = []
    for node in _nodes(s, ast.Name, ast.Attribute, ast.Await, ast.Yield, ast.YieldFrom,
                       ast.NamedExpr, ast.Lambda):
        if isinstance(node, ast.Name):
            new: ast.AST = ast.Name(node.id + "_hyp")
        elif isinstance(node, ast.Attribute):
            new = ast.Attribute(node.value, node.attr + "_hyp")
        elif isinstance(node, (ast.Await, ast.NamedExpr)):
            new = node.value  # drop the `await` / the walrus binding
        elif isinstance(node, ast.Yield):
            if node.value is None:
                continue
            new = ast.YieldFrom(node.value)
        elif isinstance(node, ast.YieldFrom):
            new = ast.Yield(node.value)
        else:
            assert isinstance(node, ast.Lambda)
            new = ast.Lambda(node.args, ast.Constant(None))
        out.append(_expr_edit(s, node, new))
    return out


def m_keywords(s: Src) -> list[Edit]:
    """Statement-level words: ``async``, ``global``/``nonlocal`` names, ``raise ... from``."""
    out: list[Edit] = []
    for i, tok in enumerate(s.tokens[:-1]):
        if tok.type == tokenize.NAME and tok.string == "async" \
                and s.tokens[i + 1].string in ("for", "with", "def"):
            a, _ = s.tok_span(tok)
            b, _ = s.tok_span(s.tokens[i + 1])
            out.append(lambda a=a, b=b: s.data[:a] + s.data[b:])
    for node in _nodes(s, ast.Global, ast.Nonlocal):
        assert isinstance(node, (ast.Global, ast.Nonlocal))
        out.append(_stmt_edit(s, node, type(node)([*node.names, "hyp_extra"])))
        if len(node.names) > 1:
            out.append(_stmt_edit(s, node, type(node)(node.names[1:])))
    for node in _nodes(s, ast.Raise):
        assert isinstance(node, ast.Raise)
        if node.exc is not None:
            out.append(_stmt_edit(s, node, ast.Raise(node.exc, None if node.cause
                                                     else ast.Constant(None))))
    return out


INVISIBLE = {"unparse": v_unparse, "comments": v_comments, "quotes": v_quotes,
             "numbers": v_numbers, "parens": v_parens}
MUTATIONS = {"slices": m_slices, "import_level": m_import_level,
             "fstring_debug": m_fstring_debug, "operators": m_operators,
             "constants": m_constants, "drop_statement": m_drop_statement, "calls": m_calls,
             "names": m_names, "keywords": m_keywords}
VARIANTS = {**INVISIBLE, **MUTATIONS}


@functools.lru_cache(maxsize=8)
def _sites(path: str) -> tuple[Src, dict[str, list[Edit]]]:
    s = Src(_source(path))
    sites = {name: make(s) for name, make in VARIANTS.items()}
    return s, {k: v for k, v in sites.items() if v}


def _check(path: str, variant: bytes, kind: str) -> tuple[bool, bool]:
    """Check the property for one variant: (its ast equals the original's, quick diff applied)."""
    want_spec, want_units = _original(path)
    got_spec = spec(variant)
    if got_spec is None:
        reject()  # the edit made a syntax error: not a version anyone can commit
    got_units = checksums(variant)
    assert got_units is not None, "parses under ast but does not index"
    same_units = got_units == want_units
    same_ast = got_spec == want_spec
    assert same_units == same_ast, (
        f"{kind}: checksums {'equal' if same_units else 'differ'} but the ast "
        f"{'is equal' if same_ast else 'differs'}")
    if kind in ("comments", "numbers"):  # the generator itself: these never change the ast
        assert same_ast
    # The quick diff re-hashes changed spans alone; it must find what the full index finds.
    pairs = quick_diff(path, _source(path), variant)
    if pairs is not None:
        before, after = index_source(path, _source(path)), index_source(path, variant)
        assert isinstance(before, FileUnits) and isinstance(after, FileUnits)
        b, a = before.by_qualname(), after.by_qualname()
        assert {(o.qualname, o.checksum, n.checksum) for o, n in pairs} == \
            {(q, b[q].checksum, a[q].checksum) for q in a if a[q].checksum != b[q].checksum}
    return same_ast, pairs is not None


PARSED = [p for p in FILES if _original(p)[0] is not None]
#: The hypothesis property runs on a fixed sample of the parsed files: every
#: :data:`STRIDE`-th by path, and the first of each folder the stride missed, so every
#: folder is in it (the round trip below still takes every file). Eight drawn edits of
#: each of ~360 files took 3 of the suite's minutes. ``FASTCI_CHECKSUM_ALL=1``: all.
STRIDE = 1 if os.environ.get("FASTCI_CHECKSUM_ALL") else 4


def _sample(paths: list[str], stride: int) -> list[str]:
    picked = paths[::stride]
    folders = {os.path.dirname(p) for p in picked}
    for path in paths:
        if os.path.dirname(path) not in folders:
            folders.add(os.path.dirname(path))
            picked.append(path)
    return sorted(picked)


SAMPLED = _sample(PARSED, STRIDE)


@pytest.mark.parametrize("path", SAMPLED)
@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_checksums_equal_iff_ast_equal(path: str, data: st.DataObject) -> None:
    _, sites = _sites(path)
    kind = data.draw(st.sampled_from(sorted(sites)), label="kind")
    edit = data.draw(st.sampled_from(sites[kind]), label="site")
    same, quick = _check(path, edit(), kind)
    event(f"{kind}: ast {'equal' if same else 'changed'}")  # --hypothesis-show-statistics
    event(f"quick diff {'applied' if quick else 'fell back to the full diff'}")


@pytest.mark.parametrize("path", PARSED)
def test_unparse_round_trip_keeps_every_checksum(path: str) -> None:
    """Every file, reformatted by ``ast.unparse`` (comments, layout, quotes, numbers gone)."""
    variant = ast.unparse(ast.parse(_source(path))).encode("utf-8", "surrogatepass")
    assert _check(path, variant, "unparse")[0]
