"""Every third-party package FastCI's own code imports is declared in pyproject.toml.

numpy (the store's columns) once arrived only through matplotlib: an install that
dropped matplotlib would have broken ingest. Imports are read with ``ast`` (module top
level and inside functions alike); each top-level name is mapped to the distribution
that provides it in this environment.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "analyzer" / "fastci"


def _imported_top_names() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _declared() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    stdlib = set(sys.stdlib_module_names) | {"fastci", "__future__", "sitecustomize"}
    provided = importlib.metadata.packages_distributions()
    third = sorted(n for n in _imported_top_names() - stdlib if not n.startswith("_")
                   or n == "_pytest")
    missing = []
    for name in third:
        dists = {d.lower().replace("_", "-") for d in provided.get(name, [])}
        if not dists:
            missing.append(f"{name} (not installed here)")
        elif not dists & _declared():
            missing.append(f"{name} (from {', '.join(sorted(dists))})")
    assert not missing, f"imported by analyzer/fastci but not in pyproject dependencies: {missing}"
    assert {"numpy", "yaml", "google", "libcst", "coverage"} <= set(third)
