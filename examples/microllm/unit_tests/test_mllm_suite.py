"""The suite's declarations (suite.bzl) are consistent with the test files and the harness."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import harness
from microllm.config import FLAT_INDEX

SUITE = harness.load_suite()
TESTS_DIR = harness.HERE
# Workload dimensions that are not config fields: each is read by its test directly.
TEST_DIMS = {"decode_tokens", "load_tp", "load_pp", "loss_threshold", "min_tokens_per_s", "logit_scale"}
SCOPES = {"parallel_parity", "kernel_parity", "checkpoint_resume", "checkpoint_reshard", "data_resume",
          "determinism", "convergence", "golden_regression", "throughput", "smoke", "optimizer_parity",
          "distributed_backend", "moe", "decode_parity", "recompute_parity", "grad_accumulation", "eval",
          "lr_schedule", "numerics", "config_validation", "loss_scaling",
          "checkpoint_integrity"}


def test_suite_size_and_scope_span() -> None:
    assert 20 <= len(SUITE) <= 30
    scopes = {s for spec in SUITE.values() for s in spec["scope"]}
    for needed in ("parallel_parity", "kernel_parity", "checkpoint_resume", "data_resume", "determinism",
                   "convergence", "golden_regression", "throughput", "smoke"):
        assert needed in scopes


@pytest.mark.parametrize("name", sorted(SUITE))
def test_entry_is_consistent(name: str) -> None:
    spec = SUITE[name]
    keys = {"gpus", "workload", "floors", "frozen", "scope", "constraints", "check", "reference", "tags"}
    assert keys <= set(spec) <= keys | {"cpu_workload"}
    source = (TESTS_DIR / f"{name}.py").read_text(encoding="utf-8")
    module = ast.parse(source)
    names = {t.id: n.value.value for n in module.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    assert names.get("NAME") == name
    assert f"harness.main(NAME, check)" in source and "def test_" in source
    w, floors = spec["workload"], spec["floors"]
    for dim in w:
        assert dim in FLAT_INDEX or dim in TEST_DIMS, f"unknown dimension {dim}"
    for dim, floor in floors.items():
        assert type(floor) is type(w[dim]) and 0 < floor <= w[dim], dim
    harness.check_constraints(w, spec["constraints"])
    harness.check_constraints({**w, **floors}, spec["constraints"])
    # The CPU scale (a host without GPUs; validate.bzl check_cpu_workload): reducible dims only,
    # between floor and full, and a workload the test accepts.
    cpu = spec.get("cpu_workload", {})
    for dim, value in cpu.items():
        assert dim in floors and type(value) is type(w[dim]) and floors[dim] <= value <= w[dim], dim
    harness.check_constraints({**w, **cpu}, spec["constraints"])
    assert set(spec["scope"]) <= SCOPES
    assert spec["check"] in ("exact", "tolerance", "threshold", "completes", "performance")
    assert spec["reference"] in ("relational", "absolute")
    assert not [t for t in spec["tags"] if t.startswith(("check:", "reference:"))], "now attributes"
    # Every dimension either shrinks to its floor or is frozen, never both (validate.bzl).
    assert sorted(spec["frozen"]) == sorted(d for d in w if d not in floors)
    parallel = w.get("tp", 1) * w.get("pp", 1) * w.get("dp", 1)
    if "config_validation" in spec["scope"]:
        assert spec["gpus"] == 0, "validation never starts ranks"
    else:
        assert spec["gpus"] >= parallel
    if "throughput" in spec["scope"] or "convergence" in spec["scope"]:
        assert floors == {}, "absolute performance/convergence checks are never reduced"
    if "throughput" in spec["scope"]:
        assert spec["check"] == "performance"


def test_build_file_declares_every_suite_entry() -> None:
    build = (TESTS_DIR / "BUILD.bazel").read_text(encoding="utf-8")
    assert 'load(":suite.bzl", "SUITE")' in build and "for name, spec in SUITE.items()" in build


def test_resolve_precedence_and_errors() -> None:
    name = "tp_parity_test"
    full = SUITE[name]["workload"]
    assert harness.resolve(name, env={}) == full
    floors = harness.resolve(name, env={}, at_floors=True)
    assert floors["train_iters"] == SUITE[name]["floors"]["train_iters"] and floors["tp"] == full["tp"]
    env = {"FASTCI_WORKLOAD": json.dumps({"train_iters": 3, "not_mine": 1})}
    assert harness.resolve(name, env=env)["train_iters"] == 3
    assert harness.resolve(name, ["--train_iters=4"], env=env)["train_iters"] == 4
    with pytest.raises(harness.WorkloadError, match="declares no workload dimension"):
        harness.resolve(name, ["--bogus=1"], env={})
    with pytest.raises(harness.WorkloadError, match="expected int"):
        harness.resolve(name, ["--train_iters=2.5"], env={})
    with pytest.raises(harness.WorkloadError, match="violates constraint"):
        harness.resolve(name, ["--num_heads=3"], env={})


def test_golden_matches_declared_workload() -> None:
    golden = json.loads((TESTS_DIR / "golden" / "golden_loss_test.json").read_text(encoding="utf-8"))
    assert golden["workload"] == SUITE["golden_loss_test"]["workload"]
    assert len(golden["losses"]) == golden["workload"]["train_iters"]


def test_the_suite_imports_the_microllm_beside_it(tmp_path: Path) -> None:
    """A copy of the example (a change's scratch worktree) tests its own microllm, not the
    one installed in the environment (an editable install points at another checkout)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "microllm"
    shutil.copytree(TESTS_DIR.parent / "microllm", copy / "microllm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TESTS_DIR, copy / "tests", ignore=shutil.ignore_patterns("__pycache__", "test_*.py"))
    with (copy / "microllm" / "__init__.py").open("a", encoding="utf-8") as f:
        f.write("\nCHANGED_COPY = True\n")
    (copy / "tests" / "test_which.py").write_text(
        "import subprocess, sys, os\nimport harness, microllm\n\ndef test_which():\n"
        "    assert getattr(microllm, 'CHANGED_COPY', False), microllm.__file__\n"
        "    env = dict(os.environ, PYTHONPATH=harness.PACKAGE_ROOT)\n"
        "    out = subprocess.run([sys.executable, '-c', 'import microllm; print(microllm.CHANGED_COPY)'],\n"
        "                         env=env, capture_output=True, text=True, check=True).stdout\n"
        "    assert out.strip() == 'True'\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(copy / "tests" / "test_which.py")],
                         cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:]
