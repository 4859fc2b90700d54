"""Units and checksums on tricky sources (fastci.units.index)."""

from __future__ import annotations

import json
import os
import pickle
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from fastci.changes.semantic_diff import diff_sources
from fastci.evidence.store.ingest import ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.units.index import (CHECKSUM_ALGORITHM, MODULE_QUALNAME, FileUnits, LineIndex, ParseFailure,
                          UnitCache, _cache_key, index_files, index_source, index_tree, line_index,
                          split_unit_id, unit_id)
from fastci.units.lines import UnitKind

BASE = '''\
"""Module doc."""
import os
from x import (a,
               b as c)

MAX_LEN = 128


@register("linear", priority=1)
def linear(x, scale=2.0):
    """Apply a scale."""
    # a comment
    def inner(y):
        return y * scale
    return inner(x) + MAX_LEN


class Layer(Base):
    """A layer."""

    dim = 64
    names = ["a", "b"]

    def forward(self, x):
        return x + self.dim

    @property
    def size(self):
        return self.dim

    @staticmethod
    async def fetch(url, *, timeout=3):
        async with session() as s:
            return await s.get(url)


if os.environ.get("X"):
    def maybe():
        return 1
'''


def units(src: str) -> dict[str, str]:
    res = index_source("pkg/m.py", textwrap.dedent(src))
    assert isinstance(res, FileUnits), res
    return {u.qualname: u.checksum for u in res.units}


def changed(before: str, after: str) -> set[str]:
    a, b = units(before), units(after)
    return {q for q in a.keys() | b.keys() if a.get(q) != b.get(q)}


def test_unit_kinds_are_a_closed_str_enum() -> None:
    res = index_source("pkg/m.py", BASE)
    assert isinstance(res, FileUnits)
    by = res.by_qualname()
    assert by[MODULE_QUALNAME].kind is UnitKind.MODULE
    assert by["Layer"].kind is UnitKind.CLASS
    assert {by[q].kind for q in ("linear", "linear.<locals>.inner", "Layer.forward")} \
        == {UnitKind.FUNCTION}
    assert all(isinstance(u.kind, UnitKind) for u in res.units)
    # A str enum: equal to the strings earlier code (and recorded data) used.
    assert UnitKind.FUNCTION == "function" and f"{UnitKind.CLASS}" == "class"
    assert {k.value for k in UnitKind} == {"module", "class", "function"}


def test_units_and_qualnames_match_code_objects() -> None:
    res = index_source("pkg/m.py", BASE)
    assert isinstance(res, FileUnits)
    by = res.by_qualname()
    assert set(by) == {MODULE_QUALNAME, "linear", "linear.<locals>.inner", "Layer",
                       "Layer.forward", "Layer.size", "Layer.fetch", "maybe"}
    assert by["linear"].kind == "function" and by["Layer"].kind == "class"
    assert by[MODULE_QUALNAME].kind == "module"
    assert by["linear"].id == "pkg/m.py::linear" == unit_id("pkg/m.py", "linear")
    assert split_unit_id(by["Layer.forward"].id) == ("pkg/m.py", "Layer.forward")
    # The qualnames are exactly the code objects' co_qualname.
    ns: dict[str, object] = {}
    code = compile(BASE, "m.py", "exec")
    quals = {c.co_qualname for c in _codes(code)}
    assert {q for q in by if q != MODULE_QUALNAME} <= quals
    del ns


def _codes(code):  # type: ignore[no-untyped-def]
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_qualname"):
            yield from _codes(const)


def test_line_spans_and_ownership() -> None:
    res = index_source("pkg/m.py", BASE)
    assert isinstance(res, FileUnits)
    lines = BASE.splitlines()

    def owner(text: str) -> str:
        return res.unit_for_line(lines.index(text) + 1).qualname

    by = res.by_qualname()
    assert by["linear"].start == lines.index('@register("linear", priority=1)') + 1
    assert owner('@register("linear", priority=1)') == MODULE_QUALNAME  # decorators: parent
    assert owner("def linear(x, scale=2.0):") == MODULE_QUALNAME  # header: parent
    assert owner("    return inner(x) + MAX_LEN") == "linear"
    assert owner("        return y * scale") == "linear.<locals>.inner"
    assert owner("    def inner(y):") == "linear"  # nested header belongs to the outer body
    assert owner("    dim = 64") == "Layer"
    assert owner("    @property") == "Layer"
    assert owner("        return self.dim") == "Layer.size"
    assert owner("            return await s.get(url)") == "Layer.fetch"
    assert owner("        return 1") == "maybe"
    assert owner("MAX_LEN = 128") == MODULE_QUALNAME
    assert res.unit_for_line(10_000).qualname == MODULE_QUALNAME
    assert by["Layer"].end == lines.index("            return await s.get(url)") + 1


