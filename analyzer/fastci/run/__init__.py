"""Stage 6, running: a plan in, test results (and recorded history) out.

``runner`` is ``fastci run``: it runs the plan through Bazel and records each
test's outcome in the store. ``launch`` is the main of every ``gpu_test`` under
Bazel, and ``gpus`` the lock-file pool that gives parallel tests disjoint GPUs.
``calibration_runs`` runs tests at the rungs of their workload ladder for ``fastci
calibrate``, and ``collect`` lists a pytest suite with its declarations in the tests'
own interpreter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastci import lazy_exports

if TYPE_CHECKING:
    from fastci.run.runner import (
        RunReport as RunReport,
        execute as execute,
    )

__all__ = [
    "RunReport",
    "execute",
]

__getattr__ = lazy_exports(__name__, {
    "RunReport": "fastci.run.runner",
    "execute": "fastci.run.runner",
})
