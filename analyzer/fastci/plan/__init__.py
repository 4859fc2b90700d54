"""Stage 5, the plan: a change in, ``.fastci/plan.json`` out.

``planner`` is the application behind ``fastci plan``, a pipeline of named steps:
gather its typed inputs (``inputs``: the declared tests, the runner's environment),
scan the change, select, narrow by lines and reduce (``calibrated``: the calibration
as a plan may use it; ``reduce``: each test's workload), prune, prioritize
(``prioritize``), and any error turns into a plan that runs everything. ``analysis``
is what it returns and ``summary`` what ``fastci plan`` prints of it. ``model`` is
the versioned plan format (frozen ``Plan``/``PlannedTest``/``SkippedTest``, JSON read
and atomic write, one-line ``PlanError``s) that every runner obeys; ``workload`` the
safe evaluator of workload constraints and overrides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastci import lazy_exports

if TYPE_CHECKING:
    from fastci.plan.model import (
        Plan as Plan,
        PlannedTest as PlannedTest,
        SkippedTest as SkippedTest,
        load_plan as load_plan,
        dump_plan as dump_plan,
        normalize_test_id as normalize_test_id,
    )
    from fastci.plan.analysis import Analysis as Analysis
    from fastci.plan.planner import analyze as analyze

__all__ = [
    "Plan",
    "PlannedTest",
    "SkippedTest",
    "load_plan",
    "dump_plan",
    "normalize_test_id",
    "Analysis",
    "analyze",
]

__getattr__ = lazy_exports(__name__, {
    "Plan": "fastci.plan.model",
    "PlannedTest": "fastci.plan.model",
    "SkippedTest": "fastci.plan.model",
    "load_plan": "fastci.plan.model",
    "dump_plan": "fastci.plan.model",
    "normalize_test_id": "fastci.plan.model",
    "Analysis": "fastci.plan.analysis",
    "analyze": "fastci.plan.planner",
})
