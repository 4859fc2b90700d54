"""Tests of the pytest side of a plan (PlanPlugin), with a real inner pytest run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fastci.plan import Plan, PlannedTest, SkippedTest
from fastci.pytest_plan import PlanPlugin

SUITE = '''
import json, os

def test_a():
    print("RAN a", os.environ.get("FASTCI_WORKLOAD"))

def test_b():
    print("RAN b", os.environ.get("FASTCI_WORKLOAD"))

def test_c():
    print("RAN c", os.environ.get("FASTCI_WORKLOAD"))

def test_unplanned():
    print("RAN unplanned", os.environ.get("FASTCI_WORKLOAD"))
'''


def run_with(tmp_path: Path, plan: Plan) -> str:
    (tmp_path / "test_suite.py").write_text(SUITE)
    conftest = ("import json\nfrom fastci.plan import Plan\nfrom fastci.pytest_plan import PlanPlugin\n"
                "def pytest_configure(config):\n"
                f"    config.pluginmanager.register(PlanPlugin(Plan.from_json({plan.to_json()!r})))\n")
    (tmp_path / "conftest.py").write_text(conftest)
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                          "no:fastci", "-s", "-v", "test_suite.py"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_deselects_skipped_with_reasons_and_orders_by_plan(tmp_path: Path) -> None:
    plan = Plan(mode="selective", tests=(
        PlannedTest("test_suite.py::test_c", {"train_iters": 2}),
        PlannedTest("test_suite.py::test_a")),
        skipped=(SkippedTest("test_suite.py::test_b", "not affected by the change"),))
    out = run_with(tmp_path, plan)
    ran = re.findall(r"RAN (\w+)", out)
    assert ran == ["c", "a", "unplanned"]  # plan order; an unplanned test still runs, last
    assert 'RAN c {"train_iters": 2}' in out and "RAN a None" in out
    assert "1 deselected" in out
    assert "test_suite.py::test_b: not affected by the change" in out


def test_mode_all_deselects_nothing(tmp_path: Path) -> None:
    plan = Plan(mode="all", reason="environment changed",
                skipped=(SkippedTest("test_suite.py::test_b", "x"),))
    out = run_with(tmp_path, plan)
    assert sorted(re.findall(r"RAN (\w+)", out)) == ["a", "b", "c", "unplanned"]
    assert "mode all" in out


def test_plugin_restores_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTCI_WORKLOAD", "outer")
    plugin = PlanPlugin(Plan(mode="selective", tests=(PlannedTest("x::t", {"n": 1}),)))

    class Item:
        nodeid = "x::t"

    gen = plugin.pytest_runtest_protocol(Item(), None)  # type: ignore[arg-type]
    next(gen)
    import os
    assert json.loads(os.environ["FASTCI_WORKLOAD"]) == {"n": 1}
    with pytest.raises(StopIteration):
        next(gen)
    assert os.environ["FASTCI_WORKLOAD"] == "outer"


def test_fastci_plan_option_end_to_end(tmp_path: Path) -> None:
    """`pytest --fastci-plan PATH` (the plugin of fastci.pytest_plugin) applies the plan."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    plan = Plan(mode="selective", tests=(PlannedTest("test_suite.py::test_b"),),
                skipped=(SkippedTest("test_suite.py::test_a", "not affected"),
                         SkippedTest("test_suite.py::test_c", "not affected")))
    (tmp_path / "plan.json").write_text(plan.to_json())
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v",
                          "--fastci-plan", "plan.json", "test_suite.py"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.findall(r"RAN (\w+)", res.stdout) == ["b", "unplanned"]
    assert "2 deselected" in res.stdout


def test_repo_relative_plan_ids_match_from_a_sub_rootdir(tmp_path: Path) -> None:
    # Evidence names pytest tests relative to the repo root; pytest's node ids are
    # relative to its rootdir (here the `suite/` folder with its own pytest.ini).
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_suite.py").write_text(SUITE)
    plan = Plan(mode="selective", tests=(PlannedTest("suite/test_suite.py::test_c"),),
                skipped=(SkippedTest("suite/test_suite.py::test_b", "not affected by the change"),))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fastci.pytest_plugin",
                          "-s", "-v", "--fastci-plan", str(plan_file), "test_suite.py"],
                         cwd=suite, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.findall(r"RAN (\w+)", res.stdout) == ["c", "a", "unplanned"]
    assert "suite/test_suite.py::test_b: not affected by the change" in res.stdout
