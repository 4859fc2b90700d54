"""Tests of the pytest side of a plan (PlanPlugin), with a real inner pytest run."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from plan_support import tie
from fastci.plan.model import Plan, PlannedTest, SkippedTest
from fastci.pytest.plan import PlanPlugin

SUITE = '''
import json, os
import pytest

def test_a():
    print("RAN a", os.environ.get("FASTCI_WORKLOAD"))

def test_b():
    print("RAN b", os.environ.get("FASTCI_WORKLOAD"))

@pytest.mark.fastci_workload(workload={"train_iters": 8}, floors={"train_iters": 2})
def test_c():
    print("RAN c", os.environ.get("FASTCI_WORKLOAD"))

def test_unplanned():
    print("RAN unplanned", os.environ.get("FASTCI_WORKLOAD"))
'''


def run_with(tmp_path: Path, plan: Plan, suite: str = SUITE) -> str:
    (tmp_path / "test_suite.py").write_text(suite)
    conftest = ("import json\nfrom fastci.plan.model import Plan\nfrom fastci.pytest.plan import PlanPlugin\n"
                "def pytest_configure(config):\n"
                f"    config.pluginmanager.register(PlanPlugin(Plan.from_json({plan.to_json()!r})))\n")
    (tmp_path / "conftest.py").write_text(conftest)
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                          "no:fastci", "--strict-markers", "-s", "-v", "-rw", "test_suite.py"],
                         cwd=tmp_path, capture_output=True, text=True)
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
    # One summary line, not one line per deselected test (issue 12 item 9).
    assert ("fastci: deselected 1 of 4 tests; --fastci-list-deselected to list them, "
            "`fastci explain TEST` for why") in out
    assert "test_suite.py::test_b: not affected by the change" not in out


def test_a_plan_given_to_pytest_runs_by_priority(tmp_path: Path) -> None:
    """A plan listing its tests out of priority order still runs highest priority first
    (issue 14 item 4): the plugin sorts as `fastci run` does."""
    plan = Plan(mode="selective", tests=(
        PlannedTest("test_suite.py::test_a", priority=0.2),
        PlannedTest("test_suite.py::test_b"),
        PlannedTest("test_suite.py::test_c", priority=0.9)))
    ran = re.findall(r"RAN (\w+)", run_with(tmp_path, plan))
    assert ran == ["c", "a", "b", "unplanned"]


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

        def get_closest_marker(self, name: str) -> object:
            assert name == "fastci_workload"
            return SimpleNamespace(args=(), kwargs={"workload": {"n": 4}, "floors": {"n": 1}})

        def warn(self, warning: Warning) -> None:
            raise AssertionError(f"unexpected warning {warning}")

    gen = plugin.pytest_runtest_protocol(Item(), None)  # type: ignore[arg-type]
    next(gen)
    import os
    assert json.loads(os.environ["FASTCI_WORKLOAD"]) == {"n": 1}
    with pytest.raises(StopIteration):
        next(gen)
    assert os.environ["FASTCI_WORKLOAD"] == "outer"


def test_fastci_plan_option_end_to_end(tmp_path: Path) -> None:
    """`pytest --fastci-plan PATH` (the plugin of fastci.pytest.plugin) applies the plan."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    plan = Plan(mode="selective", tests=(PlannedTest("test_suite.py::test_b"),),
                skipped=(SkippedTest("test_suite.py::test_a", "not affected"),
                         SkippedTest("test_suite.py::test_c", "not affected")))
    plan = tie(plan, tmp_path, tmp_path / "plan.json")
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
    plan_file.write_text(tie(plan, tmp_path, plan_file).to_json())
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fastci.pytest.plugin",
                          "-s", "-v", "--fastci-plan", str(plan_file), "--fastci-list-deselected",
                          "test_suite.py"],
                         cwd=suite, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.findall(r"RAN (\w+)", res.stdout) == ["c", "a", "unplanned"]
    assert "suite/test_suite.py::test_b: not affected by the change" in res.stdout


# --- Overrides are checked like the Bazel rules do (issue 9 item 12) -------------------------

