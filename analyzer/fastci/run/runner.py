"""``fastci run``: execute a plan through Bazel and record what happened.

Runs ``bazel test <config targets> --config=fastci --build_event_json_file=...``,
reads the build event file, records each test's outcome and duration in the
store's history (``record_result``), and ends with the line CI reads: ``N
passed, N failed``. A selective plan runs the config's targets (the universe,
e.g. ``//examples/...``) plus any planned label outside them: under
``--config=fastci`` the rules skip exactly the plan's ``skipped`` tests, and a
test the plan does not list (declared after it was made) runs at full workload.

A plan made for another tree than the one on disk (its ``tree``,
:func:`fastci.plan.model.for_tree`) is not obeyed: everything runs, with a warning.

A plan in mode ``shadow`` runs everything at full workload (safety invariant 7)
and ends with a *miss report*: the failures among the tests the plan would have
skipped, each with the reason the plan gave, also written as JSON to
``.fastci/runs/miss-report-*.json``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from fastci.integrations.bazel.bep import BuildReport, parse_bep
from fastci.integrations.bazel.runner import Bazel
from fastci.errors import BazelError
from fastci.config import Config
from fastci.integrations.git.repository import Git
from fastci.plan.model import Plan, for_tree
from fastci.integrations.git.tree import current_tree
from fastci.select.rules import RunLike
from fastci.types import TestId, as_label, is_label, normalize_test_id

LOG = logging.getLogger(__name__)

RUNS_DIR = Path(".fastci/runs")


class ResultHistory(Protocol):
    """The part of the evidence store ``fastci run`` uses: the newest runs, and new results.

    :class:`fastci.evidence.store.EvidenceStore` implements it (see its
    ``record_result`` for what the arguments mean).
    """

    def latest_runs(self) -> Mapping[TestId, RunLike]: ...
    def record_result(self, test: TestId, *, outcome: str, duration_s: float,
                      commit: str | None, gpus: int, workload: Mapping[str, Any],
                      source: str, overrides: Mapping[str, Any] | None = None) -> None: ...


if TYPE_CHECKING:
    from fastci.evidence.store import EvidenceStore

    def _store_conforms(store: EvidenceStore) -> ResultHistory:
        """Never called: mypy checks here that the real store fits the protocol."""
        return store


@dataclass(frozen=True)
class RunReport:
    """What ``fastci run`` did."""

    targets: tuple[str, ...]
    report: BuildReport | None
    not_run: tuple[str, ...] = ()  # planned tests Bazel reported nothing for
    not_bazel: tuple[str, ...] = ()  # planned ids that are not Bazel labels (pytest)
    recorded: int = 0
    misses: tuple[tuple[str, str], ...] = ()  # shadow mode: (test, why it would have been skipped)
    warning: str | None = None  # why the plan was not obeyed as written (stale, tied to no tree)
    mode: str = ""  # the mode that ran (``all`` for a stale plan)

    @property
    def passed(self) -> int:
        """Tests that passed."""
        return self.report.passed if self.report else 0

    @property
    def failed(self) -> int:
        """Tests that failed, plus planned tests that did not run at all."""
        return (self.report.failed if self.report else 0) + len(self.not_run)

    def summary_line(self) -> str:
        """``N passed, N failed``."""
        return f"{self.passed} passed, {self.failed} failed"


def planned_targets(plan: Plan, config: Config) -> tuple[list[str], list[str]]:
    """(Bazel target patterns to test, planned ids that are not Bazel labels).

    Always the config's ``targets``; for a selective plan also each planned label
    outside them (the rules decide, per test, to skip it or how to run it).
    """
    if plan.mode != "selective":
        return [config.targets], []
    labels = [t.id for t in plan.tests if is_label(t.id)]
    others = [t.id for t in plan.tests if not is_label(t.id)]
    outside = [label for label in labels if not _covered(normalize_test_id(label), config.targets)]
    return [config.targets, *dict.fromkeys(outside)], others


def _covered(label: str, pattern: str) -> bool:
    """Whether the target pattern ``pattern`` names ``label`` (False when unsure: listed twice is harmless)."""
    lab = as_label(label)
    if lab is None or lab.repo or not pattern.startswith("//"):
        return False
    package = lab.package
    if pattern == "//...":
        return True
    if pattern.endswith("/..."):
        root = pattern[2:-4]
        return package == root or package.startswith(root + "/")
    base, _, name = pattern.partition(":")
    if name in ("all", "*", "all-targets"):
        return package == base[2:]
    return normalize_test_id(pattern) == label


def miss_report(plan: Plan, report: BuildReport) -> tuple[tuple[str, str], ...]:
    """Failures among the tests ``plan`` would have skipped, with the plan's reason."""
    outcomes = report.outcomes
    return tuple((s.id, s.why) for s in plan.skipped
                 if normalize_test_id(s.id) in outcomes
                 and not outcomes[normalize_test_id(s.id)].passed)