@pytest.mark.parametrize("after", [
    # comments, blank lines, docstrings, formatting, parentheses, trailing commas
    BASE.replace("    # a comment\n", "").replace('"""Apply a scale."""', '"""Other doc."""'),
    BASE.replace("return inner(x) + MAX_LEN", "return (inner(x)\n            + MAX_LEN)  # why"),
    BASE.replace('names = ["a", "b"]', 'names = [\n        "a",\n        "b",\n    ]'),
    BASE.replace("x + self.dim", "x+self.dim"),
    BASE.replace('"""A layer."""\n', ""),
    BASE.replace('"""Module doc."""', '"""Changed module doc."""'),
    BASE.replace("\n\n\nclass Layer", "\n# banner\n\nclass Layer"),
])
def test_cosmetic_edits_keep_every_checksum(after: str) -> None:
    assert changed(BASE, after) == set()


@pytest.mark.parametrize("after, expected", [
    (BASE.replace("scale=2.0", "scale=3.0"), {"linear"}),  # default
    (BASE.replace('@register("linear", priority=1)', '@register("linear", priority=2)'),
     {"linear", MODULE_QUALNAME}),  # decorator literal: the function and the def statement
    (BASE.replace("MAX_LEN = 128", "MAX_LEN = 256"), {MODULE_QUALNAME}),  # module literal
    (BASE.replace("dim = 64", "dim = 32"), {"Layer"}),  # class attribute
    (BASE.replace("return y * scale", "return y / scale"), {"linear.<locals>.inner"}),
    (BASE.replace("timeout=3", "timeout=4"), {"Layer.fetch"}),
    (BASE.replace("async def fetch", "def fetch").replace("async with", "with")
     .replace("await s.get", "s.get"), {"Layer.fetch"}),
    (BASE.replace("    @property\n", ""), {"Layer", "Layer.size"}),
    (BASE.replace("class Layer(Base)", "class Layer(Other)"), {"Layer", MODULE_QUALNAME}),
    (BASE.replace('"a", "b"', '"a", "c"'), {"Layer"}),
])
def test_semantic_edits_change_exactly_the_owner(after: str, expected: set[str]) -> None:
    assert changed(BASE, after) == expected


def test_nested_body_edit_leaves_parent_alone() -> None:
    after = BASE.replace("return y * scale", "return y * scale * 1")
    assert changed(BASE, after) == {"linear.<locals>.inner"}


def test_parts_name_what_changed() -> None:
    res_a = index_source("m.py", BASE)
    res_b = index_source("m.py", BASE.replace("MAX_LEN = 128", "MAX_LEN = 1"))
    assert isinstance(res_a, FileUnits) and isinstance(res_b, FileUnits)
    pa = res_a.units[0].parts_dict
    pb = res_b.units[0].parts_dict
    assert {k for k in pa if pa[k] != pb.get(k)} == {"assign:MAX_LEN"}
    assert "import:a,c" in pa and "def:linear" in pa and "class:Layer" in pa
    fa = res_a.by_qualname()["linear"].parts_dict
    fb = index_source("m.py", BASE.replace("scale=2.0", "scale=1.0"))
    assert isinstance(fb, FileUnits)
    diff = {k for k, v in fb.by_qualname()["linear"].parts_dict.items() if fa[k] != v}
    assert diff == {"signature"}


def test_syntax_error_is_a_parse_failure() -> None:
    res = index_source("bad.py", "def f(:\n")
    assert isinstance(res, ParseFailure)
    assert res.message.startswith("bad.py: does not parse")


