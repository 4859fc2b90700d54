"""Index a source tree into *units* with semantic checksums of their stdlib ``ast``.

A unit is a function or method body (nested defs excluded), a class body, or a
module's top level; its id is ``path::qualname`` where ``qualname`` matches the
code object's ``co_qualname`` (``Outer.meth``, ``outer.<locals>.inner``) and the
module's top level is ``path::<module>``.

Checksums ignore comments, docstrings, parentheses and formatting, but nothing
the compiler sees (a docstring that holds a doctest, ``>>>``, is code a doctest
runner runs: it counts, as the unit's ``doctest`` part; any other docstring edit
stays free): two versions of a unit have equal checksums exactly when
their ``ast.dump`` (positions and docstrings left out) is equal, so ``x[:2]``
and ``x[2:]`` differ while ``'a'`` and ``"a"`` do not. Each unit also carries *parts*: named
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
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

from fastci.types import Checksum, RelPath, UnitId
# Re-exported: fastci.units.index stays the one public API of units.
from fastci.units.lines import MODULE_QUALNAME as MODULE_QUALNAME
from fastci.units.lines import LineIndex as LineIndex
from fastci.units.lines import ParseFailure as ParseFailure
from fastci.units.lines import line_index as line_index
from fastci.units.lines import UnitKind as UnitKind
from fastci.units.lines import AstDef, Scope, body_start, scoped_defs, scoped_qualname

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unit:
    """One unit of source with its checksum and line span."""

    id: UnitId
    path: RelPath
    qualname: str
    kind: UnitKind
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
#
# The checksums hash the stdlib ``ast`` of the source, which is the spec: two
# versions of a unit have equal checksums iff their ``ast.dump`` (no positions,
# no docstrings) is equal. Everything the compiler sees is in the token stream
# (every field of every node, named, so an absent optional child such as a
# slice bound, a relative-import level or an f-string ``=`` always shows); what
# it does not see (comments, formatting, parentheses, quote style, numeric
# spelling) never reaches it. An earlier version hashed a layout-stripped libcst
# tree and lost absent fields and punctuation (``x[:2]`` == ``x[2:]``); hashing
# the ast instead gets the compiler's equivalences for free (``elif`` == ``else:
# if``, ``x[(a, b)]`` == ``x[a, b]``, ``'a' 'b'`` == ``"ab"``) and is faster.

#: Part of the cache key: bump whenever the token stream of a unit changes, so
#: checksums computed by an older algorithm are never reused.
CHECKSUM_ALGORITHM = "ast-3"  # ast-3: docstrings holding a doctest count (``doctest`` part)

# ``ctx`` (Load/Store/Del) follows from the parent field; ``type_comment`` is
# always None without ``type_comments=True``.
_SKIP_FIELDS = frozenset({"ctx", "type_comment"})
_DEF_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FIELDS: dict[type, tuple[str, ...]] = {}
_NONE = "~"  # a None item inside a list (``kw_defaults``, ``Dict.keys`` of ``**m``)


def _digest(chunks: Iterable[str]) -> Checksum:
    data = "\x00".join(chunks).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _walk(node: ast.AST, out: list[str]) -> None:
    """Append ``node``'s token stream: ``Type field value ... )``; nested defs become stubs.

    Fields that are None or empty are left out; every present field is named, so
    ``Slice(upper=2)`` and ``Slice(lower=2)`` differ and the stream is unambiguous.
    Fields new in a later Python with an empty default leave checksums alone.
    """
    t = type(node)
    if t in _DEF_TYPES:
        out.extend(_header_tokens(node))  # type: ignore[arg-type]
        return
    fields = _FIELDS.get(t)
    if fields is None:
        fields = _FIELDS[t] = tuple(f for f in t._fields if f not in _SKIP_FIELDS)
    out.append(t.__name__)
    if not fields:  # operators, Pass, Break...: the name is all
        return
    for name in fields:
        value = getattr(node, name, None)
        if value is None:
            continue
        if type(value) is list:
            if not value:
                continue
            out.append(name)
            out.append("[")
            for item in value:
                if isinstance(item, ast.AST):
                    _walk(item, out)
                elif item is None:
                    out.append(_NONE)
                else:  # Global/Nonlocal names, MatchClass kwd_attrs...
                    out.append(repr(item))
            out.append("]")
        elif isinstance(value, ast.AST):
            out.append(name)
            _walk(value, out)
        else:  # identifiers, constants (repr keeps 1, 1.0, True and '1' apart), levels
            out.append(name)
            out.append(repr(value))
    out.append(")")


def _tokens(nodes: Iterable[ast.AST]) -> list[str]:
    out: list[str] = []
    for n in nodes:
        _walk(n, out)
    return out


def _header_tokens(node: AstDef) -> list[str]:
    """What the enclosing scope executes for a nested def/class: its name and decorators.

    Defaults and annotations are evaluated there too, but they are part of the
    function's own ``signature`` part, so a default change shows on the function.
    """
    # ``def`` and ``async def`` bind the same way; which one it is shows in the signature.
    out = ["class" if isinstance(node, ast.ClassDef) else "def", node.name, "decorators", "["]
    for d in node.decorator_list:
        _walk(d, out)
    out.append("]")
    if isinstance(node, ast.ClassDef):
        out.append("bases")
        out.append("[")
        for b in (*node.bases, *node.keywords):
            _walk(b, out)
        out.append("]")
    out.append(")")
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
        and isinstance(stmt.value.value, str)


def _body_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """A scope's statements without its docstring (what ``__doc__`` would hold)."""
    return body[1:] if body and _is_docstring(body[0]) else body


