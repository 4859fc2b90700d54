"""Index a source tree into *units* with semantic checksums, using libcst.

A unit is a function or method body (nested defs excluded), a class body, or a
module's top level; its id is ``path::qualname`` where ``qualname`` matches the
code object's ``co_qualname`` (``Outer.meth``, ``outer.<locals>.inner``) and the
module's top level is ``path::<module>``.

Checksums ignore comments, docstrings, parentheses and formatting, but not
defaults, decorators or literals. Each unit also carries *parts*: named
checksums of its pieces (``decorators``, ``signature``, ``body`` for functions;
one part per top-level statement for modules and class bodies, keyed by what
the statement binds, e.g. ``assign:MAX_LEN``), so change analysis can say what
kind of change it saw and which names it touched.

Line ownership: a ``def``/``class`` header and its decorators run when the
enclosing scope runs, so those lines belong to the parent unit; the body lines
belong to the function or class itself.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

import libcst as cst

from fastci.types import Checksum, RelPath, UnitId
# Re-exported: fastci.units stays the one public API of units.
from fastci.unit_lines import MODULE_QUALNAME as MODULE_QUALNAME
from fastci.unit_lines import LineIndex as LineIndex
from fastci.unit_lines import ParseFailure as ParseFailure
from fastci.unit_lines import line_index as line_index
from fastci.unit_lines import _AstDef, _body_start, _qualname

LOG = logging.getLogger(__name__)


# Nodes that carry only layout: skipped when hashing.
_LAYOUT_TYPES: tuple[type[cst.CSTNode], ...] = (
    cst.SimpleWhitespace,
    cst.ParenthesizedWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Newline,
    cst.Comment,
    cst.LeftParen,
    cst.RightParen,
    cst.Comma,
    cst.Semicolon,
    cst.Colon,
    cst.Dot,
    cst.Equal,
    cst.AssignEqual,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.IndentedBlock,
    cst.SimpleStatementLine,
)
# Layout nodes whose children still matter.
_CONTAINER_TYPES: tuple[type[cst.CSTNode], ...] = (cst.IndentedBlock, cst.SimpleStatementLine)
# Leaf nodes whose text is their meaning.
_VALUE_TYPES: tuple[type[cst.CSTNode], ...] = (
    cst.Name,
    cst.Integer,
    cst.Float,
    cst.Imaginary,
    cst.SimpleString,
    cst.FormattedStringText,
)


@dataclass(frozen=True)
class Unit:
    """One unit of source with its checksum and line span."""

    id: UnitId
    path: RelPath
    qualname: str
    kind: str  # "module" | "class" | "function"
    start: int  # first line, decorators included
    end: int  # last line
    body_start: int  # first line owned by this unit (module: 1)
    checksum: Checksum
    parts: tuple[tuple[str, Checksum], ...] = ()

    @property
    def parts_dict(self) -> dict[str, Checksum]:
        """The parts as a dict."""
        return dict(self.parts)


@dataclass(frozen=True)
class FileUnits:
    """The units of one parsed file plus a line -> unit map."""

    path: RelPath
    units: tuple[Unit, ...]
    digest: str  # sha256 of the raw file bytes
    _owner: tuple[int, ...] = field(default=(), repr=False)  # line-1 -> index into units

    def unit_for_line(self, line: int) -> Unit:
        """Return the innermost unit owning ``line`` (1-based); the module for unknown lines."""
        if 1 <= line <= len(self._owner):
            return self.units[self._owner[line - 1]]
        return self.units[0]

    def by_qualname(self) -> dict[str, Unit]:
        """Map qualname -> unit."""
        return {u.qualname: u for u in self.units}


IndexResult = Union[FileUnits, ParseFailure]


def unit_id(path: RelPath, qualname: str) -> UnitId:
    """Build a unit id from a repo-relative path and a qualname."""
    return f"{path}::{qualname}"


def split_unit_id(uid: UnitId) -> tuple[RelPath, str]:
    """Split ``path::qualname`` into its parts."""
    path, _, qual = uid.partition("::")
    return path, qual


# --------------------------------------------------------------------------- hashing


def _digest(chunks: Iterable[str]) -> Checksum:
    h = hashlib.blake2b(digest_size=12)
    for c in chunks:
        h.update(c.encode())
        h.update(b"\x00")
    return h.hexdigest()


def _is_docstring(stmt: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        expr = stmt.body[0]
        return isinstance(expr, cst.Expr) and isinstance(
            expr.value, (cst.SimpleString, cst.ConcatenatedString)
        )
    return False


def _hash_nodes(nodes: Sequence[cst.CSTNode]) -> Checksum:
    out: list[str] = []
    for n in nodes:
        _walk_nested(n, out)
    return _digest(out)


def _body_statements(body: cst.BaseSuite) -> list[cst.CSTNode]:
    if isinstance(body, cst.IndentedBlock):
        stmts: list[cst.CSTNode] = list(body.body)
    else:  # SimpleStatementSuite: `def f(): return 1`
        stmts = list(body.body)
    if stmts and _is_docstring(stmts[0]):
        stmts = stmts[1:]
    return stmts


def _header_stub(node: cst.FunctionDef | cst.ClassDef) -> str:
    """What the enclosing scope executes for a nested def/class: name + decorators."""
    deco = _hash_nodes([d.decorator for d in node.decorators])
    if isinstance(node, cst.ClassDef):
        bases = _hash_nodes([a for a in (*node.bases, *node.keywords)])
        return f"class:{node.name.value}:{deco}:{bases}"
    return f"def:{node.name.value}:{deco}"


def _stmt_tokens(stmt: cst.CSTNode) -> list[str]:
    """Tokens of a statement with nested def/class bodies replaced by their header stubs."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return [_header_stub(stmt)]
    out: list[str] = []
    _walk_nested(stmt, out)
    return out


