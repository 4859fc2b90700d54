"""Change precision: new pure-decorated defs are new units; import-time bindings reach their users.

Item 8: a new def decorated only with side-effect-free decorators (``pure_callables``)
is reported as ADDED alone. Item 3: :func:`fastci.changes.names.narrow` resolves a
module-level import or assignment change to the units that reference the names it
binds, and answers None (module-wide, as before) whenever it cannot be sure.
"""

from __future__ import annotations

from fastci.changes.semantic_diff import ChangeKind, diff_sources
from fastci.config import DEFAULT_PURE_CALLABLES

TEST_MODULE = '''import torch
import torch as t
import pytest
from pytest import mark


def test_a():
    assert torch.ones(1)


class TestK:
    def test_b(self):
        pass
'''


def _kinds(old: str, new: str, **kw: object) -> dict[str, set[ChangeKind]]:
    diff = diff_sources("tests/test_m.py", old.encode(), new.encode(), **kw)  # type: ignore[arg-type]
    return {u.qualname: set(u.kinds) for u in diff.units}


def test_new_pure_decorated_test_is_only_a_new_unit() -> None:
    for deco in ("@torch.inference_mode()", "@t.no_grad()", "@mark.slow",
                 "@pytest.mark.parametrize('x', [1, 2], ids=lambda p: f'p{p}')",
                 "@pytest.mark.skipif(not torch.cuda.is_available(), reason='gpu')"):
        new = TEST_MODULE + f"\n\n{deco}\ndef test_new(x=1):\n    pass\n"
        assert _kinds(TEST_MODULE, new) == {"test_new": {ChangeKind.ADDED}}, deco


def test_new_test_method_in_plain_class_is_only_a_new_unit() -> None:
    new = TEST_MODULE.replace("        pass\n", "        pass\n\n    @torch.no_grad()\n"
                              "    def test_c(self):\n        pass\n")
    assert _kinds(TEST_MODULE, new) == {"TestK.test_c": {ChangeKind.ADDED}}


def test_unknown_or_impure_decorator_stays_module_wide() -> None:
    for deco in ("@register", "@pytest.mark.parametrize('x', make_cases())",
                 "@torch.set_grad_enabled(False)", "@pytest.fixture"):
        new = TEST_MODULE + f"\n\n{deco}\ndef test_new(x=1):\n    pass\n"
        got = _kinds(TEST_MODULE, new)
        assert got["<module>"] == {ChangeKind.MODULE_DEFINITIONS}, deco
        assert got["test_new"] == {ChangeKind.ADDED}


def test_pure_list_is_configurable() -> None:
    new = TEST_MODULE + "\n\n@torch.inference_mode()\ndef test_new():\n    pass\n"
    assert "<module>" in _kinds(TEST_MODULE, new, pure=("pytest.mark.*",))
    old = "from mylib import deco as d\n" + TEST_MODULE
    new = old + "\n\n@d\ndef test_new():\n    pass\n"
    assert "<module>" in _kinds(old, new)
    assert "<module>" not in _kinds(old, new, pure=(*DEFAULT_PURE_CALLABLES, "mylib.*"))


def test_rebinding_or_shadowing_stays_module_wide() -> None:
    # The name was bound before (a re-definition), or rebinds an import's alias.
    again = TEST_MODULE + "\n\n@torch.no_grad()\ndef test_a():\n    pass\n"
    assert ChangeKind.MODULE_DEFINITIONS in _kinds(TEST_MODULE, again)["<module>"]
    shadow = TEST_MODULE + "\n\n@torch.no_grad()\ndef mark():\n    pass\n"
    assert ChangeKind.MODULE_DEFINITIONS in _kinds(TEST_MODULE, shadow)["<module>"]
    # ``torch`` rebound by an assignment: ``torch.no_grad`` is not known to be torch's.
    rebound = TEST_MODULE.replace("import torch as t\n", "import torch as t\ntorch = t.nn\n")
    new = rebound + "\n\n@torch.no_grad()\ndef test_new():\n    pass\n"
    assert ChangeKind.MODULE_DEFINITIONS in _kinds(rebound, new)["<module>"]


def test_new_framework_hook_is_module_wide_even_undecorated() -> None:
    """setup_module / pytest_* / dunders run without a reference: never a mere new unit."""
    for name in ("setup_module", "setup_function", "pytest_generate_tests", "__getattr__"):
        new = TEST_MODULE + f"\n\ndef {name}(*a):\n    pass\n"
        assert ChangeKind.MODULE_DEFINITIONS in _kinds(TEST_MODULE, new).get("<module>", set()) \
            or ChangeKind.NEW_NAME_DYNAMIC in _kinds(TEST_MODULE, new).get("<module>", set()), name


def test_class_method_that_may_override_stays_class_wide() -> None:
    helper = TEST_MODULE.replace("        pass\n", "        pass\n\n    def helper(self):\n"
                                 "        pass\n")
    assert _kinds(TEST_MODULE, helper)["TestK"] == {ChangeKind.CLASS_METHODS}
    based = TEST_MODULE.replace("class TestK:", "class TestK(Base):")
    new = based.replace("        pass\n", "        pass\n\n    def test_c(self):\n        pass\n")
    assert _kinds(based, new)["TestK"] == {ChangeKind.CLASS_METHODS}