#: What marks a doctest example in a docstring (the stdlib ``doctest`` parser's prompt).
DOCTEST_PROMPT = ">>>"


def _doctest_part(body: list[ast.stmt]) -> tuple[tuple[str, Checksum], ...]:
    """The ``doctest`` part of a scope whose docstring holds a doctest, else nothing.

    A doctest runner (``pytest --doctest-modules``, ``python -m doctest``) runs the
    docstring's examples and compares their output: the text is code and expected
    results, so an edit to it must select the tests that ran it. A docstring without
    a ``>>>`` prompt is prose: its edits leave the checksum alone, as before.
    """
    if body and _is_docstring(body[0]):
        text = body[0].value.value  # type: ignore[attr-defined]
        if DOCTEST_PROMPT in text:
            return (("doctest", _digest([text])),)
    return ()


def _bound_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        names: list[str] = []
        for el in target.elts:
            names.extend(_bound_names(el))
        return names
    if isinstance(target, ast.Attribute):
        return [ast.unparse(target)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def statement_key(stmt: ast.stmt, tokens: Sequence[str] | None = None) -> str:
    """A stable key for a top-level statement, naming what it binds.

    ``tokens`` (the statement's token stream, if already computed) saves
    walking it again for a statement that binds nothing (``stmt:<digest>``).
    """
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"def:{stmt.name}"
    if isinstance(stmt, ast.ClassDef):
        return f"class:{stmt.name}"
    names: list[str] = []
    kind = "stmt"
    if isinstance(stmt, ast.Assign):
        kind = "assign"
        for t in stmt.targets:
            names.extend(_bound_names(t))
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        kind = "assign"
        names.extend(_bound_names(stmt.target))
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        kind = "import"
        names.extend(a.asname or a.name for a in stmt.names)
    if names:
        return f"{kind}:{','.join(names)}"
    return f"stmt:{_digest(tokens if tokens is not None else _tokens([stmt]))}"


def _scope_parts(stmts: Sequence[ast.stmt]) -> tuple[tuple[str, Checksum], ...]:
    parts: dict[str, Checksum] = {}
    for stmt in stmts:
        tokens = _tokens([stmt])
        key = statement_key(stmt, tokens)
        base, n = key, 2
        while key in parts:  # the same name bound twice: keep both, in order
            key = f"{base}#{n}"
            n += 1
        parts[key] = _digest(tokens)
    return tuple(parts.items())


def _function_parts(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, Checksum], ...]:
    deco = _digest(_tokens(node.decorator_list))
    sig = [type(node).__name__]  # def vs async def
    _walk(node.args, sig)
    if node.returns is not None:
        sig.append("returns")
        _walk(node.returns, sig)
    _extra_fields(node, _FUNCTION_FIELDS, sig)
    return (("decorators", deco), ("signature", _digest(sig)),
            ("body", _digest(_tokens(_body_statements(node.body))))) + _doctest_part(node.body)


