"""Read a Build Event Protocol JSON file (``--build_event_json_file``).

Bazel 4.2.3 writes one JSON object per line. ``testResult`` events (one per
run/shard/attempt) carry ``status``, ``testAttemptDurationMillis``,
``cachedLocally`` and, for a result served by a remote cache,
``executionInfo.cachedRemotely`` (both count as cached); ``testSummary`` events carry ``overallStatus``; ``finished``
carries the exit code. A test the plan skips (incompatible under
``--config=fastci``) has a ``targetCompleted`` event aborted with reason
``SKIPPED`` and no test events; one filtered out by tags has no events at all.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from fastci.errors import BazelError
from fastci.types import normalize_test_id

LOG = logging.getLogger(__name__)

PASSED_STATUSES = frozenset({"PASSED", "FLAKY"})


@dataclass(frozen=True)
class TestAttempt:
    """One ``testResult`` event: a single run of a test (or of one shard)."""

    label: str
    status: str
    duration_s: float
    cached: bool
    attempt: int
    run: int
    shard: int
    end_s: float | None = None  # when it ended (epoch seconds; None: not reported)


@dataclass(frozen=True)
class TestOutcome:
    """A test's overall result, folded from its attempts and summary."""

    label: str
    status: str
    duration_s: float
    cached: bool
    attempts: int

    @property
    def passed(self) -> bool:
        """True for PASSED and FLAKY."""
        return self.status in PASSED_STATUSES


@dataclass(frozen=True)
class BuildReport:
    """What a ``bazel test`` reported: outcomes by label and the exit code name."""

    outcomes: dict[str, TestOutcome]
    attempts: tuple[TestAttempt, ...]
    exit_code: int | None
    exit_name: str
    skipped: tuple[str, ...] = ()
    #: Tests Bazel aborted (``--notest_keep_going`` after a failure: NO STATUS, no result).
    aborted: tuple[str, ...] = ()
    started_s: float | None = None  # when the command started (epoch seconds)

    def first_failure(self, start: float | None = None) -> tuple[str, float] | None:
        """(the first test to fail in this run, seconds from ``start`` until it ended), or
        None. ``start``: epoch seconds, default when the command started. A cached
        result did not fail in this run and is not counted."""
        start = start if start is not None else self.started_s
        if start is None:
            return None
        ended = [(a.end_s - start, a.label) for a in self.attempts
                 if a.status not in PASSED_STATUSES and not a.cached and a.end_s is not None]
        if not ended:
            return None
        seconds, label = min(ended)
        return label, max(seconds, 0.0)

    @property
    def passed(self) -> int:
        """Number of tests that passed (or were flaky)."""
        return sum(1 for o in self.outcomes.values() if o.passed)

    @property
    def failed(self) -> int:
        """Number of tests that did not pass (failed, timed out, not built...)."""
        return len(self.outcomes) - self.passed

    def summary_line(self) -> str:
        """``N passed, N failed`` — the line CI reads."""
        return f"{self.passed} passed, {self.failed} failed"


def _cached(result: dict[str, Any]) -> bool:
    """Whether a ``testResult`` was served from a cache (local, or remote: issue 16)."""
    info = result.get("executionInfo")
    remote = isinstance(info, dict) and bool(info.get("cachedRemotely", False))
    return bool(result.get("cachedLocally", False)) or remote


def _end(result: dict[str, Any]) -> float | None:
    """When a ``testResult`` attempt ended (epoch seconds), from its start and duration."""
    try:
        return (int(result["testAttemptStartMillisEpoch"])
                + int(result.get("testAttemptDurationMillis", 0))) / 1000.0
    except (KeyError, TypeError, ValueError):
        return None


def _ms(value: object) -> float:
    try:
        return int(str(value)) / 1000.0
    except ValueError:
        return 0.0


def parse_bep_lines(lines: list[str], *, source: str = "BEP") -> BuildReport:
    """Fold build events into a :class:`BuildReport` (pure)."""
    fold = _Fold()
    for event in _events(lines, source):
        fold.add(event)
    return BuildReport(_outcomes(fold.attempts, fold.summaries), tuple(fold.attempts),
                       fold.exit_code, fold.exit_name, tuple(sorted(fold.skipped)),
                       tuple(dict.fromkeys(fold.aborted)), fold.started_s)