def test_removed_pure_decorated_def_stays_module_wide() -> None:
    old = TEST_MODULE + "\n\n@torch.no_grad()\ndef test_new():\n    pass\n"
    got = _kinds(old, TEST_MODULE)
    assert ChangeKind.MODULE_DEFINITIONS in got["<module>"] and got["test_new"] == {ChangeKind.DELETED}


# --------------------------------------------------------------------------- item 3: narrow()

import ast  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Mapping  # noqa: E402

from fastci.changes.names import NameReach, narrow  # noqa: E402
from fastci.changes.semantic_diff import UnitChange  # noqa: E402
from fastci.changes.static_reach import HeadTree  # noqa: E402
from fastci.integrations.git.repository import WORKTREE, Git  # noqa: E402
from selection_support import Repo  # noqa: E402

M = '''"""The changed module."""
from typing import List

MAX_LEN = 128


def f():
    return MAX_LEN


def uses_sqrt(x):
    return sqrt(x)


def other():
    return 1
'''
N = '''from pkg.m import MAX_LEN as LIMIT


def g():
    return LIMIT + 1


def unrelated():
    return 2
'''
O = '''import typing
import pkg.m as mm
from pkg import m


def h():
    return mm.MAX_LEN


def h2() -> typing.Optional[int]:
    return m.other()
'''
FILES = {"pkg/__init__.py": "", "pkg/m.py": M, "pkg/n.py": N, "pkg/o.py": O}


def _reach(tmp_path: Path, new_m: str, extra: Mapping[str, str] | None = None,
           old_m: str = M) -> NameReach | None:
    """Write the tree (``pkg/m.py`` at ``new_m``) and narrow the module change of m."""
    repo = Repo(tmp_path / "repo")
    repo.write({**FILES, **(extra or {}), "pkg/m.py": new_m})
    repo.commit()
    diff = diff_sources("pkg/m.py", old_m.encode(), new_m.encode())
    module = [u for u in diff.units if u.qualname == "<module>"]
    assert len(module) == 1, diff.units
    return narrow(module[0], old_m, new_m, HeadTree(Git(repo.root), WORKTREE))


def test_added_unused_import_reaches_nothing(tmp_path: Path) -> None:
    got = _reach(tmp_path, M.replace("from typing import List", "from typing import List, Optional"))
    assert got is not None and got.units == () and got.names == ("Optional",)
    assert "no unit references" in got.why


def test_added_import_reaches_its_users_only(tmp_path: Path) -> None:
    got = _reach(tmp_path, M.replace("from typing import List", "from typing import List\n"
                                     "from math import sqrt"))
    assert got is not None and got.units == ("pkg/m.py::uses_sqrt",)


def test_changed_constant_reaches_users_across_modules(tmp_path: Path) -> None:
    got = _reach(tmp_path, M.replace("MAX_LEN = 128", "MAX_LEN = 256"))
    assert got is not None
    assert got.units == ("pkg/m.py::f", "pkg/n.py::g", "pkg/o.py::h")


def test_derived_bindings_are_followed(tmp_path: Path) -> None:
    derived = {"pkg/d.py": '''import dataclasses
from pkg.n import LIMIT

TWICE = LIMIT * 2


@dataclasses.dataclass
class Cfg:
    size: int = TWICE

    def area(self):
        return self.size ** 2


def make(n=Cfg()):
    return n


def k():
    return 0
''', "pkg/e.py": "from pkg import d\n\n\ndef use():\n    return d.make()\n"}
    derived["pkg/d.py"] = derived["pkg/d.py"].replace("def make(n=Cfg())", "def make(n=TWICE)")
    got = _reach(tmp_path, M.replace("MAX_LEN = 128", "MAX_LEN = 256"), derived)
    assert got is not None
    assert set(got.units) == {"pkg/m.py::f", "pkg/n.py::g", "pkg/o.py::h", "pkg/d.py::Cfg.area",
                              "pkg/d.py::make", "pkg/e.py::use"}
    # A default that calls a repository class runs its code at import: no narrowing.
    derived["pkg/d.py"] = derived["pkg/d.py"].replace("def make(n=TWICE)", "def make(n=Cfg())")
    assert _reach(tmp_path / "b", M.replace("MAX_LEN = 128", "MAX_LEN = 256"), derived) is None


def test_star_import_user_widens(tmp_path: Path) -> None:
    star = {"pkg/s.py": "from pkg.m import *\n\n\ndef s():\n    return 1\n"}
    assert _reach(tmp_path, M.replace("MAX_LEN = 128", "MAX_LEN = 256"), star) is None


