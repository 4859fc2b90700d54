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