_SKIP, _CONTAINER, _VALUE, _DEF, _NODE = range(5)
_TYPE_INFO: dict[type, tuple[int, tuple[str, ...]]] = {}


def _type_info(t: type) -> tuple[int, tuple[str, ...]]:
    """Classify a node type once: how to hash it and which fields to descend into."""
    info = _TYPE_INFO.get(t)
    if info is None:
        names = tuple(f.name for f in dataclasses.fields(t))
        if issubclass(t, (cst.FunctionDef, cst.ClassDef)):
            info = (_DEF, ())
        elif issubclass(t, _VALUE_TYPES):
            info = (_VALUE, ())
        elif issubclass(t, _CONTAINER_TYPES):
            info = (_CONTAINER, names)
        elif issubclass(t, _LAYOUT_TYPES):
            info = (_SKIP, ())
        else:
            info = (_NODE, names)
        _TYPE_INFO[t] = info
    return info


def _walk_nested(node: cst.CSTNode, out: list[str]) -> None:
    """Append a layout-free token stream of ``node``; nested def/class become header stubs."""
    kind, fields = _type_info(type(node))
    if kind == _SKIP:
        return
    if kind == _VALUE:
        out.append(f"{type(node).__name__}:{node.value}")  # type: ignore[attr-defined]
        return
    if kind == _DEF:
        out.append(_header_stub(node))  # type: ignore[arg-type]
        return
    if kind == _NODE:
        out.append(type(node).__name__)
        out.append("(")
    for name in fields:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            _walk_nested(value, out)
        elif isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    _walk_nested(item, out)
        elif kind == _NODE and isinstance(value, str):
            out.append(value)
    if kind == _NODE:
        out.append(")")


