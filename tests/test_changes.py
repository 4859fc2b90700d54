"""Tests of fastci.changes.semantic_diff (pure semantic diff) and fastci.changes.scan (git + evidence)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.changes.scan import scan
from fastci.changes.semantic_diff import ChangeKind, diff_sources
from fastci.integrations.git.repository import WORKTREE, Git
from selection_support import Repo, units_of

BASE = '''"""Module doc."""
import os

MAX_LEN = 8
REGISTRY = {"gelu": 1, "relu": 2}


def scale(x, factor=2):
    """Scale x."""
    return x * factor


@cache
def lookup(name):
    return REGISTRY[name]


class Model:
    hidden = 4

    def forward(self, x):
        return scale(x) + self.hidden


def helper():
    return 1
'''


def kinds(old: str, new: str) -> dict[str, set[ChangeKind]]:
    d = diff_sources("m.py", old.encode(), new.encode())
    assert d.failure is None
    return {u.qualname: set(u.kinds) for u in d.units}


def test_comment_docstring_format_only_changes_nothing() -> None:
    new = BASE.replace('"""Scale x."""', '"""Scale x by a factor."""') \
        .replace("return x * factor", "return (x *   factor)  # why") \
        .replace('"""Module doc."""', '"""Another doc."""\n# a comment')
    assert kinds(BASE, new) == {}


def test_body_change_is_body() -> None:
    assert kinds(BASE, BASE.replace("x * factor", "x * factor + 1")) == {"scale": {ChangeKind.BODY}}


def test_default_change_is_signature() -> None:
    assert kinds(BASE, BASE.replace("factor=2", "factor=3")) == {"scale": {ChangeKind.SIGNATURE}}


def test_decorator_change_reaches_function_and_module() -> None:
    got = kinds(BASE, BASE.replace("@cache", "@cache(maxsize=2)"))
    assert got["lookup"] == {ChangeKind.DECORATOR}
    assert got["<module>"] == {ChangeKind.MODULE_DEFINITIONS}


def test_module_constant_registry_import() -> None:
    assert kinds(BASE, BASE.replace("MAX_LEN = 8", "MAX_LEN = 9")) == \
        {"<module>": {ChangeKind.MODULE_ASSIGNMENT}}
    assert kinds(BASE, BASE.replace('"relu": 2', '"relu": 3')) == \
        {"<module>": {ChangeKind.CONFIG_LITERAL}}
    assert kinds(BASE, BASE.replace("import os", "import os, sys")) == \
        {"<module>": {ChangeKind.MODULE_IMPORT}}


def test_class_attribute() -> None:
    assert kinds(BASE, BASE.replace("hidden = 4", "hidden = 5")) == \
        {"Model": {ChangeKind.CLASS_ATTRIBUTE}}


def test_dataclass_field_default_is_config_literal() -> None:
    old = "@dataclass\nclass Cfg:\n    lr: float = 0.1\n"
    assert kinds(old, old.replace("0.1", "0.2")) == {"Cfg": {ChangeKind.CONFIG_LITERAL}}


def test_new_deleted_renamed_units() -> None:
    new = BASE.replace("def helper():", "def helper2():") + "\n\ndef extra():\n    return 2\n"
    d = diff_sources("m.py", BASE.encode(), new.encode())
    by = {u.qualname: u for u in d.units}
    assert by["helper"].kinds == (ChangeKind.RENAMED,) and by["helper"].renamed_to == "m.py::helper2"
    assert by["extra"].kinds == (ChangeKind.ADDED,)
    assert by["<module>"].kinds == (ChangeKind.MODULE_DEFINITIONS,)  # helper removed
    gone = BASE.replace("def helper():\n    return 1\n", "")
    assert {u.qualname: u.kinds for u in diff_sources("m.py", BASE.encode(), gone.encode()).units}[
        "helper"] == (ChangeKind.DELETED,)


def test_plain_new_function_does_not_change_the_module_kind() -> None:
    got = kinds(BASE, BASE + "\n\ndef extra():\n    return 2\n")
    assert got == {"extra": {ChangeKind.ADDED}}


def test_new_definitions_that_can_change_behaviour_count() -> None:
    # Shadowing a builtin or an imported name changes what existing code calls.
    got = kinds(BASE, BASE + "\n\ndef print(*a):\n    return None\n")
    assert got["<module>"] == {ChangeKind.MODULE_DEFINITIONS}
    got = kinds(BASE, BASE + "\n\ndef os():\n    return None\n")
    assert got["<module>"] == {ChangeKind.MODULE_DEFINITIONS}
    # A new method may override a base class's.
    got = kinds(BASE, BASE.replace("    hidden = 4\n", "    hidden = 4\n\n    def extra(self):\n        return 0\n"))
    assert got["Model"] == {ChangeKind.CLASS_METHODS}


def test_new_names_that_act_without_a_call() -> None:
    star = "from base import *\n\n\ndef use():\n    return 1\n"
    got = diff_sources("m.py", star.encode(), (star + "\n\ndef helper():\n    return 2\n").encode())
    module = {u.qualname: u for u in got.units}["<module>"]
    assert module.kinds == (ChangeKind.NEW_NAME_DYNAMIC,) and module.import_time
    assert module.detail and "star-imports" in module.detail
    got = diff_sources("m.py", BASE.encode(), (BASE + "\n\nclass Sub(Model):\n    pass\n").encode())
    module = {u.qualname: u for u in got.units}["<module>"]
    assert module.kinds == (ChangeKind.NEW_SUBCLASS,) and module.import_time
    # A new class with no base registers nowhere.
    assert kinds(BASE, BASE + "\n\nclass Plain:\n    pass\n") == {"Plain": {ChangeKind.ADDED}}


def test_unparsable_file_is_reported() -> None:
    d = diff_sources("m.py", BASE.encode(), b"def broken(:\n")
    assert d.failure and "does not parse" in d.failure and d.units == ()


def test_scan_worktree_and_revisions(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"pkg/m.py": BASE, "data/cfg.json": "{}"})
    repo.write({"pkg/m.py": BASE.replace("x * factor", "x - factor"), "data/cfg.json": "{ }",
                "pkg/new.py": "X = 1\n"})
    cs = scan(Git(tmp_path), base, WORKTREE)
    assert [u.unit for u in cs.unit_changes] == ["pkg/m.py::scale", "pkg/new.py::<module>"]
    assert [o.path for o in cs.others] == ["data/cfg.json"]
    head = repo.commit()
    cs2 = scan(Git(tmp_path), base, head)
    assert cs2.head == head and [u.unit for u in cs2.unit_changes] == [u.unit for u in cs.unit_changes]


def test_scan_lists_what_changed_since_each_evidence_commit(tmp_path: Path) -> None:
    """Evidence recorded at an older commit: the files changed since then are listed for it,
    and the version it recorded diffs against the head, not just base..head."""
    repo = Repo(tmp_path)
    recorded_at = repo.commit({"pkg/m.py": BASE})
    base = repo.commit({"pkg/m.py": BASE.replace("return 1", "return 11")})  # main moved on
    cs = scan(Git(tmp_path), base, WORKTREE, evidence_commits=[recorded_at, base])
    assert cs.unit_changes == []  # nothing changed since base
    assert [c.path for c in cs.since[recorded_at]] == ["pkg/m.py"] and cs.since[base] == ()
    assert cs.versions is not None
    old = cs.versions.at(recorded_at, "pkg/m.py")
    assert [(u.unit, u.kinds) for u in cs.versions.diff("pkg/m.py", old).units] == \
        [("pkg/m.py::helper", (ChangeKind.BODY,))]
    # An unknown evidence commit has no baseline: a note says so, selection compares file by file.
    cs = scan(Git(tmp_path), base, WORKTREE, evidence_commits=["f" * 40])
    assert cs.since == {} and cs.notes and "not in this repository" in cs.notes[0]


def test_scan_renamed_file_is_listed_since_the_evidence_commit(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"pkg/m.py": BASE})
    repo.git("mv", "pkg/m.py", "pkg/n.py")
    cs = scan(Git(tmp_path), base, WORKTREE, evidence_commits=[base])
    assert [(c.status, c.path, c.old_path) for c in cs.since[base]] == [("R", "pkg/n.py", "pkg/m.py")]
    changed = {u.unit: u.kinds for u in cs.unit_changes}
    assert changed["pkg/m.py::scale"] == (ChangeKind.RENAMED,)
    assert cs.versions is not None and cs.versions.diff("pkg/m.py", BASE.encode()).status == "D"


EDITS = [
    ("return x * factor", "return x * factor + 1"),
    ("factor=2", "factor=3"),
    ("@cache", "@cache(1)"),
    ("MAX_LEN = 8", "MAX_LEN = 9"),
    ('"relu": 2', '"relu": 3'),
    ("hidden = 4", "hidden = 5"),
    ("return scale(x) + self.hidden", "return scale(x) - self.hidden"),
    ("return 1", "return 1  # comment only"),
    ('"""Scale x."""', '"""Scale x, documented."""'),
    ("def helper():", "def helper2():"),
    ("import os", "import os\nimport sys"),
    ("    def forward(self, x):", "    def extra(self):\n        return 0\n\n    def forward(self, x):"),
    ("return REGISTRY[name]", "return REGISTRY.get(name)"),
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(EDITS))), unique=True, max_size=5))
def test_quick_diff_agrees_with_the_full_diff(picks: list[int]) -> None:
    new = BASE
    for i in picks:
        new = new.replace(*EDITS[i])
    quick = diff_sources("m.py", BASE.encode(), new.encode(), quick=True)
    full = diff_sources("m.py", BASE.encode(), new.encode(), quick=False)
    assert {(u.unit, u.kinds, u.after) for u in quick.units} == \
        {(u.unit, u.kinds, u.after) for u in full.units}


def test_a_body_change_says_whether_it_changed_control_flow() -> None:
    """Issue 34 item 2: the change analysis marks inserted, changed or removed control flow
    (the reduce stage reads the fact); other edits, comments and nested defs leave it unset,
    and the change's description (what line granularity reads) stays a body change."""
    from fastci.changes.semantic_diff import diff_sources

    old = (b"def f(x, layers):\n    for layer in range(layers):\n        x = x + 1\n"
           b"    def inner():\n        return 1\n    return x\n")

    def control(new: bytes) -> str | None:
        (change,) = diff_sources("m.py", old, new).units
        assert change.describe().startswith("m.py::f: function body changed"), change.describe()
        return change.control

    assert control(old.replace(b"        x = x + 1\n", b"        x = x + 1\n        if layer >= 2:\n"
                                                      b"            x = x * 2\n")) \
        == "control flow changed: inserts `if layer >= 2:` (line 4)"
    assert "changes `for layer in range(layers - 1):`" in control(
        old.replace(b"range(layers)", b"range(layers - 1)")) or ""
    assert "`x + 1 if layer else x`" in (control(old.replace(b"x + 1", b"x + 1 if layer else x"))
                                         or "")
    assert "inserts `break`" in (control(old.replace(b"x = x + 1", b"x = x + 1\n        break"))
                                 or "")
    assert "removes `return`" in (control(old.replace(b"    return x\n", b"    x\n")) or "")
    assert control(old.replace(b"x + 1", b"x + 2  # more")) is None
    assert control(old.replace(b"return x\n", b"return x * 2\n")) is None
    # A nested def is a unit of its own: its control flow is its own change's.
    got = diff_sources("m.py", old, old.replace(b"return 1", b"return 1 if x else 2")).units
    assert {u.qualname: u.control for u in got} == {
        "f.<locals>.inner": "control flow changed: inserts `1 if x else 2` (line 5)"}
