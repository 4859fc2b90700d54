"""`fastci run` on a pytest repository: priority order and --fail-fast (pytest -x)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fastci import cli
from fastci.evidence.store.db import EvidenceStore
from plan_support import tie
from fastci.plan.model import Plan, PlannedTest, dump_plan
from test_pytest_ids import _commit, _project

#: A test module's head: each test calls _ran(name), which appends it to order.txt.
RAN = '''
import os

def _ran(name):
    with open(os.path.join(os.path.dirname(__file__), "order.txt"), "a") as f:
        f.write(name + "\\n")
'''
ORDERED = RAN + '''
def test_a():
    _ran("a")

def test_b():
    _ran("b")
    assert False

def test_c():
    _ran("c")

def test_d():
    _ran("d")
'''


def ordered_project(tmp_path: Path, tests: str) -> Path:
    """A committed pytest project whose one test module is ``tests`` (tests that record
    their runs with :data:`RAN`'s ``_ran``)."""
    root = _project(tmp_path)
    (root / "pkg/tests/foo_test.py").unlink()
    (root / "pkg/tests/bar_test.py").write_text(tests)
    (root / ".gitignore").write_text("__pycache__/\n/.fastci/\norder.txt\n")
    _commit(root)
    return root


def run_plan(root: Path, plan: Plan, *flags: str) -> tuple[int, list[str]]:
    """``fastci run flags`` obeying ``plan`` (tied to ``root``'s tree): its exit status and
    what ``_ran`` recorded, in order."""
    dump_plan(tie(plan, root), root / ".fastci/plan.json")
    rc = cli.main(["run", "--root", str(root), *flags])
    ran = root / "pkg/tests/order.txt"
    return rc, ran.read_text().split() if ran.exists() else []


def _run(tmp_path: Path, *flags: str) -> tuple[int, list[str], Path]:
    root = ordered_project(tmp_path, ORDERED)
    f = "pkg/tests/bar_test.py::"
    # Written out of order; the priorities say c, b, a, d (d: no priority, last).
    plan = Plan("selective", tests=(PlannedTest(f + "test_d"), PlannedTest(f + "test_a", priority=0.2),
                                    PlannedTest(f + "test_c", priority=1.0),
                                    PlannedTest(f + "test_b", priority=0.6)))
    rc, order = run_plan(root, plan, *flags)
    return rc, order, root


def test_pytest_runs_the_plan_in_priority_order(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc, order, _ = _run(tmp_path)
    out = capsys.readouterr().out
    assert rc == 1 and order == ["c", "b", "a", "d"], out
    assert out.rstrip().splitlines()[-1] == "3 passed, 1 failed", out


def test_fail_fast_passes_x_and_counts_the_rest_not_run(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc, order, root = _run(tmp_path, "--fail-fast")
    out = capsys.readouterr().out
    assert rc == 1 and order == ["c", "b"], out
    lines = out.rstrip().splitlines()
    assert lines[-1] == "1 passed, 1 failed, 2 not run", out
    assert "NOT RUN    pkg/tests/bar_test.py::test_a (--fail-fast stopped the run)" in out
    assert any(line.startswith("fastci run: time to first failure: ")
               and line.endswith("(pkg/tests/bar_test.py::test_b)") for line in lines), out
    assert f"{sys.executable} -m pytest -p fastci.pytest_plugin" in out and " -x" in out
    with EvidenceStore.open(root / ".fastci/evidence.db") as store:
        assert set(store.latest_runs()) == {"pkg/tests/bar_test.py::test_c",
                                            "pkg/tests/bar_test.py::test_b"}
