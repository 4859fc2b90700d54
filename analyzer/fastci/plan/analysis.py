"""What the planner computed for a change: the :class:`Analysis` record.

A value (no I/O): :func:`fastci.plan.planner.analyze` makes it, ``fastci plan`` writes
its plan and prints :func:`fastci.plan.summary.summarize` of it, ``fastci explain`` and
the evaluation read its selection and choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple

from fastci.changes.scan import ChangeSet
from fastci.plan.model import Plan
from fastci.select import Selection
from fastci.types import TestId

if TYPE_CHECKING:
    from fastci.plan.reduce import Choice
    from fastci.select.lines import Reach


class Timing(NamedTuple):
    """A test's newest recorded duration and its GPUs (declared GPUs win over recorded).

    A named tuple: a plan makes one per known test (100,000 at scale)."""

    duration_s: float | None  # None: never run (or its duration is not known)
    gpus: int


@dataclass(frozen=True)
class Analysis:
    """What ``fastci plan`` computed: the selection, the plan, the changes, the time.

    ``runner`` and ``runner_why`` say who declared the tests and why
    (:func:`fastci.plan.inputs.choose_runner`; None when the caller passed the declared tests);
    ``timing`` holds each known test's recorded duration and GPUs, for the summary.
    """

    selection: Selection
    plan: Plan
    changes: ChangeSet | None
    elapsed_s: float
    runner: str | None = None
    runner_why: str = ""
    timing: Mapping[TestId, Timing] = field(default_factory=dict)
    #: The workload chosen for each selected test that declares something reducible.
    choices: Mapping[TestId, Choice] = field(default_factory=dict)
    #: Line evidence of the selected tests it speaks for (:func:`fastci.select.lines.line_facts`).
    lines: Mapping[TestId, tuple[Reach, ...]] = field(default_factory=dict)