def test_index_tree_and_cache(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(BASE)
    (tmp_path / "pkg" / "b.py").write_text("x = (\n")
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "c.py").write_text("y = 1\n")
    plain = index_tree(tmp_path)
    assert set(plain) == {"pkg/a.py", "pkg/b.py"}
    assert isinstance(plain["pkg/b.py"], ParseFailure)

    cache_file = tmp_path / ".fastci" / "units.cache"
    cache = UnitCache(cache_file)
    first = index_tree(tmp_path, cache=cache)
    cache.save()
    assert cache.hits == 0 and cache_file.exists()
    again = UnitCache(cache_file)
    second = index_tree(tmp_path, cache=again)
    assert again.hits == 2 and second == first == plain
    # An edit misses the cache and is re-indexed.
    (tmp_path / "pkg" / "a.py").write_text(BASE.replace("dim = 64", "dim = 1"))
    third = index_files(tmp_path, [Path("pkg/a.py")], cache=again)
    assert again.hits == 2
    a1, a3 = first["pkg/a.py"], third["pkg/a.py"]
    assert isinstance(a1, FileUnits) and isinstance(a3, FileUnits)
    assert a1.by_qualname()["Layer"].checksum != a3.by_qualname()["Layer"].checksum
    # A corrupt cache file is an empty cache.
    cache_file.write_bytes(b"not a cache")
    assert UnitCache(cache_file).entries == {}


@pytest.mark.parametrize("src", [BASE, "x = 1\n", "def f(): pass\nclass A:\n    def g(self): pass\n",
                                 "class A:\n    class B:\n        def c(self):\n            def d():\n"
                                 "                return 1\n            return d\n"])
def test_line_index_agrees_with_index_source(src: str) -> None:
    full = index_source("m.py", src)
    light = line_index("m.py", src)
    assert isinstance(full, FileUnits) and isinstance(light, LineIndex)
    assert set(light.qualnames) == {u.qualname for u in full.units}
    for line in range(0, src.count("\n") + 3):
        assert light.qualname_for_line(line) == full.unit_for_line(line).qualname, line


def test_line_index_syntax_error() -> None:
    assert isinstance(line_index("bad.py", "def f(:\n"), ParseFailure)


# --------------------------------------------------------------------------- invisible edits
# Each pair differs in what the compiler sees (its ast), so a unit must change; the
# checksums once hashed a layout-stripped libcst tree that dropped absent fields
# (slice bounds) and punctuation (import dots, the f-string `=`).


def fn(body: str, head: str = "def f(x, tokens, a, b, g):") -> str:
    return "import os\n\n\n" + head + "\n" + textwrap.indent(body, "    ") + "\n"


def reported(old: str, new: str) -> set[str]:
    """Qualnames ``diff_sources`` reports, checking the quick and the full diff agree."""
    quick = diff_sources("pkg/m.py", old.encode(), new.encode(), quick=True)
    full = diff_sources("pkg/m.py", old.encode(), new.encode(), quick=False)
    assert quick.failure is None and full.failure is None
    assert {(u.unit, u.kinds, u.after) for u in quick.units} == \
        {(u.unit, u.kinds, u.after) for u in full.units}
    return {u.qualname for u in full.units}


SEMANTIC_PAIRS = [
    # slice bounds: off-by-one slicing (label shift, causal masks, KV-cache windows)
    ("return x[:2]", "return x[2:]"),
    ("return x[2:]", "return x[::2]"),
    ("return x[:2]", "return x[::2]"),
    ("return x[-1:]", "return x[:-1]"),
    ("return tokens[:, 1:]", "return tokens[:, :1]"),
    ("return tokens[..., :-1]", "return tokens[..., 1:]"),
    ("return x[1:2]", "return x[1:2:1]"),
    ("return x[...]", "return x[:]"),
    # f-strings: the `=` specifier, conversions, format specs
    ('return f"{x=}"', 'return f"{x}"'),
    ('return f"{x!r}"', 'return f"{x}"'),
    ('return f"{x:>3}"', 'return f"{x:<3}"'),
    # calls: star-args, keyword vs positional, order
    ("return g(*a)", "return g(a)"),
    ("return g(**a)", "return g(*a)"),
    ("return g(a=1)", "return g(1)"),
    ("return g(a, b)", "return g(b, a)"),
    ("return {**a, **b}", "return {**b, **a}"),
    # operators, await, yield from, walrus, lambda, raise from
    ("return a < b", "return a <= b"),
    ("return a is b", "return a == b"),
    ("return not a", "return a"),
    ("return 1e3", "return 1000"),
    ("yield from a", "yield a"),
    ("if (y := g()):\n    return y", "if g():\n    return g()"),
    ("return lambda: x", "return lambda x: x"),
    ("raise ValueError from None", "raise ValueError"),
    ("try:\n    pass\nexcept* ValueError:\n    pass", "try:\n    pass\nexcept ValueError:\n    pass"),
]


@pytest.mark.parametrize("old, new", SEMANTIC_PAIRS)
def test_semantic_pairs_are_changes(old: str, new: str) -> None:
    assert reported(fn(old), fn(new)) == {"f"}


