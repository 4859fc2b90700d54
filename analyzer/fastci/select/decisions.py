"""Selection decisions as values: a kind (readable enum value) plus a sentence.

Every test in the universe gets exactly one :class:`Decision`: selected with one
or more :class:`Reason` s, or skipped with the reason it is not affected. A
plan-wide widening (run everything) is a :class:`Reason` too.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar, overload

from fastci.types import RelPath, TestId, UnitId


class DecisionKind(enum.Enum):
    """Why a test runs or not; the value is what a person reads."""

    # A test runs because the change reaches it ...
    CHANGED_UNIT = "executes a changed unit"
    IMPORTS_CHANGED_MODULE = "imports a module whose import-time code changed"
    USES_CHANGED_NAME = "executes a unit that uses a name rebound at import time"
    UNPARSABLE_FILE = "touches a file that does not parse"
    READ_CHANGED_FILE = "read a changed file"
    PATH_RULE = "mapped to a changed path by fastci.yaml"
    COMPILED_CODE = "runs compiled or traced code that changed"
    STATIC_REACH = "imports or discovers a new, deleted or newly named module"
    CHANGED_SINCE_RECORDED = "a path that runs everything changed since its evidence was recorded"
    CHANGED_DISTRIBUTION = "imported a distribution whose requirement changed"
    UNSEEN_CODE = "runs a module where changed code no recording saw executing"
    DECLARED_INPUT = "declares an input file its evidence holds no digest of"
    # ... or because its evidence cannot be trusted ...
    NO_EVIDENCE = "has no evidence"
    INCOMPLETE_EVIDENCE = "its recording did not complete"
    ENVIRONMENT_CHANGED = "its evidence was recorded in another environment"
    ENVIRONMENT_PACKAGES = "imported a package that differs in this environment"
    FAILED_LAST = "failed in its last run"
    NEW_TEST = "is a new test"
    MODIFIED_TEST = "the test itself changed"
    # ... or because the whole plan widened.
    RUN_ALL_PATH = "a path configured to run everything changed"
    UNKNOWN_PATH = "a changed path is unknown to FastCI"
    ERROR = "change analysis failed"
    # Not run.
    NOT_AFFECTED = "not affected by the change"
    NOT_DECLARED = "no longer declared"
    PRUNED = "runs the changed code only in contexts other planned tests run"
    LINES_NOT_RUN = "enters the changed functions but runs none of their changed lines"


#: Kinds that set an affected test aside: it keeps the reasons it was affected after
#: this one, and is skipped.
SET_ASIDE_KINDS = frozenset({DecisionKind.PRUNED, DecisionKind.LINES_NOT_RUN})

#: Kinds that skip a test; every other kind selects it (but a test set aside, see
#: :data:`SET_ASIDE_KINDS`, is skipped).
SKIP_KINDS = frozenset({DecisionKind.NOT_AFFECTED, DecisionKind.NOT_DECLARED}) | SET_ASIDE_KINDS

#: Kinds that widen the whole plan to every test.
WIDEN_KINDS = frozenset({DecisionKind.RUN_ALL_PATH, DecisionKind.UNKNOWN_PATH,
                         DecisionKind.ERROR})


@dataclass(frozen=True)
class Reason:
    """One reason for a decision, with the chain that led to it.

    Attributes:
        kind: the decision kind.
        sentence: a complete sentence for a person.
        unit: the changed unit, when a unit led here.
        change: what happened to it (``function body changed``) or to the path.
        path: the changed path, when a path led here.
        via: the evidence row or static rule that connects the change to the test.
        stand_ins: a pruned test's stand-ins (kind PRUNED), the tests that run for it.
    """

    kind: DecisionKind
    sentence: str
    unit: UnitId | None = None
    change: str | None = None
    path: RelPath | None = None
    via: str | None = None
    stand_ins: tuple[TestId, ...] = ()

    def to_json(self) -> dict[str, str]:
        """A JSON-ready dict without empty fields."""
        out = {"kind": self.kind.name.lower(), "sentence": self.sentence}
        for key in ("unit", "change", "path", "via"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out


_T = TypeVar("_T")


class _once(Generic[_T]):
    """``functools.cached_property`` without its lock (Python 3.11 takes one per first
    read, a cost on each of a plan's 100,000 decisions): the value is computed on first
    read and kept in the instance's ``__dict__``, where later reads find it first. For
    frozen dataclasses of values, computed from their fields (the same whichever thread
    computes it first)."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "_once[_T]": ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> "_T | _once[_T]":
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value
        return value


@dataclass(frozen=True)
class Decision:
    """The decision for one test (its derived properties are computed once: a plan asks
    each of 100,000 decisions several times)."""

    test: TestId
    reasons: tuple[Reason, ...]
    est_gpu_s: float | None = None
    priority: float = 0.0

    @_once
    def pruned(self) -> bool:
        """Whether the test was affected but pruned (:mod:`fastci.select.prune`)."""
        return any(r.kind is DecisionKind.PRUNED for r in self.reasons)

    @property
    def stand_ins(self) -> tuple[TestId, ...]:
        """A pruned test's stand-ins (empty for any other decision)."""
        return next((r.stand_ins for r in self.reasons if r.kind is DecisionKind.PRUNED), ())

    @_once
    def set_aside(self) -> bool:
        """Whether the test was affected but is skipped (pruned, or no changed line runs)."""
        return any(r.kind in SET_ASIDE_KINDS for r in self.reasons)

    @_once
    def selected(self) -> bool:
        """Whether the test runs."""
        return not self.set_aside and not all(r.kind in SKIP_KINDS for r in self.reasons)

    @staticmethod
    def sharing(reasons: tuple[Reason, ...]) -> Callable[[TestId, float | None], Decision]:
        """A maker of decisions that all have ``reasons`` (the same tuple): their derived
        properties are computed once, here, not once per decision (at scale, the 100,000
        tests no change reaches share one reason). Each decision made is equal to
        ``Decision(test, reasons, est_gpu_s)``."""
        model = Decision(TestId(""), reasons)
        shared = {"reasons": reasons, "priority": 0.0, "pruned": model.pruned,
                  "set_aside": model.set_aside, "selected": model.selected, "why": model.why}
        new = object.__new__

        def make(test: TestId, est_gpu_s: float | None) -> Decision:
            d: Decision = new(Decision)
            fields = d.__dict__
            fields["test"] = test
            fields.update(shared)
            fields["est_gpu_s"] = est_gpu_s
            return d
        return make

    @_once
    def why(self) -> str:
        """The plan's one-line ``why``: the first reason, plus how many more."""
        if self.set_aside:
            return next(r.sentence for r in self.reasons if r.kind in SET_ASIDE_KINDS)
        primary = [r for r in self.reasons if r.kind not in SKIP_KINDS] or list(self.reasons)
        text = primary[0].sentence
        if len(primary) > 1:
            text += f" (+{len(primary) - 1} more reason{'s' * (len(primary) > 2)})"
        return text


@dataclass(frozen=True)
class Selection:
    """The outcome of selection: one decision per test, plan-wide widenings, notes."""

    decisions: tuple[Decision, ...]
    widen: tuple[Reason, ...] = ()
    notes: tuple[str, ...] = ()
    summary: str = ""
    #: The git-ignored files recorded tests read, with their digest at selection time
    #: (None: absent): what the plan relies on besides its tree (the plan's ``inputs``).
    inputs: tuple[tuple[RelPath, str | None], ...] = ()

    @functools.cached_property
    def by_test(self) -> dict[TestId, Decision]:
        """Test id -> its decision (derived from ``decisions``)."""
        return {d.test: d for d in self.decisions}

    @_once
    def _split(self) -> tuple[tuple[Decision, ...], tuple[Decision, ...]]:
        """(selected, skipped), each in decision order (derived from ``decisions``)."""
        chosen = tuple(d for d in self.decisions if d.selected)
        return chosen, tuple(d for d in self.decisions if not d.selected)

    @property
    def selected(self) -> list[Decision]:
        """Selected tests in run order."""
        return list(self._split[0])

    @property
    def skipped(self) -> list[Decision]:
        """Skipped tests."""
        return list(self._split[1])

    @property
    def mode(self) -> str:
        """``all`` when the plan widened to everything, else ``selective``."""
        return "all" if self.widen else "selective"
