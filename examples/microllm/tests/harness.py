"""Shared plumbing of the microllm test suite: workloads, configs, comparisons, the main.

``suite.bzl`` is the single source of truth for each test's workload, floors, frozen
dimensions, scope, constraints, check and reference: Bazel loads it in BUILD.bazel, and this
module parses the same dict literal with ``ast.literal_eval``. A test's workload is resolved in this order (later wins):

1. the full workload declared in ``suite.bzl`` (or its floors, with ``at_floors``);
2. ``FASTCI_WORKLOAD`` (JSON object; dimensions the test does not declare are ignored);
3. ``--<dim>=<value>`` command-line flags (an undeclared dimension is an error).

Every test file is both a Bazel ``gpu_test`` main (``sys.exit(harness.main(NAME, check))``)
and a pytest module (``test_*`` functions taking the ``workload`` fixture from conftest.py).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

# The suite tests the microllm beside it (examples/microllm/microllm), never a copy installed
# elsewhere: a scratch worktree of a change (`fastci eval`'s pytest route) imports its own.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, PACKAGE_ROOT)

from microllm import device as devices  # noqa: E402
from microllm.config import FLAT_INDEX, Config  # noqa: E402

HERE = Path(__file__).resolve().parent
SUITE_FILE = HERE / "suite.bzl"
GOLDEN_DIR = HERE / "golden"
LOG = logging.getLogger("microllm.tests")

Workload = dict[str, Any]


class WorkloadError(Exception):
    """A workload override is malformed, undeclared or violates a constraint."""


def load_suite(path: Path = SUITE_FILE) -> dict[str, dict[str, Any]]:
    """Parse the ``SUITE = {...}`` dict literal out of suite.bzl."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SUITE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise WorkloadError(f"{path}: no SUITE = {{...}} assignment")


def coerce(full: Any, raw: Any, dim: str) -> Any:
    """Convert ``raw`` (a flag string or JSON value) to the type of the full value."""
    try:
        if isinstance(full, bool):
            if isinstance(raw, bool):
                return raw
            low = str(raw).lower()
            if low not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return low in ("true", "1")
        if isinstance(full, int):
            value = float(raw)
            if value != int(value):
                raise ValueError(raw)
            return int(value)
        if isinstance(full, float):
            return float(raw)
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"{dim}={raw!r}: expected {type(full).__name__}") from exc


def check_constraints(workload: Mapping[str, Any], constraints: Sequence[str]) -> None:
    """Check each constraint with FastCI's own evaluator (the rules use its Starlark twin; no eval)."""
    from fastci.plan.workload import constraint_problems

    problems = constraint_problems(constraints, workload)
    if problems:
        raise WorkloadError(f"workload violates {problems[0]}: {dict(workload)}")


def resolve(name: str, argv: Sequence[str] = (), env: Mapping[str, str] | None = None,
            at_floors: bool = False) -> Workload:
    """The workload a test runs with (see the module docstring for precedence)."""
    spec = load_suite()[name]
    full: Workload = dict(spec["workload"])
    workload = dict(full)
    if at_floors:
        workload.update(spec.get("floors", {}))
    raw_env = (env if env is not None else os.environ).get("FASTCI_WORKLOAD", "")
    if raw_env:
        try:
            data = json.loads(raw_env)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"FASTCI_WORKLOAD is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise WorkloadError("FASTCI_WORKLOAD must be a JSON object")
        workload.update({k: coerce(full[k], v, k) for k, v in data.items() if k in full})
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            raise WorkloadError(f"unexpected argument {arg!r} (want --<dim>=<value>)")
        dim, _, raw = arg[2:].partition("=")
        if dim not in full:
            raise WorkloadError(f"{name} declares no workload dimension {dim!r}")
        workload[dim] = coerce(full[dim], raw, dim)
    check_constraints(workload, spec.get("constraints", []))
    return workload


def config(workload: Mapping[str, Any], **fixed: Any) -> Config:
    """A validated Config from the workload's config dimensions plus fixed settings."""
    flat = {k: v for k, v in workload.items() if k in FLAT_INDEX}
    flat.update(fixed)
    return Config.from_flat(**flat).validate()


def device_kind() -> str:
    """The device kind this host runs the suite on (``cuda`` when a GPU is visible, else ``cpu``)."""
    return devices.resolve("auto")