@pytest.mark.parametrize("old, new, expected", [
    # relative-import levels and the module it names
    ("from .a import b\n", "from ..a import b\n", {MODULE_QUALNAME}),
    ("from .a import b\n", "from a import b\n", {MODULE_QUALNAME}),
    ("from . import b\n", "from .. import b\n", {MODULE_QUALNAME}),
    ("import a.b as c\n", "from a import b as c\n", {MODULE_QUALNAME}),
    # signatures: *, /, *args, **kwargs, defaults, async
    (fn("pass", "def f(a, b):"), fn("pass", "def f(a, *, b):"), {"f"}),
    (fn("pass", "def f(a, b):"), fn("pass", "def f(a, /, b):"), {"f"}),
    (fn("pass", "def f(*a):"), fn("pass", "def f(a):"), {"f"}),
    (fn("pass", "def f(**a):"), fn("pass", "def f(*a):"), {"f"}),
    (fn("pass", "def f(a, b=1):"), fn("pass", "def f(a=1, b=2):"), {"f"}),
    (fn("pass", "def f(*, a=1, b):"), fn("pass", "def f(*, a, b=1):"), {"f"}),
    (fn("for i in x:\n    pass", "async def f(x):"),
     fn("async for i in x:\n    pass", "async def f(x):"), {"f"}),
    (fn("with x:\n    pass", "async def f(x):"),
     fn("async with x:\n    pass", "async def f(x):"), {"f"}),
    (fn("return await x", "async def f(x):"), fn("return x", "async def f(x):"), {"f"}),
    ("def f():\n    a = 1\n\n    def h():\n        global a\n",
     "def f():\n    a = 1\n\n    def h():\n        nonlocal a\n", {"f.<locals>.h"}),
    # class headers and decorators
    ("class A(B, metaclass=M):\n    pass\n", "class A(B, M):\n    pass\n", {"A", MODULE_QUALNAME}),
    ("@d\ndef f():\n    pass\n", "@d()\ndef f():\n    pass\n", {"f", MODULE_QUALNAME}),
    # a property's getter and setter share one qualname (and unit id): both count
    ("class A:\n    @property\n    def x(self):\n        return 1\n\n"
     "    @x.setter\n    def x(self, v):\n        pass\n",
     "class A:\n    @property\n    def x(self):\n        return 2\n\n"
     "    @x.setter\n    def x(self, v):\n        pass\n", {"A.x"}),
])
def test_semantic_edits_elsewhere_are_changes(old: str, new: str, expected: set[str]) -> None:
    assert reported(old, new) == expected


@pytest.mark.parametrize("old, new", [
    # equal for the compiler: quote style, prefixes that give the same value, concatenation
    ("return 'a'", 'return "a"'),
    ("return r'\\n'", "return '\\\\n'"),
    ("return 'ab'", "return ('a'\n        'b')"),
    ("return b'a'", 'return b"a"'),
    ("return f'{x}'", 'return f"{x}"'),
    ('return f"{x=}"', 'return f"x={x!r}"'),
    # numeric spellings
    ("return 1_000", "return 1000"),
    ("return 0x10", "return 16"),
    ("return 1.0", "return 1.00"),
    # parentheses, subscript tuples, empty steps, elif
    ("return (a + b)", "return a + b"),
    ("return x[(1, 2)]", "return x[1, 2]"),
    ("return x[1:2:]", "return x[1:2]"),
    ("if a:\n    pass\nelse:\n    if b:\n        pass", "if a:\n    pass\nelif b:\n    pass"),
    # comments, trailing commas, docstrings
    ("return g(a, b)", "return g(\n    a,  # first\n    b,\n)"),
    ('"""Doc."""\nreturn 1', "'''Other doc.'''\nreturn 1"),
])
def test_spellings_the_compiler_does_not_see_are_not_changes(old: str, new: str) -> None:
    assert reported(fn(old), fn(new)) == set()


def test_class_parens_and_module_docstring_quote_style_are_not_changes() -> None:
    old = '"""Doc."""\nclass A():\n    X = (1)\n'
    assert reported(old, "'Doc.'\nclass A:\n    X = 1\n") == set()


def test_quick_diff_keeps_string_margins() -> None:
    """A re-hashed span is not dedented: that rewrote whitespace-only lines inside strings."""
    old = 'class A:\n    def f(self):\n        return """x\n        \n        y"""\n'
    new = old.replace('x\n        \n', 'x\n    \n')
    assert reported(old, new) == {"A.f"}


