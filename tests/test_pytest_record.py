"""pytest -p fastci.pytest_plugin --fastci-record: per-node-id evidence, children, outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastci import cli
from fastci.evidence.store import EvidenceStore

LIB = '''
import subprocess, sys

def add(a, b):
    return a + b

def mul(a, b):
    return a * b

def in_child():
    return 1

def spawn_child():
    subprocess.run([sys.executable, "-c", "import lib; lib.in_child()"], check=True)
'''

TESTS = '''
import os
import lib

def test_add():
    assert lib.add(1, 2) == 3

def test_mul_fails():
    assert lib.mul(2, 2) == 5

def test_child():
    lib.spawn_child()

def test_reads_data():
    with open(os.path.join(os.path.dirname(__file__), "golden.txt")) as f:
        assert f.read() == "42\\n"
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("proj")
    (root / "lib.py").write_text(textwrap.dedent(LIB))
    (root / "test_proj.py").write_text(textwrap.dedent(TESTS))
    (root / "golden.txt").write_text("42\n")
    return root


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "fastci.pytest_plugin", *args, "test_proj.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_record_then_ingest(project: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces"
    res = run_pytest(project, "--fastci-record", f"--fastci-trace-dir={traces}")
    assert "1 failed, 3 passed" in res.stdout, res.stdout + res.stderr
    assert f"fastci: 4 test trace(s) in {traces}" in res.stdout
    db = tmp_path / "e.db"
    assert cli.main(["ingest", str(traces), "--store", str(db)]) == 0
    assert "4 run(s) added" in capsys.readouterr().out
    with EvidenceStore.open(db) as s:
        ids = s.test_ids()
        assert ids == sorted(f"test_proj.py::{n}" for n in
                             ("test_add", "test_mul_fails", "test_child", "test_reads_data"))
        latest = s.latest_runs()
        assert latest["test_proj.py::test_mul_fails"].outcome == "failed"
        assert latest["test_proj.py::test_add"].outcome == "passed"
        assert all(r.complete for r in latest.values())
        by_unit = s.tests_for_units(["lib.py::add", "lib.py::mul", "lib.py::in_child"])
        assert by_unit == {"lib.py::add": {"test_proj.py::test_add"},
                           "lib.py::mul": {"test_proj.py::test_mul_fails"},
                           "lib.py::in_child": {"test_proj.py::test_child"}}
        assert s.tests_for_files(["golden.txt"]) == {"golden.txt": {"test_proj.py::test_reads_data"}}
        units = s.units_of_test("test_proj.py::test_add")
        assert units["lib.py::add"] == ["args(a=1;b=2)|caller=test_proj.py::test_add"]


def test_malformed_plan_runs_everything_loudly(project: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    res = run_pytest(project, f"--fastci-plan={plan}")
    assert "1 failed, 3 passed" in res.stdout
    assert "running every test" in res.stdout + res.stderr


def test_plan_and_record_together(project: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "version": 1, "mode": "selective", "reason": "test",
        "tests": [{"id": "test_proj.py::test_add", "overrides": {"steps": 2}}],
        "skipped": [{"id": f"test_proj.py::{n}", "why": "not affected"}
                    for n in ("test_mul_fails", "test_child", "test_reads_data")]}))
    traces = tmp_path / "traces"
    res = run_pytest(project, f"--fastci-plan={plan}", "--fastci-record",
                     f"--fastci-trace-dir={traces}")
    assert "1 passed, 3 deselected" in res.stdout, res.stdout + res.stderr
    db = tmp_path / "e.db"
    assert cli.main(["ingest", str(traces), "--store", str(db)]) == 0
    with EvidenceStore.open(db) as s:
        assert s.test_ids() == ["test_proj.py::test_add"]
        assert dict(s.latest_runs()["test_proj.py::test_add"].workload) == {"steps": 2}
