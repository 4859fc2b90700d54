"""The CPU scale: a smaller workload a ``gpu_test`` declares for hosts without GPUs.

A test's declared ``workload`` is what a GPU CI runs. ``cpu_workload`` (a ``gpu_test``
attribute, ``FASTCI_CPU_WORKLOAD`` in the test's environment) lowers some of its reducible
dimensions for a CPU-only host, where the same training would not fit the CI's time budget.
The launcher applies it (:func:`cpu_scaled`) only when the host has no GPU at all — not when
the test merely got none (a ``gpus = 0`` test on a GPU host runs its declared workload) — so
on a GPU host the declared full workload runs, never a smaller one by accident.

A scaled run is recorded as what it is: ``fastci_workload.json`` says ``"scale": "cpu"`` and
which dimensions the scale lowered, and the lowered dimensions are overrides like a plan's
(the recorder's run row, the calibration's rung), so evidence and calibration measured at the
CPU scale never pass for the declared workload's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from fastci.errors import FastCIError

CPU_WORKLOAD_ENV = "FASTCI_CPU_WORKLOAD"
DECLARED = "declared"
CPU = "cpu"


class ScaleError(FastCIError):
    """``FASTCI_CPU_WORKLOAD`` is malformed or does not fit the declared workload."""


@dataclass(frozen=True)
class Scaled:
    """The workload a run uses and the scale it was taken at.

    Attributes:
        workload: the workload to run.
        scale: ``declared`` (the declared workload, with a plan's overrides if any) or ``cpu``.
        applied: the dimensions the CPU scale lowered, with their new values.
    """

    workload: Mapping[str, Any]
    scale: str = DECLARED
    applied: Mapping[str, Any] = field(default_factory=dict)


def parse_cpu_workload(raw: str, declared: Mapping[str, Any] | None) -> dict[str, Any]:
    """``FASTCI_CPU_WORKLOAD`` as a dict; every dimension declared and numeric like its full value.

    Raises:
        ScaleError: not a JSON object, an undeclared dimension, or a value of another type.
    """
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ScaleError(f"{CPU_WORKLOAD_ENV} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ScaleError(f"{CPU_WORKLOAD_ENV}: expected a JSON object, got {type(data).__name__}")
    for dim, value in data.items():
        if declared is not None and dim not in declared:
            raise ScaleError(f"{CPU_WORKLOAD_ENV}: {dim!r} is not a declared dimension")
        full = None if declared is None else declared[dim]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or (full is not None and type(full) is not type(value)):
            raise ScaleError(f"{CPU_WORKLOAD_ENV}: {dim}: expected a number typed like the "
                             f"declared {full!r}, got {value!r}")
    return dict(data)


def cpu_scaled(workload: Mapping[str, Any], cpu_workload: Mapping[str, Any],
               host_has_gpu: bool) -> Scaled:
    """The workload to run: ``workload`` on a GPU host, else each CPU-scale dimension lowered.

    A dimension is lowered to the CPU value, never raised: a plan that already reduced it
    further keeps its value.
    """
    if host_has_gpu or not cpu_workload:
        return Scaled(dict(workload))
    out = dict(workload)
    applied = {}
    for dim, value in sorted(cpu_workload.items()):
        if dim in out and value < out[dim]:
            out[dim] = value
            applied[dim] = value
    return Scaled(out, CPU if applied else DECLARED, applied)