def _class_header(node: ast.ClassDef) -> Checksum:
    out = ["decorators"] + _tokens(node.decorator_list) + ["bases"] + _tokens(node.bases) \
        + ["keywords"] + _tokens(node.keywords)
    _extra_fields(node, _CLASS_FIELDS, out)
    return _digest(out)


# The def/class fields hashed by name above; any other (``type_params`` since 3.12)
# goes to the signature or header when set, so no field of a def is ever dropped.
_FUNCTION_FIELDS = frozenset({"name", "args", "body", "decorator_list", "returns", "type_comment"})
_CLASS_FIELDS = frozenset({"name", "bases", "keywords", "body", "decorator_list"})


def _extra_fields(node: ast.AST, known: frozenset[str], out: list[str]) -> None:
    for name in node._fields:
        value = getattr(node, name, None)
        if name not in known and value:
            out.append(name)
            out.extend(_tokens(value if isinstance(value, list) else [value]))


def _combine(parts: tuple[tuple[str, Checksum], ...]) -> Checksum:
    return _digest(f"{k}={v}" for k, v in parts)


# --------------------------------------------------------------------------- indexing


def _def_unit(path: RelPath, a: AstDef, scope: Scope) -> Unit:
    start = min([a.lineno] + [d.lineno for d in a.decorator_list])
    if isinstance(a, ast.ClassDef):
        kind = UnitKind.CLASS
        parts = (("header", _class_header(a)),) + _doctest_part(a.body) \
            + _scope_parts(_body_statements(a.body))
    else:
        kind = UnitKind.FUNCTION
        parts = _function_parts(a)
    qual = scoped_qualname(scope, a.name)
    end = a.end_lineno or a.lineno
    return Unit(unit_id(path, qual), path, qual, kind, start, end, body_start(a),
                _combine(parts), parts)


def index_source(path: RelPath, source: str | bytes) -> IndexResult:
    """Index one file's source; a syntax error becomes a :class:`ParseFailure`.

    The stdlib ``ast`` gives both the checksums and the line positions, so the
    units are exactly those of :func:`fastci.units.lines.line_index`.
    """
    raw = source.encode() if isinstance(source, str) else source
    digest = hashlib.sha256(raw).hexdigest()
    try:
        tree = ast.parse(raw)
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ParseFailure(path, f"{path}: does not parse: {first}")
    n_lines = raw.count(b"\n") + 1
    try:
        mparts = _doctest_part(tree.body) + _scope_parts(_body_statements(tree.body))
        units = [Unit(unit_id(path, MODULE_QUALNAME), path, MODULE_QUALNAME, UnitKind.MODULE, 1,
                      n_lines, 1, _combine(mparts), mparts)]
        owner = [0] * n_lines
        for a, scope in scoped_defs(tree):
            unit = _def_unit(path, a, scope)
            idx = len(units)
            units.append(unit)
            # Inner defs come later in source order, so they overwrite their parent's lines.
            for line in range(unit.body_start, unit.end + 1):
                if line <= n_lines:
                    owner[line - 1] = idx
    except RecursionError:  # an expression nested past the interpreter's stack (generated code)
        return ParseFailure(path, f"{path}: too deeply nested to index")
    return FileUnits(path, _merge_same_names(units), digest, tuple(owner))