def test_dynamic_access_widens(tmp_path: Path) -> None:
    changed = M.replace("MAX_LEN = 128", "MAX_LEN = 256")
    own = M + "\n\ndef lookup(name):\n    return globals()[name]\n"
    assert _reach(tmp_path, own.replace("MAX_LEN = 128", "MAX_LEN = 256"), old_m=own) is None
    other = {"pkg/x.py": "import pkg.m as mm\n\n\ndef x(n):\n    return getattr(mm, n)\n"}
    assert _reach(tmp_path / "b", changed, other) is None


def test_module_level_statements_widen(tmp_path: Path) -> None:
    # A call statement in the changed module is not a binding.
    assert _reach(tmp_path, M + "\nprint(MAX_LEN)\n") is None
    # A module elsewhere that hands the name to a call at import time.
    reg = {"pkg/r.py": "from pkg.m import MAX_LEN\nREGISTRY = {}\nREGISTRY['n'] = MAX_LEN\n"}
    assert _reach(tmp_path / "b", M.replace("MAX_LEN = 128", "MAX_LEN = 256"), reg) is None
    # A changed value computed by an unknown call.
    assert _reach(tmp_path / "c", M.replace("MAX_LEN = 128", "MAX_LEN = compute()")) is None


def test_imports_with_possible_side_effects_widen(tmp_path: Path) -> None:
    # A third-party or repository module not imported before may act on import.
    assert _reach(tmp_path, M.replace("from typing import List", "from typing import List\n"
                                      "import torch")) is None
    assert _reach(tmp_path / "b", M.replace("from typing import List", "from typing import List\n"
                                            "from pkg.n import g")) is None
    assert _reach(tmp_path / "c", M.replace("from typing import List",
                                            "from __future__ import annotations\n"
                                            "from typing import List")) is None


def test_only_files_that_can_import_the_module_are_read(tmp_path: Path) -> None:
    """A file that names MAX_LEN but cannot import pkg.m is not read (here: it does not parse)."""
    changed = M.replace("MAX_LEN = 128", "MAX_LEN = 256")
    broken = {"lib/other.py": "MAX_LEN = 3\ndef (:\n"}
    got = _reach(tmp_path, changed, broken)
    assert got is not None and got.units == ("pkg/m.py::f", "pkg/n.py::g", "pkg/o.py::h")
    # The same file importing the changed module must be read, and widens.
    importing = {"lib/other.py": "from pkg import m\nMAX_LEN = 3\ndef (:\n"}
    assert _reach(tmp_path / "b", changed, importing) is None


def test_reexports_and_package_relative_imports_are_followed(tmp_path: Path) -> None:
    """Users that never spell the changed module: via a re-exporter and via ``from . import``."""
    changed = M.replace("MAX_LEN = 128", "MAX_LEN = 256")
    extra = {"pkg/sub/__init__.py": "from pkg.m import MAX_LEN\n",
             "pkg/sub/inner.py": "from . import MAX_LEN\n\n\ndef deep():\n    return MAX_LEN\n",
             "app/__init__.py": "",
             "app/use.py": "from pkg.sub import MAX_LEN as L\n\n\ndef use():\n    return L\n"}
    got = _reach(tmp_path, changed, extra)
    assert got is not None
    assert {"pkg/sub/inner.py::deep", "app/use.py::use"} <= set(got.units), got.units


def test_not_a_binding_change_is_not_narrowed(tmp_path: Path) -> None:
    body = UnitChange("pkg/m.py::f", "pkg/m.py", "f", (ChangeKind.BODY,))
    assert narrow(body, M, M, None) is None
    module = UnitChange("pkg/m.py::<module>", "pkg/m.py", "<module>",
                        (ChangeKind.MODULE_STATEMENT,), ("stmt:abc",))
    assert narrow(module, M, M, None) is None
    assert narrow(module, M, "def (", None) is None


def _with_unused_import(source: str) -> str | None:
    """``source`` with ``import keyword as _fastci_unused`` after its docstring and futures."""
    tree = ast.parse(source)
    line = len(source.splitlines()) + 1
    for stmt in tree.body:
        docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring or future):
            line = stmt.lineno
            break
    lines = source.splitlines(keepends=True)
    return "".join(lines[:line - 1]) + "import keyword as _fastci_unused\n" + "".join(lines[line - 1:])


def test_unused_import_in_real_files_reaches_nothing() -> None:
    """Differential check on examples/microllm: an unused stdlib import reaches no unit."""
    root = Path(__file__).resolve().parents[1]
    tree = HeadTree(Git(root), WORKTREE)
    narrowed = 0
    files = sorted((root / "examples/microllm").rglob("*.py"))[:12]
    for p in files:
        rel = p.relative_to(root).as_posix()
        old = p.read_text()
        new = _with_unused_import(old)
        assert new is not None
        module = [u for u in diff_sources(rel, old.encode(), new.encode()).units
                  if u.qualname == "<module>"]
        assert [u.kinds for u in module] == [(ChangeKind.MODULE_IMPORT,)], rel
        got = narrow(module[0], old, new, tree)
        if got is not None:  # None: the file reads its namespace dynamically (kept wide)
            assert got.units == () and got.names == ("_fastci_unused",), rel
            narrowed += 1
    assert narrowed >= len(files) - 2
