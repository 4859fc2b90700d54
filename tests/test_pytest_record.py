"""pytest -p fastci.pytest.plugin --fastci-record: per-node-id evidence, children, outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastci import cli
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan
from plan_support import tie

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
import pytest
import lib

@pytest.mark.fastci_workload(workload={"steps": 8}, floors={"steps": 2})
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
                           "-p", "fastci.pytest.plugin", *args, "test_proj.py"],
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
        "tree": tie(Plan(mode="selective"), project).tree,  # obeyed on this tree only
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
        run = s.latest_runs()["test_proj.py::test_add"]
        # The declared workload and the plan's reduction are kept apart.
        assert dict(run.workload) == {"steps": 8}
        assert dict(run.overrides or {}) == {"steps": 2} and not run.full


# --------------------------------------------------------------------------- shared evidence
# What runs while pytest collects (module top levels) and in fixtures above function
# scope runs once per session; every test that needs it gets it in its evidence.

SHARED_FILES = {
    ".gitignore": "__pycache__/\n",
    "consts.py": "LIMIT = 5\n",
    "lib.py": "def load(path):\n    with open(path) as f:\n        return f.read().strip()\n",
    "data.txt": "hello\n",
    # conftest.py changes run everything (a static rule): the fixtures live in a module.
    "conftest.py": "from fixtures import per_module, shared_data  # noqa: F401\n",
    "fixtures.py": textwrap.dedent('''
        import os
        import pytest
        import lib

        @pytest.fixture(scope="session")
        def shared_data():
            value = lib.load(os.path.join(os.path.dirname(__file__), "data.txt"))
            yield value
            value = None

        @pytest.fixture(scope="module")
        def per_module():
            return 3
        '''),
    "test_a.py": textwrap.dedent('''
        from consts import LIMIT

        def test_one(shared_data):
            assert shared_data == "hello"

        def test_two(shared_data, per_module):
            assert per_module == 3

        def test_three(shared_data, per_module):
            assert LIMIT == 5
        '''),
    # Imports consts again (already in sys.modules: its top level does not run again).
    "test_b.py": textwrap.dedent('''
        from consts import LIMIT

        def test_b1():
            assert LIMIT == 5

        def test_b2(per_module):
            assert per_module == 3
        '''),
}
A_TESTS = {f"test_a.py::{n}" for n in ("test_one", "test_two", "test_three")}
B_TESTS = {"test_b.py::test_b1", "test_b.py::test_b2"}


class Recorded:
    """The shared-evidence project, recorded with pytest and ingested at its base commit."""

    def __init__(self, root: Path, store: EvidenceStore, base: str) -> None:
        self.root, self.store, self.base = root, store, base

    def selected_after(self, rel: str, old: str, new: str) -> set[str]:
        from record_support import edited, plan_now

        with edited(self.root / rel, old, new):
            a = plan_now(self.root, self.base, self.store)
        assert a.plan.mode == "selective", a.plan.reason
        return {d.test for d in a.selection.selected}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    from record_support import record

    root = tmp_path_factory.mktemp("shared") / "repo"
    repo, store, base = record(root, SHARED_FILES, "test_a.py", "test_b.py", passed=5)
    assert repo.git("status", "--porcelain") == ""
    yield Recorded(root, store, base)
    store.close()


def test_constants_module_reaches_every_importing_test(recorded: Recorded) -> None:
    # consts.py ran once, while test_a.py was collected; test_b.py found it imported.
    users = recorded.store.tests_for_units(["consts.py::<module>", "test_b.py::<module>",
                                            "fixtures.py::<module>", "lib.py::<module>"])
    assert users["consts.py::<module>"] == A_TESTS | B_TESTS
    assert users["test_b.py::<module>"] == B_TESTS
    assert users["fixtures.py::<module>"] == users["lib.py::<module>"] == A_TESTS | B_TESTS
    # A new value reaches the units that load LIMIT (through `from consts import LIMIT`)...
    assert recorded.selected_after("consts.py", "LIMIT = 5", "LIMIT = 6") == {
        "test_a.py::test_three", "test_b.py::test_b1"}
    # ...while a top level that now does something at import time reaches every importer.
    assert recorded.selected_after("consts.py", "LIMIT = 5", "LIMIT = 5\nprint('hi')") == \
        A_TESTS | B_TESTS


def test_session_fixture_reaches_every_user(recorded: Recorded) -> None:
    # Only test_one set shared_data up; test_two and test_three used the cached value.
    users = recorded.store.tests_for_units(["fixtures.py::shared_data", "lib.py::load"])
    assert users == {"fixtures.py::shared_data": A_TESTS, "lib.py::load": A_TESTS}
    assert recorded.selected_after("fixtures.py", "yield value\n", "yield value + ''\n") == A_TESTS
    # Its teardown (after the yield) ran in the last test of the session, test_b2.
    assert recorded.selected_after("fixtures.py", "value = None", "value = 0") == A_TESTS


def test_module_fixture_reaches_every_user(recorded: Recorded) -> None:
    users = recorded.store.tests_for_units(["fixtures.py::per_module"])
    want = {"test_a.py::test_two", "test_a.py::test_three", "test_b.py::test_b2"}
    assert users == {"fixtures.py::per_module": want}
    assert recorded.selected_after("fixtures.py", "return 3", "return 1 + 2") == want


def test_file_read_in_session_fixture_reaches_every_user(recorded: Recorded) -> None:
    assert recorded.store.tests_for_files(["data.txt"]) == {"data.txt": A_TESTS}
    assert recorded.selected_after("data.txt", "hello", "bye") == A_TESTS
