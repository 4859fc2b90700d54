"""pytest wiring for the microllm suite: the ``workload`` fixture and override options.

    pytest examples/microllm/tests                         # full workloads (suite.bzl)
    pytest examples/microllm/tests --at-floors             # every test at its floors
    pytest examples/microllm/tests --workload train_iters=2 --workload num_layers=1
    FASTCI_WORKLOAD='{"train_iters": 2}' pytest examples/microllm/tests

A ``--workload`` dimension that a test does not declare is ignored for that test, as are
undeclared FASTCI_WORKLOAD keys; the result must still satisfy the test's constraints.

Each collected test carries its suite.bzl declaration as a ``fastci_workload`` marker, so a
FastCI plan run by pytest (``--fastci-plan``) checks its overrides against the same floors
and constraints as the Bazel rules, and runs the test at full workload when they fail.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

with warnings.catch_warnings():
    # torch warns at import when numpy is absent; microllm does not use numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import harness


MARKER = "fastci_workload"


def pytest_configure(config: pytest.Config) -> None:
    if not any(line.split("(")[0] == MARKER for line in config.getini("markers")):
        config.addinivalue_line("markers", f"{MARKER}(workload, floors, constraints, scope, "
                                "frozen, check, reference): the test's declared workload "
                                "(read by FastCI's plan plugin)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Attach each test's suite.bzl declaration (workload, floors, frozen, constraints, scope,
    check, reference)."""
    suite = harness.load_suite()
    for item in items:
        module = getattr(item, "module", None)
        spec = suite.get(getattr(module, "NAME", None) or "")
        if spec is None:
            continue
        item.add_marker(pytest.mark.fastci_workload(
            workload=dict(spec["workload"]), floors=dict(spec.get("floors", {})),
            constraints=list(spec.get("constraints", [])), scope=list(spec.get("scope", [])),
            frozen=list(spec.get("frozen", [])), check=spec.get("check"),
            reference=spec.get("reference")))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("microllm")
    group.addoption("--workload", action="append", default=[], metavar="DIM=VALUE",
                    help="override a workload dimension for every test that declares it")
    group.addoption("--at-floors", action="store_true", default=False,
                    help="run each test at its declared floors")


@pytest.fixture
def workload(request: pytest.FixtureRequest) -> dict[str, Any]:
    name = request.module.NAME
    declared = harness.load_suite()[name]["workload"]
    flags = []
    for item in request.config.getoption("--workload"):
        dim, sep, _ = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--workload expects DIM=VALUE, got {item!r}")
        if dim in declared:
            flags.append(f"--{item}")
    return harness.resolve(name, flags, os.environ, at_floors=request.config.getoption("--at-floors"))
