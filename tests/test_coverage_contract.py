"""The private surface of coverage.py the recorder uses, checked against the installed one.

``fastci.evidence.record.covplugin`` overrides private methods of ``coverage.Coverage``
and swaps a module global of ``coverage.collector``: a minor release of coverage.py
may rename or rewire any of them and silently change the evidence (a file traced that
was not, a hook no longer called). ``COVERAGE_PRIVATE`` lists every such name;
this test checks that each exists with the parameters the recorder expects, that
coverage.py still calls the hooks the recorder overrides, and that the module uses no
private coverage name the list lacks (so the list cannot drift from the code).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import coverage
import pytest

from fastci.evidence.record import covplugin
from fastci.evidence.record.covplugin import COVERAGE_PRIVATE, make_coverage

SOURCE = Path(covplugin.__file__).read_text(encoding="utf-8")


def _resolve(where: str) -> Any:
    """A module (``coverage.collector``) or a class in one (``coverage.Coverage``)."""
    try:
        return importlib.import_module(where)
    except ImportError:
        module, _, attr = where.rpartition(".")
        return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize("where, name, params, why", COVERAGE_PRIVATE,
                         ids=[f"{w}.{n}" for w, n, _, _ in COVERAGE_PRIVATE])
def test_each_private_name_exists_with_its_parameters(where: str, name: str,
                                                      params: tuple[str, ...] | None,
                                                      why: str) -> None:
    owner = _resolve(where)
    if params is None:  # an attribute set on instances: look on a started engine
        cov = make_coverage([str(Path.cwd())], [], contexts=False)
        cov.start()
        cov.stop()
        holder = cov if isinstance(owner, type) and issubclass(owner, coverage.Coverage) \
            else cov._inorout
        assert hasattr(holder, name), f"{where}.{name} is gone: {why}"
        return
    assert hasattr(owner, name), f"{where}.{name} is gone: {why}"
    got = tuple(inspect.signature(getattr(owner, name)).parameters)
    assert got == params, f"{where}.{name}{got}: the recorder expects {params} ({why})"


def test_the_installed_coverage_is_the_pinned_minor() -> None:
    pinned = next(line.split("==")[1] for line in
                  (Path(__file__).resolve().parents[1] / "third_party/requirements.txt")
                  .read_text().splitlines() if line.startswith("coverage=="))
    assert coverage.__version__.split(".")[:2] == pinned.split(".")[:2]
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    major, minor = (int(x) for x in pinned.split(".")[:2])
    assert f'"coverage>={major}.{minor},<{major}.{minor + 1}"' in pyproject


def _private_names_used(source: str = SOURCE) -> set[tuple[str, str]]:
    """(owner, name) of every coverage private the module's code touches, by ast."""
    tree = ast.parse(source)
    used: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b) == "coverage.Coverage" for b in node.bases):
            for item in node.body:  # overridden private methods
                if isinstance(item, ast.FunctionDef) and item.name.startswith("_") \
                        and not item.name.startswith("__"):
                    used.add(("coverage.Coverage", item.name))
            for sub in ast.walk(node):  # private attributes read on self
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                        and sub.value.id == "self" and sub.attr.startswith("_") \
                        and not sub.attr.startswith(("__", "_fastci_")):
                    used.add(("coverage.Coverage", sub.attr))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and ast.unparse(node.value) == "self._inorout":
            used.add(("coverage.inorout.InOrOut", node.attr))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "setattr") \
                and node.args and ast.unparse(node.args[0]) == "_collector":
            used.add(("coverage.collector", ast.literal_eval(node.args[1])))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coverage."):
            used.update((node.module, a.name) for a in node.names)
    return used


def test_the_list_is_every_private_name_the_module_uses() -> None:
    declared = {(w, n) for w, n, _, _ in COVERAGE_PRIVATE}
    used = _private_names_used()
    assert used == declared, f"used, not declared: {used - declared}; declared, unused: {declared - used}"


def test_the_scan_sees_each_kind_of_private_use() -> None:
    src = ("import coverage\nfrom coverage import collector as _collector\n"
           "from coverage.misc import isolate_module\n"
           "class C(coverage.Coverage):\n    def _init(self):\n"
           "        self._fastci_x = self._data\n        return self._inorout.plugins\n"
           "setattr(_collector, 'Tracer', None)\n")
    assert _private_names_used(src) == {
        ("coverage.Coverage", "_init"), ("coverage.Coverage", "_data"),
        ("coverage.Coverage", "_inorout"), ("coverage.inorout.InOrOut", "plugins"),
        ("coverage.collector", "Tracer"), ("coverage.misc", "isolate_module")}


def test_coverage_still_calls_the_overridden_hooks(tmp_path: Path) -> None:
    # Behaviour, not only names: a start builds the collector inside _init_for_start
    # (with short_stack swapped), each new file is decided by _should_trace, and
    # get_data calls _post_save_work. A release that moves any of these silently
    # changes what the recorder measures or costs.
    calls: list[str] = []
    base = type(make_coverage([str(tmp_path)], [], contexts=False))

    class Spy(base):  # type: ignore[misc, valid-type]
        def _init_for_start(self) -> None:
            calls.append("init")
            super()._init_for_start()

        def _should_trace(self, filename: str, frame: FrameType) -> Any:
            if filename.startswith(str(tmp_path)):
                calls.append("should_trace")
            return super()._should_trace(filename, frame)

        def _post_save_work(self) -> None:
            calls.append("post_save")

    (tmp_path / "mod_contract.py").write_text("def f():\n    return 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        cov = Spy(data_file=None, config_file=False, source=[str(tmp_path)], omit=[])
        cov.start()
        importlib.import_module("mod_contract").f()
        cov.stop()
        data = cov.get_data()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mod_contract", None)
    assert calls[0] == "init" and "should_trace" in calls and calls[-1] == "post_save", calls
    assert data.lines(str(tmp_path / "mod_contract.py"))  # it measured the file
    # The collector's call stack was not kept (the swap ran inside _init_for_start).
    assert cov._collector.origin == "(call stack not kept by fastci)"


def test_an_outside_file_gets_coverages_own_do_not_trace_disposition(tmp_path: Path) -> None:
    cov = make_coverage([str(tmp_path / "repo")], [], contexts=False)
    cov.start()
    try:
        frame = inspect.currentframe()
        assert frame is not None
        disp = cov._should_trace(__file__, frame)
    finally:
        cov.stop()
    assert disp.trace is False and disp.reason == "outside every measured root (fastci)"
    assert isinstance(disp, cov._inorout.disp_class)