def _echo_misses(plan: Plan, misses: tuple[tuple[str, str], ...], path: Path,
                 echo: Callable[[str], None]) -> None:
    path.write_text(json.dumps({"plan_reason": plan.reason, "would_skip": len(plan.skipped),
                                "misses": [{"id": t, "why": w} for t, w in misses]}, indent=2) + "\n")
    if not misses:
        echo(f"fastci shadow: no failure among the {len(plan.skipped)} test(s) the plan "
             f"would have skipped ({path})")
        return
    echo(f"fastci shadow: MISSES: {len(misses)} of the {len(plan.skipped)} test(s) the plan "
         f"would have skipped failed ({path}):")
    for test, why in misses:
        echo(f"  MISSED     {test} (the plan said: {why})")


def _workload(label: str, testlogs: Path | None, last: RunLike | None = None,
              planned: Mapping[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any] | None, int | None]:
    """(declared workload, overrides applied or None if not known, GPUs) of one Bazel run.

    Read from the run's ``fastci_workload.json`` (:mod:`fastci.run.launch`). Its
    ``declared``/``overrides`` keys say it outright; without them: a plain run
    (mode ``full``) ran its declared workload; under a plan, ``planned`` (the
    plan's overrides for the test, None without a plan) says whether Bazel applied
    any, and the values they replaced come from ``last`` (the test's newest stored
    run). What stays unclear is recorded as not known, which never counts as a
    full-workload run.
    """
    info: dict[str, Any] = {}
    if testlogs is not None:
        from fastci.integrations.bazel.testlogs import read_output

        try:
            raw = read_output(testlogs, label, "fastci_workload.json")
            info = json.loads(raw) if raw else {}
        except (OSError, ValueError) as exc:
            LOG.debug("%s: no workload file: %s", label, exc)
    info = info if isinstance(info, dict) else {}
    effective = dict(info.get("workload") or {})
    gpus = info["gpus"] if isinstance(info.get("gpus"), int) else None
    declared = info.get("declared")
    if isinstance(declared, dict):
        overrides = info.get("overrides")
        if not isinstance(overrides, dict):
            overrides = {k: v for k, v in effective.items() if declared.get(k) != v}
        return dict(declared), dict(overrides), gpus
    status = str(info.get("plan_status", ""))
    if info.get("mode") == "full" or (planned is not None and (
            not planned or status.startswith("fallback") or "overrides ignored" in status
            or "not in the plan" in status)):
        return effective, {}, gpus  # Bazel ran the declared workload as it is
    # The last run's declared workload, when that run knew what it overrode.
    known = last.workload if last is not None and last.overrides is not None else None
    if planned and known is not None and all(k in known for k in planned):
        declared = {**effective, **{k: known[k] for k in planned}}
        return declared, {k: effective.get(k, v) for k, v in planned.items()}, gpus
    if planned is None and known is not None and effective == dict(known):
        return effective, {}, gpus  # the workload its last run declared: full
    return effective, None, gpus


