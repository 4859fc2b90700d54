"""Listing a pytest suite with its FastCI declarations, in the tests' own interpreter.

:func:`collect` runs ``pytest --collect-only`` with a small collector plugin
(:data:`_COLLECT`, run as ``python -c``) in the interpreter the tests run with, and
reads back, per item, its FastCI id, its ``fastci_workload`` declaration (or why the
marker is malformed) and its ``gpus`` marker. ``fastci calibrate`` uses it to find
what to calibrate, ``fastci eval`` to know the suite it runs.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from fastci.run.calibration_runs import PLUGIN, CalibrationError, Declared
from fastci.select.test_rules import DeclaredTest
from fastci.types import TestId

__all__ = ["collect"]

#: Runs in the tests' interpreter: ``python -c _COLLECT OUT PYTEST-ARGS...`` collects and
#: writes, per item, its FastCI id, its declaration (or why its marker is malformed) and
#: its ``gpus`` marker as JSON to OUT.
_COLLECT = r'''
import json, sys
from pathlib import Path
import pytest
from fastci.integrations.git.repository import repo_root
from fastci.pytest.ids import test_id_for
from fastci.pytest.plan import declaration


class Collector:
    def __init__(self):
        self.items = []

    def pytest_collection_finish(self, session):
        root = repo_root(Path(str(session.config.rootpath)))
        for item in session.items:
            entry = {"id": test_id_for(item, root)}
            marker = item.get_closest_marker("gpus")
            try:
                entry["gpus"] = int(marker.args[0]) if marker and marker.args else 0
            except (TypeError, ValueError):
                entry["gpus"] = 0
            try:
                decl = declaration(item)
            except ValueError as exc:
                entry["error"] = str(exc)
            else:
                entry["declaration"] = None if decl is None else {
                    "workload": dict(decl.workload), "floors": dict(decl.floors),
                    "constraints": list(decl.constraints), "scope": list(decl.scope),
                    "frozen": None if decl.frozen is None else list(decl.frozen),
                    "check": decl.check, "reference": decl.reference}
            try:
                json.dumps(entry)
            except (TypeError, ValueError):
                entry = {"id": entry["id"], "gpus": entry["gpus"],
                         "error": "its arguments hold a value that is not JSON"}
            self.items.append(entry)


collector = Collector()
code = pytest.main(sys.argv[2:], plugins=[collector])
with open(sys.argv[1], "w", encoding="utf-8") as out:
    json.dump({"code": int(code), "items": collector.items}, out)
'''


def collect(root: Path, tests: Sequence[str], *, python: str,
            pytest_args: Sequence[str] = ()) -> dict[TestId, Declared]:
    """Every test pytest collects from ``tests`` (all when empty), with its declaration.

    Raises:
        CalibrationError: pytest cannot collect them, or a named test is unknown.
    """
    with tempfile.TemporaryDirectory(prefix="fastci-collect-") as tmp:
        out = Path(tmp) / "items.json"
        proc = subprocess.run(
            [python, "-c", _COLLECT, str(out), "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", PLUGIN, *pytest_args, *tests],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", check=False)
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
    if not isinstance(data, dict) or data.get("code") not in (0, 5):
        raise CalibrationError(f"pytest cannot collect the tests to calibrate: "
                               f"{_error_line(proc.stdout, proc.returncode)}")
    if tests and not data["items"]:
        raise CalibrationError(f"no test matches {' '.join(tests)}")
    found: dict[TestId, Declared] = {}
    for entry in data["items"]:
        if "error" in entry:
            found[entry["id"]] = str(entry["error"])
        elif entry.get("declaration") is None:
            found[entry["id"]] = None
        else:
            found[entry["id"]] = _declared(entry["id"], entry["declaration"],
                                           int(entry.get("gpus") or 0))
    return found


def _declared(test: TestId, d: dict[str, Any], gpus: int) -> DeclaredTest:
    frozen = d.get("frozen")
    return DeclaredTest(test, gpus, dict(d["workload"]), floors=dict(d["floors"]),
                        frozen=None if frozen is None else tuple(frozen),
                        scope=tuple(d["scope"]), constraints=tuple(d["constraints"]),
                        check=d.get("check"), reference=d.get("reference"))


def _error_line(output: str, code: int) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR", "E "))]
    line = (errors or lines or [f"exit status {code}"])[0]
    return line[:300]