def test_quick_diff_counts_lines_as_the_compiler_does() -> None:
    """A form feed inside a string is no line break (str.splitlines shifted every span)."""
    old = 'X = "\x0c"\n\n\ndef f():\n    return 0\n\n\ndef g():\n    a = 1\n    return a\n'
    assert reported(old, old.replace("a = 1", "a = 2")) == {"g"}


def test_checksums_do_not_depend_on_the_position() -> None:
    """The quick diff re-hashes a span alone; its checksum is the one the full index gives."""
    inner = "class A:\n    def f(self):\n        return x[1:]\n"
    top = index_source("m.py", inner)
    nested = index_source("m.py", "if X:\n" + textwrap.indent(inner, "    "))
    assert isinstance(top, FileUnits) and isinstance(nested, FileUnits)
    assert top.by_qualname()["A.f"].checksum == nested.by_qualname()["A.f"].checksum


def test_cache_key_names_the_algorithm(tmp_path: Path) -> None:
    """Checksums cached by another algorithm are never reused."""
    cache_file = tmp_path / "units.cache"
    (tmp_path / "a.py").write_text("x = 1\n")
    cache = UnitCache(cache_file)
    index_tree(tmp_path, cache=cache)
    cache.save()
    assert CHECKSUM_ALGORITHM in _cache_key()
    doc = json.loads(cache_file.read_text())
    assert doc["key"] == _cache_key() and doc["entries"]
    assert len(UnitCache(cache_file).entries) == 1
    doc["key"] = doc["key"].replace(CHECKSUM_ALGORITHM, "libcst-1")  # the same entries, older key
    cache_file.write_text(json.dumps(doc))
    assert UnitCache(cache_file).entries == {}


# --------------------------------------------------------------------------- the cache is untrusted


class _Payload:
    """Unpickling this creates ``marker``: the shape of a crafted cache that runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def write_pickle_payload(cache_file: Path, marker: Path) -> None:
    """A pickle cache as the old loader read it, ``(key, entries)``, whose loading creates ``marker``."""
    probe = marker.with_name(marker.name + ".probe")
    pickle.loads(pickle.dumps(_Payload(probe)))  # the payload is live: unpickling it runs it
    assert probe.exists()
    probe.unlink()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_bytes(pickle.dumps((_cache_key(), {("a.py", "0" * 64): _Payload(marker)})))


def test_a_pickled_payload_in_the_cache_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cache_file = tmp_path / ".fastci" / "units.cache"
    write_pickle_payload(cache_file, marker)
    cache = UnitCache(cache_file)
    assert cache.entries == {} and cache.get("a.py", "0" * 64) is None
    (tmp_path / "a.py").write_text("x = 1\n")
    index_tree(tmp_path, cache=cache)  # a miss: indexed from the source, the cache rewritten
    cache.save()
    assert len(UnitCache(cache_file).entries) == 1 and not marker.exists()


def test_ingest_never_runs_a_pickled_cache(tmp_path: Path) -> None:
    """``fastci ingest`` reads ``root/.fastci/units.cache`` for the recorded files' checksums."""
    marker = tmp_path / "pwned"
    root = tmp_path / "repo"
    write_pickle_payload(root / ".fastci" / "units.cache", marker)
    with EvidenceStore.open(tmp_path / "evidence.db", create=True) as store:
        ingest(store, [], source="test", commit="c" * 40, root=root)
    assert not marker.exists()