DECLARED = '''
import json, os
import pytest

DECL = dict(workload={"train_iters": 8, "hidden_size": 64, "num_heads": 4, "tp": 2, "lr": 0.1},
            floors={"train_iters": 2, "hidden_size": 32, "num_heads": 2, "lr": 0.01},
            constraints=["hidden_size % num_heads == 0", "num_heads % tp == 0"],
            scope=["parallel_parity"])
CASES = ["valid", "below_floor", "negative", "frozen", "above_full", "constraint", "undeclared",
         "wrong_type"]

@pytest.mark.fastci_workload(**DECL)
@pytest.mark.parametrize("case", CASES)
def test_w(case):
    got = json.loads(os.environ.get("FASTCI_WORKLOAD") or "{}")
    print("RAN", case, json.dumps(got, sort_keys=True))
    # What a training test would do with a nonsense workload: fail.
    assert got.get("train_iters", 8) > 0

def test_no_declaration():
    print("RAN no_declaration", os.environ.get("FASTCI_WORKLOAD"))

@pytest.mark.fastci_workload(workload="not a dict")
def test_malformed():
    print("RAN malformed", os.environ.get("FASTCI_WORKLOAD"))
'''

OVERRIDES = {
    "valid": ({"train_iters": 2, "hidden_size": 32, "lr": 0.05}, None),
    "below_floor": ({"hidden_size": 16}, "hidden_size: 16 is below its floor 32"),
    "negative": ({"train_iters": -5}, "train_iters: -5 is below its floor 2"),
    "frozen": ({"tp": 1}, "tp: frozen (no floor declared), stays 2"),
    "above_full": ({"train_iters": 100}, "train_iters: 100 is above the full value 8"),
    "constraint": ({"num_heads": 3}, 'constraint "hidden_size % num_heads == 0" does not hold'),
    "undeclared": ({"seq_length": 16}, "seq_length: not a declared dimension"),
    "wrong_type": ({"train_iters": "2"}, "train_iters: expected int like the full value, got string"),
}


def test_overrides_apply_only_within_the_declaration(tmp_path: Path) -> None:
    tests = tuple(PlannedTest(f"test_suite.py::test_w[{case}]", overrides)
                  for case, (overrides, _) in OVERRIDES.items())
    tests += (PlannedTest("test_suite.py::test_no_declaration", {"train_iters": 2}),
              PlannedTest("test_suite.py::test_malformed", {"train_iters": 2}))
    out = run_with(tmp_path, Plan(mode="selective", tests=tests), DECLARED)
    ran = dict(re.findall(r"RAN (\w+) (\{.*?\}|None)", out))
    assert json.loads(ran["valid"]) == OVERRIDES["valid"][0]
    summary = out.split("fastci: overrides ignored, ran at full workload", 1)[1]
    for case, (_, why) in OVERRIDES.items():
        if why is None:
            continue
        assert json.loads(ran[case]) == {}, case  # full workload: nothing in FASTCI_WORKLOAD
        assert f"test_suite.py::test_w[{case}]: {why}" in summary, case
        assert f"test_suite.py::test_w[{case}]: overrides" in out  # the warning, too
    assert ran["no_declaration"] == "None" and ran["malformed"] == "None"
    assert "test_suite.py::test_no_declaration: the test declares no workload " \
           "(no @pytest.mark.fastci_workload)" in summary
    assert "test_suite.py::test_malformed: its fastci_workload marker is malformed" in summary
    assert "test_suite.py::test_w[valid]:" not in summary
    assert "10 passed" in out


def test_full_workload_test_needs_no_declaration(tmp_path: Path) -> None:
    # No overrides: nothing to check, no warning (a suite need not declare anything).
    plan = Plan(mode="selective", tests=(PlannedTest("test_suite.py::test_no_declaration"),))
    out = run_with(tmp_path, plan, DECLARED)
    assert "overrides ignored" not in out and "RAN no_declaration None" in out


SPY = '''
import json
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    print("WORKLOAD", item.name, json.dumps(item.funcargs.get("workload"), sort_keys=True))
'''


