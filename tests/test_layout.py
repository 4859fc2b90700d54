"""The package's shape: stages in pipeline order, no import circles, no upward imports.

The import graph is built from the source (``ast``), every import counted: top-level,
inside functions, and under ``TYPE_CHECKING``. Each module belongs to a stage; a
module may import its own stage and the stages below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer" / "fastci"

#: Stages from the bottom up, by module-name prefix (the longest prefix wins).
STAGES: tuple[tuple[str, ...], ...] = (
    ("fastci", "fastci.errors", "fastci.types", "fastci.config", "fastci.progress",
     "fastci.gcpause"),  # shared leaves
    ("fastci.integrations", "fastci.integrations.bazel", "fastci.integrations.git"),  # adapters to CLIs
    ("fastci.units",),
    ("fastci.evidence.record",),  # runs inside every test process
    ("fastci.evidence.store",),
    ("fastci.evidence",),  # fill: record, then ingest into the store
    ("fastci.changes",),
    ("fastci.select",),
    ("fastci.plan",),
    ("fastci.run",),
    ("fastci.eval",),  # measures plans: runs tests, plans changes, reports
    # The front ends: the fastci command and the pytest plugin (records, obeys a plan).
    ("fastci.cli", "fastci.__main__", "fastci.pytest", "fastci.pytest_plugin"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if not p.name.endswith("_pb2.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The fastci modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("fastci"):
                out.add(t)
    return out


def stage_of(name: str) -> int:
    best, level = -1, -1
    for i, prefixes in enumerate(STAGES):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level >= 0, f"{name} belongs to no stage: add it to STAGES"
    return level


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in color:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(edges):
        if n not in color:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_circle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_stage_imports_a_later_stage() -> None:
    bad = [f"{a} (stage {stage_of(a)}) imports {b} (stage {stage_of(b)})"
           for a, targets in sorted(graph().items()) for b in sorted(targets)
           if stage_of(b) > stage_of(a)]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_package_lists_stage_folders_and_a_few_shared_modules() -> None:
    files = sorted(p.name for p in PACKAGE.iterdir() if p.is_file() and p.suffix == ".py")
    others = [f for f in files if f not in ("__init__.py", "__main__.py")]
    # config, errors, types, progress, gcpause, pytest_plugin
    assert len(others) <= 6, others
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == ["changes", "cli", "eval", "evidence", "integrations", "plan", "pytest",
                       "run", "select", "units"]
    for folder in folders:
        init = PACKAGE / folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 15, f"{init} needs a docstring saying what the stage takes and gives"


def test_no_private_helper_crosses_a_module() -> None:
    mods = modules()
    bad = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastci"):
                bad += [f"{name} imports {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert stage_of("fastci.evidence.store.db") < stage_of("fastci.select.test_rules")
    assert stage_of("fastci.integrations.bazel.bep") < stage_of("fastci.evidence.store.ingest")
    assert stage_of("fastci.pytest.plugin") > stage_of("fastci.plan.model")
    assert stage_of("fastci.pytest.plugin") == stage_of("fastci.cli.app") > stage_of("fastci.eval")
    assert stage_of("fastci.integrations.procs") == stage_of("fastci.integrations.git.tree")


#: What code running inside every test process (``fastci.evidence.record``) may import
#: besides the standard library: coverage.py, the protobuf runtime of ``trace_pb2``,
#: and FastCI's own in-test leaves. Never the store, the planner or anything heavier.
IN_TEST_THIRD_PARTY = ("coverage", "google.protobuf")
IN_TEST_FASTCI = ("fastci", "fastci.errors", "fastci.types", "fastci.config", "fastci.units",
                  "fastci.units.lines", "fastci.evidence", "fastci.evidence.record")
#: Imports allowed inside one named function only, each with its reason.
IN_TEST_LAZY = {
    # Readers of a trace (ingest) want arrays; the recorder never calls it.
    ("fastci.evidence.record.trace", "u32_column", "numpy"),
}


def _runtime_imports(path: Path) -> list[tuple[str, str]]:
    """(enclosing function or "", imported module) of every import outside
    ``if TYPE_CHECKING:`` blocks; relative imports come back with their leading dots."""
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, func)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = func or node.name
        if isinstance(node, ast.Import):
            out.extend((func, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            if base in ("fastci", "fastci.evidence", "fastci.evidence.record"):
                out.extend((func, f"{base}.{a.name}") for a in node.names)  # submodules
            else:
                out.append((func, base))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def in_test_import_problems(name: str, path: Path) -> list[str]:
    import sys

    bad = []
    for func, mod in _runtime_imports(path):
        top = mod.split(".")[0]
        if mod.startswith(".") or top in sys.stdlib_module_names or top == "__future__":
            continue
        if any(mod == p or mod.startswith(p + ".") for p in IN_TEST_THIRD_PARTY):
            continue
        if mod in IN_TEST_FASTCI or mod.startswith("fastci.evidence.record."):
            continue
        if (name, func, top) in IN_TEST_LAZY:
            continue
        bad.append(f"{name} imports {mod}" + (f" (in {func})" if func else ""))
    return bad


def test_in_test_code_imports_only_the_stdlib_coverage_and_protobuf() -> None:
    # The recorder's package runs in every recorded test process, child processes
    # included: what it imports costs every test, and the store must never load there.
    mods = modules()
    record = {n: p for n, p in mods.items() if n == "fastci.evidence.record"
              or n.startswith("fastci.evidence.record.")}
    assert "fastci.evidence.record.recorder" in record
    bad = [b for name, path in sorted(record.items()) for b in in_test_import_problems(name, path)]
    assert not bad, "the in-test part imports too much:\n" + "\n".join(bad)
    for name in set(IN_TEST_FASTCI) - {"fastci.evidence", "fastci.evidence.record"}:
        # FastCI's in-test leaves hold to the same rule (fastci.config reads YAML lazily).
        leaf = mods[name]
        assert not [b for b in in_test_import_problems(name, leaf)
                    if "fastci." not in b.split(" imports ")[1] and "yaml" not in b], name


def test_the_in_test_checker_sees_a_store_import_and_a_third_party_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from __future__ import annotations\nimport os, coverage\n"
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n"
                   "from fastci.evidence.store.db import EvidenceStore\n"
                   "from fastci.evidence import fill\nfrom fastci.evidence.record import trace\n"
                   "def f():\n    import torch\n", encoding="utf-8")
    assert in_test_import_problems("fastci.evidence.record.m", src) == [
        "fastci.evidence.record.m imports fastci.evidence.store.db",
        "fastci.evidence.record.m imports fastci.evidence.fill",
        "fastci.evidence.record.m imports torch (in f)"]