def _saved_cache(tmp_path: Path, files: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cache_file = tmp_path / "units.cache"
    cache = UnitCache(cache_file)
    index_tree(tmp_path, cache=cache)
    cache.save()
    return cache_file, json.loads(cache_file.read_text())


@pytest.mark.parametrize("data", [
    b"", b"\x00\xff\xfe garbage", b"null", b"[]", b"{}", b'{"format": "fastci-units-cache"',
    b"[" * 100_000 + b"]" * 100_000, b'{"format": "fastci-units-cache", "key": 1, "entries": []}',
])
def test_a_garbage_cache_file_is_an_empty_cache(tmp_path: Path, data: bytes) -> None:
    cache_file = tmp_path / "units.cache"
    cache_file.write_bytes(data)
    assert UnitCache(cache_file).entries == {}


def test_a_truncated_cache_file_is_an_empty_cache(tmp_path: Path) -> None:
    cache_file, _ = _saved_cache(tmp_path, {"a.py": BASE})
    data = cache_file.read_bytes()
    for cut in (1, len(data) // 2, len(data) - 1):
        cache_file.write_bytes(data[:cut])
        assert UnitCache(cache_file).entries == {}


def test_a_cache_that_is_not_a_regular_file_is_empty(tmp_path: Path) -> None:
    """A change can commit a link to a device in the cache's place; reading it must not hang."""
    link = tmp_path / "link.cache"
    link.symlink_to("/dev/zero")
    assert UnitCache(link).entries == {}
    fifo = tmp_path / "fifo.cache"
    os.mkfifo(fifo)
    assert UnitCache(fifo).entries == {}
    assert UnitCache(tmp_path).entries == {}  # a directory


def _entry(doc: dict[str, Any], path: str) -> dict[str, Any]:
    return next(e for e in doc["entries"] if e["path"] == path)


def _set_row(i: int, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        _entry(doc, "b.py")["units"][-1][i] = value
    return edit


def _set_entry(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        _entry(doc, "b.py")[key] = value
    return edit


@pytest.mark.parametrize("edit", [
    _set_row(0, 7),  # qualname
    _set_row(1, "lambda"),  # kind
    _set_row(2, "3"),  # start
    _set_row(2, True),  # start: a bool is not a line
    _set_row(3, 0),  # end before start
    _set_row(4, 1.5),  # body_start
    _set_row(5, None),  # checksum
    _set_row(6, [["body"]]),  # parts
    _set_row(6, {"body": "x"}),
    _set_entry("owner", [0, 99]),  # a line owned by no unit
    _set_entry("owner", "0"),
    _set_entry("units", []),
    _set_entry("units", [["f", "function", 1, 2, 2, "c", []]]),  # no module unit first
    _set_entry("digest", "not-hex"),
    _set_entry("failure", "and units too"),
])
def test_a_wrong_typed_field_misses_only_its_entry(
        tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    cache_file, doc = _saved_cache(tmp_path, {"a.py": BASE, "b.py": "def f():\n    return 1\n"})
    edit(doc)
    cache_file.write_text(json.dumps(doc))
    cache = UnitCache(cache_file)
    assert cache.rejected == 1 and len(cache.entries) == 1
    result = index_tree(tmp_path, cache=cache)
    assert cache.hits == 1  # a.py still hits; b.py is indexed again
    assert result == index_tree(tmp_path)


def test_malformed_entries_are_skipped_one_by_one(tmp_path: Path) -> None:
    cache_file, doc = _saved_cache(tmp_path, {"a.py": BASE})
    doc["entries"] = ["x", 1, None, {"path": "a.py"}, {"path": ["a.py"]}, *doc["entries"]]
    cache_file.write_text(json.dumps(doc))
    cache = UnitCache(cache_file)
    assert cache.rejected == 5 and len(cache.entries) == 1


@pytest.mark.parametrize("src", [
    BASE, "x = 1\n", "", "def f(): pass\nclass A:\n    def g(self): pass\n",
    # The same qualname twice (merged parts) and nested scopes.
    "class A:\n    @property\n    def v(self):\n        return 1\n    @v.setter\n    def v(self, x):\n"
    "        pass\n    class B:\n        def c(self):\n            def d():\n                return 1\n",
    "async def f():\n    '''doc'''\n    await g()\n",
    "x = (\n",  # a parse failure
    "name = '\u00e9\U0001f600'\n",
])
def test_cached_results_round_trip_equal(tmp_path: Path, src: str) -> None:
    (tmp_path / "m.py").write_text(src, encoding="utf-8")
    (tmp_path / "\u00e9t\u00e9.py").write_text("x = 1\n")
    cache_file = tmp_path / "units.cache"
    fresh = index_tree(tmp_path)
    cache = UnitCache(cache_file)
    index_tree(tmp_path, cache=cache)
    cache.save()
    again = UnitCache(cache_file)
    assert again.rejected == 0 and len(again.entries) == 2
    assert index_tree(tmp_path, cache=again) == fresh and again.hits == 2
    for (rel, _), hit in again.entries.items():
        assert hit == fresh[rel] and type(hit) is type(fresh[rel])
        if isinstance(hit, FileUnits):
            assert hit._owner == fresh[rel]._owner  # type: ignore[union-attr]
            assert all(type(u.kind) is UnitKind for u in hit.units)


def test_a_cache_that_cannot_be_written_is_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "file").write_text("")
    cache = UnitCache(tmp_path / "file" / "units.cache")  # its folder is a file
    index_tree(tmp_path, cache=cache)
    cache.save()
    assert cache.dirty and {p.name for p in tmp_path.iterdir()} == {"a.py", "file"}