def execute(root: Path, plan: Plan, config: Config, *, store: ResultHistory | None = None,
            bazel: Bazel | None = None, flags: tuple[str, ...] = (),
            echo: Callable[[str], None] = print) -> RunReport:
    """Run ``plan`` under Bazel in the workspace ``root``; record results in ``store``.

    A plan made for another tree than the one in ``root`` is not obeyed: every
    test runs at full workload and the report carries the warning.
    """
    plan, warning = for_tree(plan, current_tree(root))
    if warning is not None:
        loud = "WARNING" if plan.mode == "all" else "warning"
        echo(f"fastci run: {loud}: {warning}")
    targets, others = planned_targets(plan, config)
    for other in others:
        echo(f"fastci run: {other} is not a Bazel target; run it with pytest --fastci-plan")
    planned = tuple(dict.fromkeys(normalize_test_id(t.id) for t in plan.tests
                                  if is_label(t.id))) if plan.mode == "selective" else ()
    if plan.mode == "selective" and not planned:
        # Still run Bazel: a test declared after the plan was made runs (full workload).
        echo("fastci run: the plan selects no tests: running only tests it does not list"
             + (f" ({plan.reason})" if plan.reason else ""))
    bazel = bazel or Bazel(root, config.bazel)
    bep = root / RUNS_DIR / f"bep-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}.json"
    bep.parent.mkdir(parents=True, exist_ok=True)
    echo(f"fastci run: bazel test {' '.join(targets)} --config={config.bazel_config}"
         + (f" (plan mode {plan.mode}: {plan.reason})" if plan.mode != "selective" else
            f" ({len(planned)} planned, {len(plan.skipped)} skipped by the plan)"))
    try:
        res = bazel.test(targets, flags=(f"--config={config.bazel_config}", *flags), bep_path=bep)
        no_tests = res.no_tests
    except BazelError as exc:
        if not _all_skipped(plan, bep, exc):
            raise
        # Bazel 4.2.3 fails (exit 1, "Unable to run tests") when every test it finds
        # is skipped: here that is the plan's decision, not an error.
        no_tests = True
    report = parse_bep(bep)
    seen = set(report.outcomes)
    not_run = tuple(t for t in planned if t not in seen)
    if no_tests and not_run:
        # Bazel found nothing to test: every planned test was filtered (e.g. by the
        # user's --test_tag_filters); say so instead of dropping them silently.
        echo(f"fastci run: bazel found no tests to run (exit 4): {len(not_run)} planned "
             "test(s) were filtered out by Bazel and did not run")
        not_run = ()
    # The plan Bazel ran (a stale one became "all"): it tells a reduced run from a full one.
    recorded = _record(root, report, store, bazel, plan) if store is not None else 0
    misses = miss_report(plan, report) if plan.mode == "shadow" else ()
    rr = RunReport(tuple(targets), report, not_run, tuple(others), recorded, misses,
                   warning, plan.mode)
    listed = {normalize_test_id(t.id) for t in plan.tests} | \
        {normalize_test_id(s.id) for s in plan.skipped}
    for label, outcome in sorted(report.outcomes.items()):
        cached = " (cached)" if outcome.cached else ""
        unplanned = " (not in the plan: full workload)" \
            if plan.mode == "selective" and label not in listed else ""
        echo(f"  {outcome.status:<10} {label} {outcome.duration_s:.1f}s{cached}{unplanned}")
    for label in not_run:
        echo(f"  NOT RUN    {label} (planned, but Bazel reported no result)")
    if plan.mode == "selective" and report.skipped:
        echo(f"fastci run: {len(report.skipped)} test(s) skipped as the plan says")
    if plan.mode == "shadow":
        _echo_misses(plan, misses, bep.with_name(bep.name.replace("bep-", "miss-report-")), echo)
    echo(rr.summary_line())
    return rr


def _all_skipped(plan: Plan, bep: Path, exc: BazelError) -> bool:
    """Whether a failed ``bazel test`` only found tests that ``plan`` skips (and ran none)."""
    if plan.mode != "selective" or "Unable to run tests" not in str(exc) or not bep.is_file():
        return False
    try:
        report = parse_bep(bep)
    except BazelError:
        return False
    listed = {normalize_test_id(s.id) for s in plan.skipped}
    return not report.outcomes and bool(report.skipped) and set(report.skipped) <= listed


def _record(root: Path, report: BuildReport, store: ResultHistory, bazel: Bazel,
            plan: Plan | None = None) -> int:
    """Add each test's result to the store's history, its declared workload and overrides apart.

    ``plan`` is the plan Bazel ran (it tells a reduced run from a full one while
    ``fastci_workload.json`` does not carry the declared workload).
    """
    try:
        testlogs: Path | None = Path(bazel.info("bazel-testlogs"))
    except Exception as exc:  # noqa: BLE001 - workloads are optional detail
        LOG.debug("no bazel-testlogs: %s", exc)
        testlogs = None
    commit = Git(root).head()
    runs = store.latest_runs()

    overrides_by_test: dict[str, dict[str, Any]] = {}
    if plan is not None and plan.mode == "selective":
        # Bazel matches the plan's labels normalized (@//p:t, //p -> //p:t): so do we.
        overrides_by_test = {normalize_test_id(t.id): dict(t.overrides) for t in plan.tests}
    n = 0
    for label, outcome in sorted(report.outcomes.items()):
        if outcome.cached:
            continue  # a cached result is the earlier run, already in the history
        last = runs.get(label)
        planned = None if plan is None else overrides_by_test.get(label, {})
        declared, overrides, gpus = _workload(label, testlogs, last, planned)
        store.record_result(label, outcome="passed" if outcome.passed else "failed",
                            duration_s=outcome.duration_s, commit=commit,
                            gpus=gpus if gpus is not None else (last.gpus if last else 0),
                            workload=declared, overrides=overrides, source="bazel")
        n += 1
    return n
