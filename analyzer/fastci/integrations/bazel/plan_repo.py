"""A stand-in for ``@fastci_plan`` that runs chosen tests at chosen overrides.

``fastci calibrate`` runs gpu_tests at workloads no plan asked for. It must not
write ``.fastci/plan.json`` for that: a calibration killed half-way would leave a
plan that the next ``bazel test //... --config=fastci`` obeys (a few tests,
reduced). Instead each calibration round writes a directory holding what the
``fastci_plan`` repository rule generates (``WORKSPACE``, ``BUILD.bazel``,
``plan.bzl`` with ``PLAN``) and passes it for that one command only::

    bazel test --config=fastci --override_repository=fastci_plan=DIR LABEL...

``PLAN`` has the shape of ``rules/private/plan_model.bzl``'s ``parse_plan``: a
selective plan whose ``tests`` map each label to its overrides. The rules check
the overrides against the test's floors and constraints as for any plan.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from fastci.errors import FastCIError
from fastci.types import TestId, normalize_test_id

__all__ = ["REPO_NAME", "override_flag", "write_plan_repo"]

#: The repository the gpu_test macro loads its plan from (rules/repositories.bzl).
REPO_NAME = "fastci_plan"


def _starlark(value: Any) -> str:
    """``value`` (JSON data) as a Starlark literal; raises on anything else."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FastCIError(f"plan override {value!r}: not a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid Starlark string literal
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_starlark(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_starlark(str(k))}: {_starlark(v)}"
                               for k, v in value.items()) + "}"
    raise FastCIError(f"plan override {value!r}: not JSON data")


def write_plan_repo(directory: Path, tests: Mapping[TestId, Mapping[str, Any]], *,
                    status: str) -> Path:
    """Write the stand-in repository into ``directory`` (created) and return it.

    Args:
        directory: an empty or new directory outside the workspace.
        tests: label -> overrides; every other gpu_test is outside the plan (under
            ``--config=fastci`` it runs at full workload if asked for: pass only
            these labels to ``bazel test``).
        status: what the plan says it is (shown in the tests' plan status).
    """
    directory.mkdir(parents=True, exist_ok=True)
    plan = {"ok": True, "mode": "select", "status": f"ok: {status}",
            "tests": {normalize_test_id(t): dict(o) for t, o in tests.items()},
            "skipped": {}}
    (directory / "WORKSPACE").write_text(f'workspace(name = "{REPO_NAME}")\n', encoding="utf-8")
    (directory / "BUILD.bazel").write_text('exports_files(["plan.bzl"])\n', encoding="utf-8")
    (directory / "plan.bzl").write_text(
        "# Written by fastci.integrations.bazel.plan_repo for one command (not a plan file).\n"
        f"PLAN = {_starlark(plan)}\n", encoding="utf-8")
    return directory


def override_flag(directory: Path) -> str:
    """The ``bazel`` flag that makes ``@fastci_plan`` the repository in ``directory``."""
    return f"--override_repository={REPO_NAME}={directory.resolve()}"