def _merge_same_names(units: list[Unit]) -> tuple[Unit, ...]:
    """Give defs that share a qualname one checksum covering all of them.

    A property getter and its setter, ``@overload`` stubs, or a def in both arms
    of an ``if`` share their ``co_qualname`` and so their unit id: the recorder
    cannot tell them apart, and whoever maps units by id keeps one of them. So
    each carries the combined parts (per part key, the checksums of every def
    in source order), and an edit to any of them changes the unit.
    """
    groups: dict[str, list[Unit]] = {}
    for u in units:
        groups.setdefault(u.qualname, []).append(u)
    if all(len(g) == 1 for g in groups.values()):
        return tuple(units)
    merged: dict[str, tuple[tuple[str, Checksum], ...]] = {}
    for qual, group in groups.items():
        if len(group) > 1:
            keys = list(dict.fromkeys(k for u in group for k, _ in u.parts))
            dicts = [u.parts_dict for u in group]
            merged[qual] = tuple((k, _digest([d.get(k, "-") for d in dicts])) for k in keys)
    return tuple(dataclasses.replace(u, checksum=_combine(merged[u.qualname]),
                                     parts=merged[u.qualname])
                 if u.qualname in merged else u for u in units)


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
    """A content-digest cache of index results, one JSON file (e.g. ``.fastci/units.cache``).

    Keyed by ``(path, sha256 of the bytes)`` and invalidated as a whole when
    :data:`CHECKSUM_ALGORITHM`, this module's source or the Python version
    (whose ``ast`` is hashed) changes, so re-indexing an
    unchanged tree costs a read and a hash per file.

    The file is untrusted input: it lives in the working tree, where a change
    can put anything. So it is data only (JSON, never pickle: unpickling runs
    code) and every entry is checked field by field on load. A missing,
    unreadable or malformed file is an empty cache and a malformed entry is a
    miss; loading never raises and never executes anything.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[tuple[RelPath, str], IndexResult] = {}
        self.dirty = False
        self.hits = 0
        self.rejected = 0  # entries of a readable cache file that failed validation
        for raw in _cache_entries(self.path, _CACHE_FORMAT, "unit cache"):
            entry = _decode_entry(raw)
            if entry is None:
                self.rejected += 1
            else:
                self.entries[entry[0]] = entry[1]
        if self.rejected:
            LOG.info("%s: %d malformed entries ignored", self.path, self.rejected)

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
        entries = [e for (rel, digest), result in self.entries.items()
                   if (e := _encode_entry(rel, digest, result)) is not None]
        doc = {"format": _CACHE_FORMAT, "key": _cache_key(), "entries": entries}
        self.dirty = not _write_json(self.path, doc, "unit cache")


class ChecksumCache:
    """Unit checksums by file content, one JSON file (``checksums.cache`` beside
    :class:`UnitCache`): what ``fastci ingest`` needs of a file, qualname -> checksum,
    without the parts and lines of every unit that make the unit cache ~20 times larger
    (115 MB and 8 s to load at 505,000 units; this 16 MB and well under a second).

    Untrusted like :class:`UnitCache` (data only, checked on load, a malformed entry is
    a miss, a bad file an empty cache) and keyed the same way, so both go stale together.
    """

    FORMAT = "fastci-checksums-cache"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.entries: dict[tuple[RelPath, str], dict[str, str]] = {}
        self.dirty = False
        for raw in _cache_entries(self.path, self.FORMAT, "checksum cache"):
            if not (isinstance(raw, list) and len(raw) == 4 and all(isinstance(x, str) for x in raw)):
                continue
            rel, digest, quals, sums = raw
            names, values = quals.split("\n"), sums.split("\n")
            if rel and len(digest) == 64 and _HEX.issuperset(digest) and quals \
                    and len(names) == len(values) and len(set(names)) == len(names):
                self.entries[(rel, digest)] = dict(zip(names, values))

    def get(self, rel: RelPath, digest: str) -> dict[str, str] | None:
        """Qualname -> checksum of this content, if known."""
        return self.entries.get((rel, digest))

    def put(self, rel: RelPath, digest: str, sums: dict[str, str]) -> None:
        """Remember the checksums of a file's units (none: nothing to remember)."""
        if sums and all("\n" not in q for q in sums):
            self.entries[(rel, digest)] = sums
            self.dirty = True

    def save(self) -> None:
        """Write the cache atomically if it changed; never raises."""
        if not self.dirty:
            return
        entries = [[rel, digest, "\n".join(sums), "\n".join(sums.values())]
                   for (rel, digest), sums in self.entries.items()]
        doc = {"format": self.FORMAT, "key": _cache_key(), "entries": entries}
        self.dirty = not _write_json(self.path, doc, "checksum cache")


def _cache_entries(path: Path, kind: str, what: str) -> list[object]:
    """The raw entries of the cache file at ``path`` (each still to be checked); none
    when it is missing, not a regular file, not JSON, another format or stale."""
    data = _read_regular_file(path)
    if data is None:
        return []
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # not JSON (an old pickle), or nested to overflow
        LOG.info("%s: not a %s, ignored", path, what)
        return []
    if not isinstance(doc, dict) or doc.get("format") != kind \
            or doc.get("key") != _cache_key() or not isinstance(doc.get("entries"), list):
        return []
    entries: list[object] = doc["entries"]
    return entries