def _bound_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        names: list[str] = []
        for el in target.elements:
            names.extend(_bound_names(el.value))
        return names
    if isinstance(target, cst.Attribute):
        return [cst.Module([]).code_for_node(target)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []


def statement_key(stmt: cst.CSTNode) -> str:
    """A stable key for a top-level statement, naming what it binds."""
    if isinstance(stmt, cst.FunctionDef):
        return f"def:{stmt.name.value}"
    if isinstance(stmt, cst.ClassDef):
        return f"class:{stmt.name.value}"
    if isinstance(stmt, cst.SimpleStatementLine):
        names: list[str] = []
        kind = "stmt"
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                kind = "assign"
                for t in small.targets:
                    names.extend(_bound_names(t.target))
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                kind = "assign"
                names.extend(_bound_names(small.target))
            elif isinstance(small, (cst.Import, cst.ImportFrom)):
                kind = "import"
                if isinstance(small.names, cst.ImportStar):
                    names.append("*")
                else:
                    for alias in small.names:
                        ref = alias.asname.name if alias.asname else alias.name
                        names.append(cst.Module([]).code_for_node(ref))
        if names:
            return f"{kind}:{','.join(names)}"
    return f"stmt:{_digest(_stmt_tokens(stmt))}"


def _scope_parts(stmts: Sequence[cst.CSTNode]) -> tuple[tuple[str, Checksum], ...]:
    parts: dict[str, Checksum] = {}
    for stmt in stmts:
        key = statement_key(stmt)
        base, n = key, 2
        while key in parts:  # the same name bound twice: keep both, in order
            key = f"{base}#{n}"
            n += 1
        parts[key] = _digest(_stmt_tokens(stmt))
    return tuple(parts.items())


def _function_parts(node: cst.FunctionDef) -> tuple[tuple[str, Checksum], ...]:
    deco = _hash_nodes([d.decorator for d in node.decorators])
    sig_nodes: list[cst.CSTNode] = [node.params]
    if node.returns is not None:
        sig_nodes.append(node.returns)
    sig = _digest(["async" if node.asynchronous else "sync", _hash_nodes(sig_nodes)])
    body: list[str] = []
    for stmt in _body_statements(node.body):
        body.extend(_stmt_tokens(stmt))
    return (("decorators", deco), ("signature", sig), ("body", _digest(body)))


def _combine(parts: tuple[tuple[str, Checksum], ...]) -> Checksum:
    return _digest(f"{k}={v}" for k, v in parts)


# --------------------------------------------------------------------------- indexing


_DefNode = Union[cst.FunctionDef, cst.ClassDef]


def _cst_defs(stmts: Sequence[cst.CSTNode], scope: tuple[tuple[str, str], ...],
              out: list[tuple[_DefNode, tuple[tuple[str, str], ...]]]) -> None:
    """Collect def/class nodes in source order with their enclosing scopes."""
    for stmt in stmts:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            out.append((stmt, scope))
            kind = "function" if isinstance(stmt, cst.FunctionDef) else "class"
            _cst_defs(_suite(stmt.body), scope + ((stmt.name.value, kind),), out)
        elif isinstance(stmt, cst.BaseCompoundStatement):
            for child in stmt.children:
                if isinstance(child, cst.BaseSuite):
                    _cst_defs(_suite(child), scope, out)
                elif isinstance(child, (cst.BaseCompoundStatement, cst.ExceptHandler,
                                        cst.ExceptStarHandler, cst.Else, cst.Finally,
                                        cst.MatchCase)):
                    _cst_defs([child], scope, out)
        elif isinstance(stmt, (cst.ExceptHandler, cst.ExceptStarHandler, cst.Else,
                               cst.Finally, cst.MatchCase)):
            _cst_defs(_suite(stmt.body), scope, out)


def _suite(body: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(body.body)


def _ast_defs(tree: ast.AST) -> list[_AstDef]:
    defs = [n for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    defs.sort(key=lambda n: (n.lineno, n.col_offset))
    return defs


def _def_unit(path: RelPath, node: _DefNode, scope: tuple[tuple[str, str], ...],
              a: _AstDef) -> Unit:
    start = min([a.lineno] + [d.lineno for d in a.decorator_list])
    body_start = _body_start(a)
    if isinstance(node, cst.FunctionDef):
        kind = "function"
        parts = _function_parts(node)
    else:
        kind = "class"
        parts = (("header", _header_stub(node).split(":", 2)[2]),) + _scope_parts(
            _body_statements(node.body))
    qual = _qualname(scope, node.name.value)
    end = a.end_lineno or a.lineno
    return Unit(unit_id(path, qual), path, qual, kind, start, end, body_start,
                _combine(parts), parts)


def index_source(path: RelPath, source: str | bytes) -> IndexResult:
    """Index one file's source; a syntax error becomes a :class:`ParseFailure`.

    libcst gives the semantic hashes; the stdlib ``ast`` (C-fast) gives line
    positions, matched to libcst's def/class nodes by source order.
    """
    raw = source.encode() if isinstance(source, str) else source
    digest = hashlib.sha256(raw).hexdigest()
    try:
        module = cst.parse_module(raw)
        tree = ast.parse(raw)
    except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ParseFailure(path, f"{path}: does not parse: {first}")
    n_lines = raw.count(b"\n") + 1
    mparts = _scope_parts(_body_statements_module(module))
    units = [Unit(unit_id(path, MODULE_QUALNAME), path, MODULE_QUALNAME, "module", 1,
                  n_lines, 1, _combine(mparts), mparts)]
    cdefs: list[tuple[_DefNode, tuple[tuple[str, str], ...]]] = []
    _cst_defs(module.body, (), cdefs)
    adefs = _ast_defs(tree)
    if len(cdefs) != len(adefs) or any(c.name.value != a.name for (c, _), a in zip(cdefs, adefs)):
        return ParseFailure(path, f"{path}: libcst and ast disagree on its definitions")
    owner = [0] * n_lines
    for (node, scope), a in zip(cdefs, adefs):
        unit = _def_unit(path, node, scope, a)
        idx = len(units)
        units.append(unit)
        # Inner defs come later in source order, so they overwrite their parent's lines.
        for line in range(unit.body_start, unit.end + 1):
            if line <= n_lines:
                owner[line - 1] = idx
    return FileUnits(path, tuple(units), digest, tuple(owner))


def _body_statements_module(module: cst.Module) -> list[cst.CSTNode]:
    stmts: list[cst.CSTNode] = list(module.body)
    if stmts and _is_docstring(stmts[0]):
        stmts = stmts[1:]
    return stmts


def iter_python_files(root: Path, include: Sequence[str] = ("",)) -> Iterator[Path]:
    """Yield ``*.py`` files under ``root``/each include dir, skipping hidden and build dirs."""
    skip = {".git", ".venv", "__pycache__", "node_modules", ".fastci"}
    for inc in include:
        base = root / inc
        if base.is_file():
            yield base
            continue
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(root).parts
            if any(part in skip or part.startswith("bazel-") for part in rel):
                continue
            yield p


class UnitCache:
    """A content-digest cache of index results, one pickle file (e.g. ``.fastci/units.cache``).

    Keyed by ``(path, sha256 of the bytes)`` and invalidated as a whole when
    this module's source or libcst's version changes, so re-indexing an
    unchanged tree costs a read and a hash per file. A missing or unreadable
    cache file is an empty cache, never an error.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[tuple[RelPath, str], IndexResult] = {}
        self.dirty = False
        self.hits = 0
        try:
            with open(self.path, "rb") as f:
                key, entries = pickle.load(f)
            if key == _cache_key():
                self.entries = entries
        except (OSError, EOFError, ValueError, TypeError, AttributeError, ImportError,
                pickle.UnpicklingError):
            pass

    def get(self, rel: RelPath, digest: str) -> IndexResult | None:
        """The cached result for this content, if any."""
        hit = self.entries.get((rel, digest))
        self.hits += hit is not None
        return hit

    def put(self, rel: RelPath, digest: str, result: IndexResult) -> None:
        """Remember a result."""
        self.entries[(rel, digest)] = result
        self.dirty = True

    def save(self, keep: Iterable[tuple[RelPath, str]] | None = None) -> None:
        """Write the cache atomically (only ``keep`` entries if given); never raises."""
        if keep is not None:
            wanted = set(keep)
            if wanted != set(self.entries):
                self.entries = {k: v for k, v in self.entries.items() if k in wanted}
                self.dirty = True
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                pickle.dump((_cache_key(), self.entries), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError as exc:
            LOG.warning("%s: unit cache not saved (%s)", self.path, exc.strerror)


@functools.lru_cache(maxsize=1)
def _cache_key() -> str:
    here = Path(__file__).parent
    own = hashlib.sha256((here / "units.py").read_bytes()
                         + (here / "unit_lines.py").read_bytes()).hexdigest()[:16]
    return f"{own}:{getattr(cst, 'LIBCST_VERSION', '')}:{_libcst_version()}"


def _libcst_version() -> str:
    try:
        from importlib.metadata import version

        return version("libcst")
    except Exception:  # metadata missing: the module hash still guards the format
        return "?"


def index_files(root: Path, paths: Iterable[Path], *,
                cache: UnitCache | None = None) -> dict[RelPath, IndexResult]:
    """Index the given files (absolute or root-relative) into a path -> result map.

    With ``cache``, files whose content was indexed before are not parsed again
    (call ``cache.save()`` afterwards to persist new entries).
    """
    out: dict[RelPath, IndexResult] = {}
    for p in paths:
        ap = p if p.is_absolute() else root / p
        rel = ap.relative_to(root).as_posix()
        try:
            data = ap.read_bytes()
        except OSError as exc:
            out[rel] = ParseFailure(rel, f"{rel}: cannot read: {exc.strerror}")
            continue
        if cache is None:
            out[rel] = index_source(rel, data)
            continue
        digest = hashlib.sha256(data).hexdigest()
        hit = cache.get(rel, digest)
        if hit is None:
            hit = index_source(rel, data)
            cache.put(rel, digest, hit)
        out[rel] = hit
    return out


def index_tree(root: Path, include: Sequence[str] = ("",), *,
               cache: UnitCache | None = None) -> dict[RelPath, IndexResult]:
    """Index every Python file under ``root`` (optionally only under ``include`` dirs)."""
    return index_files(root, iter_python_files(root, include), cache=cache)
