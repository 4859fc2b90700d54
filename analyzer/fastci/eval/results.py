"""The results of ``fastci eval``: one JSON object per evaluated change (``results.jsonl``).

Each line is a :class:`ChangeResult`: the change, the plan FastCI made for it, what
running every test at full workload measured (*run-all*), what the plan's runs
measured, and the comparison (cost, latency, retention, detection, order). The
format is versioned (:data:`SCHEMA_VERSION`); the fields are documented in
docs/EVAL.md. Lines from several runs merge (:func:`merge`): a change evaluated
twice under the same settings keeps the newer line, so two result files of
different commits or machines combine into one report.

Reading is strict about shape and lenient about nothing else: a line that is not
a result of this schema is an :class:`EvalResultsError` naming the file and line,
never a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from fastci.errors import FastCIError

#: Version of the line format; bump on any incompatible change (docs/EVAL.md).
SCHEMA_VERSION = 1


class EvalResultsError(FastCIError):
    """A results file cannot be read or a line does not follow the schema."""


@dataclass(frozen=True)
class TestOutcome:
    """One test in one evaluated change.

    Attributes:
        id: the test id (a Bazel label or a pytest node id).
        gpus: GPUs the test declares (0: a CPU test; it costs one slot-second per second).
        all_outcome: its outcome when everything ran at full workload
            (``passed``, ``failed``, ``skipped``, ``not run``).
        all_s: its duration then, in seconds.
        planned: whether the plan runs it.
        overrides: the plan's workload overrides for it (empty: full workload).
        plan_outcome: its outcome in the plan's runs ("" when not planned).
        plan_s: its duration in the plan's runs (0 when not planned).
        reused: the plan runs it at full workload, the very action run-all ran, so its
            run-all execution is its plan execution (not run twice).
        why: the plan's reason for running, reducing or skipping it.
    """

    id: str
    gpus: int
    all_outcome: str
    all_s: float
    planned: bool
    overrides: Mapping[str, Any] = field(default_factory=dict)
    plan_outcome: str = ""
    plan_s: float = 0.0
    reused: bool = False
    why: str = ""


@dataclass(frozen=True)
class Arm:
    """What one way of testing the change measured.

    Attributes:
        tests: tests run.
        gpu_s: sum of duration x max(GPUs, 1) over them (a CPU test counts as one slot).
        latency_s: wall-clock from the change to the last result on the evaluation's
            GPU slots: analysis time (FastCI's arm only) + the list-scheduled run.
        failing: tests that failed, sorted.
        ttff_s: time from the change to the first failing result (None: nothing failed).
        apfdc: APFDc of the arm's order, each failing test a fault (None: nothing failed).
    """

    tests: int
    gpu_s: float
    latency_s: float
    failing: tuple[str, ...] = ()
    ttff_s: float | None = None
    apfdc: float | None = None


@dataclass(frozen=True)
class ChangeResult:
    """One evaluated change (one line of ``results.jsonl``).

    Attributes:
        change: the change's id: ``commit:<sha>``, ``patch:<file name>`` or
            ``fault:<parent id>:<mutant name>``.
        kind: ``commit``, ``patch`` or ``fault``.
        title: a human line (a commit's subject, a patch's header, a fault's edit).
        base: the commit the change is planned against.
        head: the commit or tree id of the changed tree.
        parent: for a fault, the change it was made on top of ("" otherwise).
        fault: for a fault, its operator, unit, line and edit (empty otherwise).
        settings: what the evaluation ran with: ``gpu_slots``, ``tests`` (the subset, []
            for all), ``prune``, ``granularity``, ``priority``, ``reduce``.
        plan_mode: the plan's mode (``selective``, ``all``...).
        plan_reason: the plan's one-line reason.
        analysis_s: the time ``fastci plan``'s analysis took.
        run_all: run-all at full workload.
        fastci: the plan's runs.
        changed_lines: changed lines (``path:line``) run-all executed, count.
        retained_lines: of those, how many the plan's runs executed.
        missed: tests failing under run-all that the plan did not run and see fail,
            sorted, each with why (the plan's reason for skipping or reducing it).
        tests: every test's row.
        timing: seconds the evaluation spent: ``runs`` (test executions it ran now),
            ``analysis``, ``bookkeeping`` (workspace, traces, metrics), ``cached``
            (run-all results reused from an earlier evaluation: not run now).
        run_all_cached: run-all's results came from the baseline cache.
        recorded_at: when the line was written (seconds since the epoch).
        fastci_version: the FastCI version that wrote it.
        note: what went wrong, if anything ("" otherwise).
        strategies: per prioritization strategy, the APFDc of its order of the plan's
            selected tests on run-all's measured costs and failures: ``change`` (the
            change one fault, found by its first failing test) and ``tests`` (each
            failing test a fault); empty when nothing the plan selected failed.
        schema: :data:`SCHEMA_VERSION`.
    """

    change: str
    kind: str
    title: str
    base: str
    head: str
    settings: Mapping[str, Any]
    plan_mode: str
    plan_reason: str
    analysis_s: float
    run_all: Arm
    fastci: Arm
    changed_lines: int
    retained_lines: int
    missed: tuple[Mapping[str, str], ...] = ()
    tests: tuple[TestOutcome, ...] = ()
    parent: str = ""
    fault: Mapping[str, Any] = field(default_factory=dict)
    timing: Mapping[str, float] = field(default_factory=dict)
    run_all_cached: bool = False
    recorded_at: float = 0.0
    fastci_version: str = ""
    note: str = ""
    strategies: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    @property
    def detected_by_all(self) -> bool:
        """Whether running everything saw the change fail."""
        return bool(self.run_all.failing)

    @property
    def detected(self) -> bool:
        """Whether the plan saw a failure that running everything saw too."""
        return bool(set(self.fastci.failing) & set(self.run_all.failing))

    @property
    def retention(self) -> float:
        """Changed lines the plan executed / changed lines run-all executed (1.0: none)."""
        return self.retained_lines / self.changed_lines if self.changed_lines else 1.0

    @property
    def key(self) -> tuple[str, str]:
        """What makes two lines the same evaluation: the change and the settings."""
        return self.change, json.dumps(dict(self.settings), sort_keys=True)

    def to_json(self) -> str:
        """One line of JSON (keys sorted, no NaN)."""
        return json.dumps(asdict(self), sort_keys=True, allow_nan=False)


def _arm(raw: Any, where: str) -> Arm:
    if not isinstance(raw, dict):
        raise EvalResultsError(f"{where}: expected an object")
    try:
        return Arm(tests=int(raw["tests"]), gpu_s=float(raw["gpu_s"]),
                   latency_s=float(raw["latency_s"]),
                   failing=tuple(str(t) for t in raw.get("failing", ())),
                   ttff_s=None if raw.get("ttff_s") is None else float(raw["ttff_s"]),
                   apfdc=None if raw.get("apfdc") is None else float(raw["apfdc"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise EvalResultsError(f"{where}: {exc.__class__.__name__}: {exc}") from exc


_TEST_FIELDS = {f.name for f in fields(TestOutcome)}
_RESULT_FIELDS = {f.name for f in fields(ChangeResult)}


def from_json(line: str, where: str = "<line>") -> ChangeResult:
    """Parse one line; :class:`EvalResultsError` when it is not a result of this schema."""
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise EvalResultsError(f"{where}: not JSON ({exc})") from exc
    except RecursionError as exc:
        raise EvalResultsError(f"{where}: JSON nested too deeply") from exc
    if not isinstance(raw, dict):
        raise EvalResultsError(f"{where}: expected a JSON object")
    if raw.get("schema") != SCHEMA_VERSION:
        raise EvalResultsError(f"{where}: schema {raw.get('schema')!r}, this FastCI reads "
                               f"{SCHEMA_VERSION}")
    unknown = set(raw) - _RESULT_FIELDS
    if unknown:
        raise EvalResultsError(f"{where}: unknown key(s) {sorted(unknown)}")
    try:
        tests = []
        for i, t in enumerate(raw.get("tests", ())):
            if not isinstance(t, dict) or set(t) - _TEST_FIELDS:
                raise EvalResultsError(f"{where}: tests[{i}] is not a test row")
            tests.append(TestOutcome(**t))
        strategies = raw.get("strategies", {})
        if not isinstance(strategies, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values())
                for v in strategies.values()):
            raise EvalResultsError(f"{where}: strategies: expected name -> {{measure: number}}")
        return ChangeResult(**{**raw, "run_all": _arm(raw["run_all"], f"{where}: run_all"),
                               "strategies": {str(k): {str(m): float(x) for m, x in v.items()}
                                              for k, v in strategies.items()},
                               "fastci": _arm(raw["fastci"], f"{where}: fastci"),
                               "tests": tuple(tests),
                               "missed": tuple(dict(m) for m in raw.get("missed", ()))})
    except (KeyError, TypeError) as exc:
        raise EvalResultsError(f"{where}: {exc.__class__.__name__}: {exc}") from exc


def read_results(path: Path) -> list[ChangeResult]:
    """Every line of a ``results.jsonl`` (blank lines skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalResultsError(f"{path}: cannot read ({exc})") from exc
    return [from_json(line, f"{path}:{n}") for n, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def merge(*runs: Iterable[ChangeResult]) -> list[ChangeResult]:
    """Results of several runs as one list: a change evaluated more than once under the
    same settings keeps its newest line (``recorded_at``); order: first appearance."""
    chosen: dict[tuple[str, str], ChangeResult] = {}
    for results in runs:
        for r in results:
            old = chosen.get(r.key)
            if old is None or r.recorded_at >= old.recorded_at:
                chosen[r.key] = r
    return list(chosen.values())


def write_results(path: Path, results: Sequence[ChangeResult]) -> None:
    """Write ``results`` as JSON lines (replacing ``path`` atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in results), encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True)
class Totals:
    """What a set of results adds up to (the headline numbers)."""

    changes: int
    all_gpu_s: float
    fastci_gpu_s: float
    all_latency_s: float
    fastci_latency_s: float
    changed_lines: int
    retained_lines: int
    detectable: int  # changes run-all saw fail
    detected: int  # of those, changes the plan saw fail
    missed_tests: int
    mean_apfdc: float | None
    mean_ttff_s: float | None  # over changes where the plan saw a failure
    mean_all_ttff_s: float | None
    #: strategy -> measure (``change``, ``tests``) -> (mean APFDc, changes it is over).
    strategy_apfdc: Mapping[str, Mapping[str, tuple[float, int]]] = field(default_factory=dict)

    @property
    def gpu_saved(self) -> float:
        return 1 - self.fastci_gpu_s / self.all_gpu_s if self.all_gpu_s else 0.0

    @property
    def latency_saved(self) -> float:
        return 1 - self.fastci_latency_s / self.all_latency_s if self.all_latency_s else 0.0

    @property
    def retention(self) -> float:
        return self.retained_lines / self.changed_lines if self.changed_lines else 1.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def totals(results: Sequence[ChangeResult]) -> Totals:
    """Sum ``results`` (only lines without a note: a change that could not be evaluated
    counts nowhere, and reports list it)."""
    ok = [r for r in results if not r.note]
    return Totals(
        changes=len(ok),
        all_gpu_s=sum(r.run_all.gpu_s for r in ok),
        fastci_gpu_s=sum(r.fastci.gpu_s for r in ok),
        all_latency_s=sum(r.run_all.latency_s for r in ok),
        fastci_latency_s=sum(r.fastci.latency_s for r in ok),
        changed_lines=sum(r.changed_lines for r in ok),
        retained_lines=sum(r.retained_lines for r in ok),
        detectable=sum(1 for r in ok if r.detected_by_all),
        detected=sum(1 for r in ok if r.detected_by_all and r.detected),
        missed_tests=sum(len(r.missed) for r in ok),
        mean_apfdc=_mean([r.fastci.apfdc for r in ok if r.fastci.apfdc is not None]),
        mean_ttff_s=_mean([r.fastci.ttff_s for r in ok if r.fastci.ttff_s is not None]),
        mean_all_ttff_s=_mean([r.run_all.ttff_s for r in ok if r.run_all.ttff_s is not None]),
        strategy_apfdc=_strategy_means(ok))


def _strategy_means(results: Sequence[ChangeResult]) -> dict[str, dict[str, tuple[float, int]]]:
    values: dict[str, dict[str, list[float]]] = {}
    for r in results:
        for name, measures in r.strategies.items():
            for measure, v in measures.items():
                values.setdefault(name, {}).setdefault(measure, []).append(v)
    return {name: {m: (sum(v) / len(v), len(v)) for m, v in sorted(ms.items())}
            for name, ms in sorted(values.items())}