def _write_json(path: Path, doc: object, what: str) -> bool:
    """Write ``doc`` to ``path`` atomically; False (and a warning) when it cannot be."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A fresh, exclusively created name: never follows a link a change put in .fastci/.
        fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from a CI cache step
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as exc:
        LOG.warning("%s: %s not saved (%s)", path, what, exc.strerror or exc)
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


#: The ``format`` field of a cache file; its layout changes with this module's source,
#: which is part of the key, so the name only tells a unit cache from other JSON.
_CACHE_FORMAT = "fastci-units-cache"
_HEX = frozenset("0123456789abcdef")
_KINDS = {k.value: k for k in UnitKind}


def _read_regular_file(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO or device), else None.

    A change can commit a symlink to ``/dev/zero`` or a FIFO in its place;
    reading either would hang or exhaust memory.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _encode_entry(rel: RelPath, digest: str, result: IndexResult) -> dict[str, object] | None:
    """One cache entry as JSON data; None for a result that would not load back equal."""
    if isinstance(result, ParseFailure):
        if result.path != rel:
            return None
        return {"path": rel, "digest": digest, "failure": result.message}
    if result.path != rel or result.digest != digest \
            or any(u.path != rel or u.id != unit_id(rel, u.qualname) for u in result.units):
        return None
    units = [[u.qualname, u.kind.value, u.start, u.end, u.body_start, u.checksum,
              [[k, v] for k, v in u.parts]] for u in result.units]
    return {"path": rel, "digest": digest, "units": units, "owner": list(result._owner)}


def _is_int(v: object, low: int) -> bool:
    return type(v) is int and v >= low  # bool is an int subclass: type() keeps it out


def _decode_entry(raw: object) -> tuple[tuple[RelPath, str], IndexResult] | None:
    """Check one entry field by field; None (a miss) for anything malformed."""
    if not isinstance(raw, dict):
        return None
    rel, digest = raw.get("path"), raw.get("digest")
    if not isinstance(rel, str) or not rel or not isinstance(digest, str) \
            or len(digest) != 64 or not _HEX.issuperset(digest):
        return None
    if "failure" in raw:
        message = raw["failure"]
        if not isinstance(message, str) or "units" in raw:
            return None
        return (rel, digest), ParseFailure(rel, message)
    rows, owner = raw.get("units"), raw.get("owner")
    if not isinstance(rows, list) or not rows or not isinstance(owner, list):
        return None
    units: list[Unit] = []
    for row in rows:
        unit = _decode_unit(rel, row)
        if unit is None:
            return None
        units.append(unit)
    # index_source always puts the module first: unit_for_line falls back to units[0].
    if units[0].kind != UnitKind.MODULE or units[0].qualname != MODULE_QUALNAME:
        return None
    n = len(units)
    if not all(type(i) is int and 0 <= i < n for i in owner):
        return None
    return (rel, digest), FileUnits(rel, tuple(units), digest, tuple(owner))


def _decode_unit(rel: RelPath, row: object) -> Unit | None:
    if not isinstance(row, list) or len(row) != 7:
        return None
    qualname, kind, start, end, body, checksum, parts = row
    if not isinstance(qualname, str) or not qualname or not isinstance(kind, str) \
            or kind not in _KINDS or not isinstance(checksum, str) or not isinstance(parts, list):
        return None
    if not (_is_int(start, 1) and _is_int(end, start) and _is_int(body, 1)):
        return None
    pairs: list[tuple[str, Checksum]] = []
    for part in parts:
        if not isinstance(part, list) or len(part) != 2 \
                or not isinstance(part[0], str) or not isinstance(part[1], str):
            return None
        pairs.append((part[0], part[1]))
    return Unit(unit_id(rel, qualname), rel, qualname, _KINDS[kind], start, end, body,
                checksum, tuple(pairs))


@functools.lru_cache(maxsize=1)
def _cache_key() -> str:
    """Cached results are valid only for this algorithm, this code and this Python's ``ast``."""
    here = Path(__file__).parent
    own = hashlib.sha256((here / "index.py").read_bytes()
                         + (here / "lines.py").read_bytes()).hexdigest()[:16]
    return f"{CHECKSUM_ALGORITHM}:{own}:py{sys.version_info[0]}.{sys.version_info[1]}"


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