def device() -> torch.device:
    """Where a test's own tensors go (rank 0's device): kernels checked outside ``train``."""
    return devices.rank_device(device_kind(), 0)


def reference_path(name: str, kind: str | None = None) -> Path:
    """The recorded reference of test ``name`` on a device kind.

    CPU keeps the historical name (``golden/<name>.json``); any other device has its own file
    (``golden/<name>.<kind>.json``), recorded on that device: CPU and CUDA kernels differ in
    the last bits, and a reference is never shared between them nor loosened to fit both.
    """
    kind = device_kind() if kind is None else kind
    return GOLDEN_DIR / (f"{name}.json" if kind == "cpu" else f"{name}.{kind}.json")


def regen_refusal(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why ``MICROLLM_REGEN_GOLDEN=1`` is refused here, or None where recording is allowed.

    Recording a reference makes the test a pass that checks nothing, so it is refused under
    Bazel (``TEST_TARGET``/``BAZEL_TEST``) and in CI: only a person (or ``make gpu-check``)
    running the file by hand may write one.
    """
    env = os.environ if env is None else env
    if env.get("MICROLLM_REGEN_GOLDEN") != "1":
        return None
    where = [k for k in ("TEST_TARGET", "BAZEL_TEST") if env.get(k)]
    if env.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        where.append("CI")
    if not where:
        return None
    return (f"{name}: MICROLLM_REGEN_GOLDEN=1 refused under {'/'.join(where)}: regenerating "
            f"checks nothing; run `python {name}.py` by hand outside Bazel and CI")


def missing_reference(name: str, path: Path, kind: str) -> str:
    """The one-line failure of a test whose device has no recorded reference yet."""
    return (f"{name}: no {kind} reference yet ({path.relative_to(HERE)}): record it on a {kind} host "
            f"with `MICROLLM_REGEN_GOLDEN=1 python examples/microllm/tests/{name}.py` "
            "(`make gpu-check` records missing CUDA references and brings them back), then commit it")


def assert_close(name: str, got: Sequence[float], want: Sequence[float], rtol: float, atol: float = 0.0) -> None:
    assert len(got) == len(want), f"{name}: {len(got)} values vs {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert math.isfinite(a) and abs(a - b) <= atol + rtol * abs(b), f"{name}[{i}]: {a!r} vs {b!r} (rtol {rtol})"


def assert_states_close(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], atol: float) -> float:
    """Every parameter within ``atol``; returns the largest difference."""
    assert set(got) == set(want), f"parameter names differ: {sorted(set(got) ^ set(want))[:5]}"
    worst = 0.0
    for key in want:
        assert got[key].shape == want[key].shape, f"{key}: {tuple(got[key].shape)} vs {tuple(want[key].shape)}"
        diff = float((got[key].float() - want[key].float()).abs().max()) if want[key].numel() else 0.0
        assert diff <= atol, f"{key}: max |diff| {diff:.3g} > {atol:.3g}"
        worst = max(worst, diff)
    return worst


def assert_states_equal(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), f"{key} differs bitwise"


def assert_runs_identical(got: Any, want: Any) -> None:
    """Two training runs agree bitwise: losses, gradient norms and final state.

    Gradient norms are compared as well as losses because Adam's first step hides
    a uniform gradient scale (a "summed instead of averaged" bug) from the losses.
    """
    assert got.losses == want.losses, f"losses differ: {got.losses} vs {want.losses}"
    assert got.grad_norms == want.grad_norms, f"grad norms differ: {got.grad_norms} vs {want.grad_norms}"
    assert_states_equal(got.state, want.state)


def main(name: str, check: Callable[[Workload], Any], argv: Sequence[str] | None = None) -> int:
    """Bazel entry point: resolve the workload from flags/env, run the check, return 0/1."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    try:
        workload = resolve(name, list(sys.argv[1:] if argv is None else argv))
    except WorkloadError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{name}: workload {json.dumps(workload, sort_keys=True)}")
    began = time.perf_counter()
    try:
        check(workload)
    except AssertionError as exc:
        print(f"FAIL {name} ({time.perf_counter() - began:.1f}s): {exc}")
        return 1
    print(f"PASS {name} ({time.perf_counter() - began:.1f}s)")
    return 0
