"""Stage 5, the plan: a selection in, ``.fastci/plan.json`` out.

``model`` is the versioned plan format (frozen ``Plan``/``PlannedTest``/
``SkippedTest``, JSON read and atomic write, one-line ``PlanError``s) that every
runner obeys; ``build`` is the application behind ``fastci plan``: it gathers the
change, the evidence and the declared tests, runs selection, and turns any error
into a plan that runs everything.
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