def _events(lines: list[str], source: str) -> Iterator[dict[str, Any]]:
    """The JSON build events of ``lines`` (a truncated last line is left out).

    Raises:
        BazelError: a line before the last is not JSON.
    """
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            # A killed bazel leaves a truncated last line; anything else is corrupt.
            if number == len(lines):
                LOG.warning("%s: ignoring truncated last event", source)
                continue
            raise BazelError(f"{source}:{number}: not a JSON build event") from None
        yield event


class _Fold:
    """What :func:`parse_bep_lines` keeps of the events, one event at a time."""

    def __init__(self) -> None:
        self.attempts: list[TestAttempt] = []
        self.summaries: dict[str, tuple[str, float]] = {}
        self.exit_code: int | None = None
        self.exit_name = ""
        self.skipped: list[str] = []
        self.aborted: list[str] = []
        self.started_s: float | None = None

    def add(self, event: dict[str, Any]) -> None:
        ev_id = event.get("id", {})
        if "testResult" in ev_id and "testResult" in event:
            self.attempts.append(_attempt(ev_id["testResult"], event["testResult"]))
        elif "testSummary" in ev_id and "testSummary" in event:
            payload = event["testSummary"]
            self.summaries[normalize_test_id(ev_id["testSummary"]["label"])] = (
                payload.get("overallStatus", "NO_STATUS"),
                _ms(payload.get("totalRunDurationMillis", 0)),
            )
        elif "aborted" in event and any(isinstance(ev_id.get(k), dict) and "label" in ev_id[k]
                                        for k in ("testResult", "testSummary")):
            kind = "testResult" if isinstance(ev_id.get("testResult"), dict) else "testSummary"
            self.aborted.append(normalize_test_id(ev_id[kind]["label"]))
        elif "started" in ev_id and isinstance(event.get("started"), dict):
            self.started_s = _ms(event["started"].get("startTimeMillis")) or None
        elif "targetCompleted" in ev_id and event.get("aborted", {}).get("reason") == "SKIPPED":
            self.skipped.append(normalize_test_id(ev_id["targetCompleted"]["label"]))
        elif "buildFinished" in ev_id and "finished" in event:
            code = event["finished"].get("exitCode", {})
            self.exit_code = int(code.get("code", 0))
            self.exit_name = str(code.get("name", ""))


def _attempt(ident: dict[str, Any], payload: dict[str, Any]) -> TestAttempt:
    """One ``testResult`` event as a :class:`TestAttempt`."""
    return TestAttempt(
        label=normalize_test_id(ident["label"]),
        status=payload.get("status", "NO_STATUS"),
        duration_s=_ms(payload.get("testAttemptDurationMillis", 0)),
        cached=_cached(payload),
        attempt=int(ident.get("attempt", 1)),
        run=int(ident.get("run", 1)),
        shard=int(ident.get("shard", 1)),
        end_s=_end(payload),
    )


def _outcomes(attempts: list[TestAttempt], summaries: Mapping[str, tuple[str, float]]
              ) -> dict[str, TestOutcome]:
    """Each test's outcome: its summary's status and duration when Bazel sent one, else
    its last attempt's status and the sum of its attempts."""
    outcomes: dict[str, TestOutcome] = {}
    labels = sorted({a.label for a in attempts} | set(summaries))
    for label in labels:
        mine = [a for a in attempts if a.label == label]
        status, total = summaries.get(label, (mine[-1].status if mine else "NO_STATUS", 0.0))
        outcomes[label] = TestOutcome(
            label=label,
            status=status,
            duration_s=total or sum(a.duration_s for a in mine),
            cached=bool(mine) and all(a.cached for a in mine),
            attempts=max((a.attempt for a in mine), default=0),
        )
    return outcomes


def parse_bep(path: Path | str) -> BuildReport:
    """Read a build-event JSON file.

    Raises:
        BazelError: the file is missing or a line in its middle is not JSON.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BazelError(f"{path}: cannot read build events: {exc}") from exc
    return parse_bep_lines(text.splitlines(), source=str(path))