def test_real_microllm_items_check_overrides_against_suite_bzl(tmp_path: Path) -> None:
    """The microllm conftest attaches suite.bzl's declarations: the probe of the issue."""
    mllm = Path(__file__).resolve().parents[1] / "examples" / "microllm"
    tests = "examples/microllm/tests"
    floors = {"train_iters": 14, "num_layers": 1, "hidden_size": 32, "num_heads": 2,
              "seq_length": 8, "vocab_size": 50, "micro_batch_size": 1, "global_batch_size": 1}
    plan = Plan(mode="selective", tests=(
        PlannedTest(f"{tests}/config_validation_test.py::test_config_validation",
                    {"hidden_size": 16}),  # below its floor of 32
        PlannedTest(f"{tests}/lr_schedule_test.py::test_lr_schedule", floors)))
    (tmp_path / "plan.json").write_text(tie(plan, mllm).to_json())  # the plan is outside the repo
    (tmp_path / "fastci_spy.py").write_text(SPY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("FASTCI_WORKLOAD", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "fastci_spy",
                          "--strict-markers", "-s", "-v", "--fastci-plan", str(tmp_path / "plan.json"),
                          "tests/config_validation_test.py", "tests/lr_schedule_test.py"],
                         cwd=mllm, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    ran = {name: json.loads(wl) for name, wl in re.findall(r"WORKLOAD (\w+) (\{.*?\})", res.stdout)}
    suite = ast.literal_eval(re.search(r"SUITE = (\{.*\})", (mllm / "tests" / "suite.bzl").read_text(),
                                       re.S).group(1))  # type: ignore[union-attr]
    assert ran["test_config_validation"] == suite["config_validation_test"]["workload"]
    assert ran["test_lr_schedule"] == {**suite["lr_schedule_test"]["workload"], **floors}
    assert (f"{tests}/config_validation_test.py::test_config_validation: hidden_size: 16 is below "
            "its floor 32") in res.stdout


REDUCTION_DECL = '''
import json, os
import pytest

W = {"train_iters": 8, "tp": 2}

@pytest.mark.fastci_workload(workload=W, floors={"train_iters": 2}, frozen=["tp"],
                             check="tolerance", reference="relational")
def test_declared():
    print("RAN declared", os.environ.get("FASTCI_WORKLOAD"))

@pytest.mark.fastci_workload(workload=W, floors={"train_iters": 2}, check="performance")
def test_performance():
    print("RAN performance", os.environ.get("FASTCI_WORKLOAD"))

@pytest.mark.fastci_workload(workload=W, floors={"train_iters": 2}, frozen=[])
def test_incomplete_frozen():
    print("RAN incomplete_frozen", os.environ.get("FASTCI_WORKLOAD"))
'''


def test_marker_reduction_declaration_is_held_to_the_rules(tmp_path: Path) -> None:
    """Issue 13 item 0: frozen/check/reference on the marker, validated as validate.bzl does:
    a performance check takes no floors; a declared frozen list names every other dimension."""
    tests = tuple(PlannedTest(f"test_suite.py::test_{n}", {"train_iters": 2})
                  for n in ("declared", "performance", "incomplete_frozen"))
    out = run_with(tmp_path, Plan(mode="selective", tests=tests), REDUCTION_DECL)
    ran = dict(re.findall(r"RAN (\w+) (\{.*?\}|None)", out))
    assert json.loads(ran["declared"]) == {"train_iters": 2}
    assert ran["performance"] == "None" and ran["incomplete_frozen"] == "None"
    summary = out.split("fastci: overrides ignored, ran at full workload", 1)[1]
    assert "test_suite.py::test_performance: its declaration is invalid" in summary
    assert "test_suite.py::test_incomplete_frozen: its declaration is invalid" in summary
    assert "test_declared:" not in summary


@pytest.mark.parametrize("rerun", [False, True])
def test_a_pruned_test_runs_where_nothing_runs_it_after_a_failure(tmp_path: Path,
                                                                   rerun: bool) -> None:
    # A prune is safe only under the rerun-after-any-failure rule, which `fastci run`
    # enforces (it passes --fastci-prunes-rerun). Plain `pytest --fastci-plan` does not:
    # the pruned test runs there, at full workload, with one line saying why.
    (tmp_path / "test_suite.py").write_text(SUITE)
    plan = Plan(mode="selective", tests=(PlannedTest("test_suite.py::test_b"),),
                skipped=(SkippedTest("test_suite.py::test_a", "pruned: same contexts as test_b",
                                     ("test_suite.py::test_b",)),
                         SkippedTest("test_suite.py::test_c", "not affected")))
    (tmp_path / "plan.json").write_text(tie(plan, tmp_path, tmp_path / "plan.json").to_json())
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-v",
                          "--fastci-plan", "plan.json", "test_suite.py",
                          *(["--fastci-prunes-rerun"] if rerun else [])], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    ran = re.findall(r"RAN (\w+)", res.stdout)
    if rerun:
        assert ran == ["b", "unplanned"] and "2 deselected" in res.stdout
        assert "pruned test(s) ran" not in res.stdout
    else:
        assert ran == ["b", "a", "unplanned"] and "1 deselected" in res.stdout
        assert "RAN a None" in res.stdout  # full workload
        assert ("fastci: 1 pruned test(s) ran at full workload: a prune holds only where a "
                "failure runs the pruned tests, which `fastci run` does and this session "
                "does not") in res.stdout
