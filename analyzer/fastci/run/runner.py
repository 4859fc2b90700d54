"""``fastci run``: execute a plan through Bazel and pytest, and record what happened.

Runs ``bazel test <config targets> --config=fastci --build_event_json_file=...``,
reads the build event file, records each test's outcome and duration in the
store's history (``record_result``), and ends with the line CI reads: ``N
passed, N failed``. A selective plan runs the config's targets (the universe,
e.g. ``//examples/...``) plus any planned label outside them: under
``--config=fastci`` the rules skip exactly the plan's ``skipped`` tests, and a
test the plan does not list (declared after it was made) runs at full workload.

Pytest node ids run through pytest, the plugin obeying the plan
(``python -m pytest -p fastci.pytest_plugin --fastci-plan PLAN --fastci-results
FILE``, :func:`run_pytest`); their results are recorded like Bazel's (source
``pytest``) and counted in the same summary line. In a repository without a
Bazel workspace (no ``WORKSPACE``/``WORKSPACE.bazel``/``MODULE.bazel``) pytest
is the only runner: it runs the whole suite (what ``pytest`` collects there)
under the plan, which deselects the plan's skipped tests (by node id or by the
label of the gpu_test whose main file holds them); a test the plan does not
list runs. In a Bazel workspace pytest runs the plan's planned node ids, except
those in the main file of a gpu_test the plan names (Bazel runs that one). A
pytest run that ends in an error (usage, internal, interrupted, nothing
collected) counts as one failure; a planned test neither runner reported is a
failure too (``NOT RUN``).

A plan made for another tree than the one on disk (its ``tree``,
:func:`fastci.plan.model.for_tree`) is not obeyed: everything runs, with a warning.

A selective plan runs in priority order on the host's GPUs
(:mod:`fastci.run.schedule`: the launchers wait their turn; Bazel is told to
start every scheduled test at once). With ``fail_fast`` Bazel stops at the
first failing test (``--notest_keep_going``: it kills the tests still running
and starts no more) and pytest runs with ``-x``; the tests that did not run
are counted as ``N not run`` after ``N passed, N failed``, never as passed, and
nothing is recorded for them. When a test failed the summary says how long
after the start of the run the first failure came (see docs/RUNNING.md).

A pruned test (a ``skipped`` entry with ``stand_ins``) is skipped only while the
plan's tests pass: when any test of the run fails (and the run was not
``fail_fast``), ``fastci run`` then runs every pruned test at full workload
(:func:`_run_pruned`; Bazel labels under a one-off ``@fastci_plan`` that selects
them, node ids through pytest), so a failing change reports every failure the
unpruned plan would have. Their results count in the summary line and are recorded.

With ``full_sample`` (``fastci run --full-sample``, a post-merge job) a seeded sample of
the plan's reduced tests that passed runs again at full workload the same way, and is
recorded at the same commit: a failure there is an escape, which raises the test's
learned floors (:mod:`fastci.run.sample`, :func:`_run_full_sample`).

A plan in mode ``shadow`` runs everything at full workload (safety invariant 7)
and ends with a *miss report*: the failures among the tests the plan would have
skipped, each with the reason the plan gave, also written as JSON to
``.fastci/runs/miss-report-*.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

from fastci.integrations import procs
from fastci.integrations.bazel.bep import BuildReport, parse_bep
from fastci.integrations.bazel.bep_follow import follow_bep_progress
from fastci.integrations.bazel.mains import conventional_main, labels_by_main, node_path
from fastci.integrations.bazel.runner import Bazel
from fastci.errors import BazelError
from fastci.config import Config
from fastci.integrations.git.repository import Git, repo_root
from fastci.plan.model import Plan, dump_plan, for_runner
from fastci.run import gpus as gpu_pool
from fastci.run import schedule
from fastci.integrations.git.tree import current_tree
from fastci.select.test_rules import RunLike
from fastci.types import TestId, as_label, is_label, normalize_test_id, shown

LOG = logging.getLogger(__name__)

RUNS_DIR = Path(".fastci/runs")


class ResultHistory(Protocol):
    """The part of the evidence store ``fastci run`` uses: the newest runs, and new results.

    :class:`fastci.evidence.store.db.EvidenceStore` implements it (see its
    ``record_result`` for what the arguments mean).
    """

    def latest_runs(self) -> Mapping[TestId, RunLike]: ...
    def record_result(self, test: TestId, *, outcome: str, duration_s: float,
                      commit: str | None, gpus: int, workload: Mapping[str, Any],
                      source: str, overrides: Mapping[str, Any] | None = None) -> None: ...


if TYPE_CHECKING:
    from fastci.evidence.store.db import EvidenceStore
    from fastci.progress import Progress

    def _store_conforms(store: EvidenceStore) -> ResultHistory:
        """Never called: mypy checks here that the real store fits the protocol."""
        return store


#: Files that make a directory a Bazel workspace root.
WORKSPACE_FILES = ("WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel")


def is_bazel_workspace(root: Path) -> bool:
    """Whether ``root`` is a Bazel workspace (else pytest is the only runner)."""
    return any((root / name).is_file() for name in WORKSPACE_FILES)


@dataclass(frozen=True)
class PytestResult:
    """One test's result from a pytest run (a line of ``--fastci-results``)."""

    id: TestId
    outcome: str  # passed | failed | error | skipped
    duration_s: float
    workload: Mapping[str, Any]
    overrides: Mapping[str, Any] | None  # None: not known
    gpus: int = 0

    @property
    def passed(self) -> bool:
        """Whether the test passed."""
        return self.outcome == "passed"

    @property
    def failed(self) -> bool:
        """Whether the test failed or errored (a skip is neither)."""
        return self.outcome in ("failed", "error")


@dataclass(frozen=True)
class PytestRun:
    """What the pytest half of ``fastci run`` did."""

    command: tuple[str, ...]
    returncode: int
    results: tuple[PytestResult, ...] = ()
    error: str | None = None  # why the run itself failed (counted as one failure)
    started: float = 0.0  # when pytest started (epoch seconds)


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
    pytest: PytestRun | None = None  # the pytest half, when it ran
    stopped: tuple[str, ...] = ()  # fail-fast: tests that did not run after the first failure
    first_failure: tuple[str, float] | None = None  # (test, seconds after the run started)
    #: The pruned tests, run because a test of this run failed (None: not run).
    pruned_run: RunReport | None = None
    #: ``--full-sample``: the sampled reduced tests, run again at full workload (None: not run).
    sample_run: RunReport | None = None

    @property
    def passed(self) -> int:
        """Tests that passed (both runners, and the pruned tests run after a failure)."""
        py = sum(r.passed for r in self.pytest.results) if self.pytest else 0
        more = sum(r.passed for r in (self.pruned_run, self.sample_run) if r is not None)
        return (self.report.passed if self.report else 0) + py + more

    @property
    def failed(self) -> int:
        """Tests that failed (both runners), planned tests that did not run, a failed pytest run."""
        py = 0
        if self.pytest is not None:
            py = sum(r.failed for r in self.pytest.results) + (1 if self.pytest.error else 0)
        more = sum(r.failed for r in (self.pruned_run, self.sample_run) if r is not None)
        return (self.report.failed if self.report else 0) + len(self.not_run) + py + more

    @property
    def flaky(self) -> tuple[str, ...]:
        """Tests that failed an attempt and then passed (Bazel's ``FLAKY``). They count as
        passed, but for the plan's prunes they failed: a stand-in that fails once no
        longer vouches for the tests it stands in for."""
        if self.report is None:
            return ()
        return tuple(sorted(t for t, o in self.report.outcomes.items() if o.status == "FLAKY"))

    def summary_line(self) -> str:
        """``N passed, N failed`` (fail-fast: ``, N not run`` after it when some did not run)."""
        stopped = f", {len(self.stopped)} not run" if self.stopped else ""
        return f"{self.passed} passed, {self.failed} failed{stopped}"


def _stamp() -> str:
    """A name part for the files of one run under :data:`RUNS_DIR` (time, then ns)."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}"


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
        echo(f"  MISSED     {shown(test)} (the plan said: {why})")


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
            echo: Callable[[str], None] = print, python: str | None = None,
            pytest_args: tuple[str, ...] = (), fail_fast: bool = False,
            progress: Progress | None = None, full_sample: float | None = None,
            source: Path | None = None) -> RunReport:
    """Run ``plan`` under Bazel and pytest in ``root``; record results in ``store``.

    One plan for every runner: the plan this run decides to obey (``plan`` itself, or
    "everything" when it may not be obeyed) is written to one file under
    ``.fastci/runs/`` (:func:`plan_file`) and handed to Bazel (the rules read it,
    ``--repo_env=FASTCI_PLAN_FILE``) and to pytest (``--fastci-plan``), whatever
    ``.fastci/plan.json`` holds. ``source``: the file ``plan`` was read from; a file
    git tracks (a committed plan) is not obeyed (:func:`fastci.plan.model.for_runner`).

    ``full_sample``: after the plan, run a deterministic sample (this rate, seeded by the
    commit) of its reduced tests that passed again at full workload, and record them, so
    an escape shows in the history (:mod:`fastci.run.sample`; ``fastci run
    --full-sample``, meant for a post-merge job). None or 0: no sample.

    ``fail_fast``: stop at the first failing test (Bazel ``--notest_keep_going``,
    pytest ``-x``); the tests that did not run are reported as not run, and so are
    the plan's pruned tests (a failure voids their prunes, but the run stopped).
    Without it, a failure runs the pruned tests (:func:`_run_pruned`).

    ``progress``: advanced as Bazel finishes each test (the build event file followed
    while Bazel writes it; its total is the test targets Bazel configured), and closed
    when ``bazel test`` returns, before anything more is echoed (pytest shows its own).
    Pass ``echo=progress.echo`` with it, so lines echoed meanwhile do not tear a bar.

    A plan made for another tree than the one in ``root`` is not obeyed: every
    test runs at full workload and the report carries the warning. Without a
    Bazel workspace in ``root`` only pytest runs (``python``: its interpreter,
    default the config's ``runner_python``; ``pytest_args``: more pytest arguments).
    """
    t0 = time.time()  # time to first failure counts from here
    bazel = bazel or (Bazel(root, config.bazel) if is_bazel_workspace(root) else None)
    tree = current_tree(root)
    rr = _execute(root, plan, config, tree, t0, store=store, bazel=bazel, flags=flags, echo=echo,
                  python=python, pytest_args=pytest_args, fail_fast=fail_fast, progress=progress,
                  source=source)
    pruned = [s for s in plan.skipped if s.stand_ins] if rr.mode == "selective" else []
    if pruned and (rr.failed or rr.flaky):
        if fail_fast:
            rr = dataclasses.replace(rr, stopped=(*rr.stopped, *(s.id for s in pruned)))
            for s in pruned:
                echo(f"  NOT RUN    {shown(s.id)} (pruned; a test failed, but --fail-fast stopped the run)")
        else:
            rr = dataclasses.replace(rr, pruned_run=_run_pruned(
                root, [s.id for s in pruned], _failures(rr), config, tree, store=store, bazel=bazel,
                flags=flags, echo=echo, python=python, pytest_args=pytest_args))
    if full_sample and rr.mode == "selective" and not fail_fast:
        run = _run_full_sample(root, plan, rr, full_sample, config, tree, store=store,
                               bazel=bazel, flags=flags, echo=echo, python=python,
                               pytest_args=pytest_args)
        rr = dataclasses.replace(rr, sample_run=run)
    echo(rr.summary_line())
    return rr


def _reduced_passed(rr: RunReport, test: TestId) -> bool:
    """Whether ``test`` passed in the plan's run ``rr`` (Bazel or pytest)."""
    if rr.report is not None and normalize_test_id(test) in rr.report.outcomes:
        return rr.report.outcomes[normalize_test_id(test)].passed
    results = [r for r in (rr.pytest.results if rr.pytest else ()) if _matches(test, r.id)]
    return bool(results) and all(r.passed for r in results)


def _run_full_sample(root: Path, plan: Plan, rr: RunReport, rate: float, config: Config,
                     tree: str | None, *, store: ResultHistory | None, bazel: Bazel | None,
                     flags: tuple[str, ...], echo: Callable[[str], None], python: str | None,
                     pytest_args: tuple[str, ...]) -> RunReport | None:
    """Run the sampled reduced tests of ``plan`` that passed in ``rr`` at full workload
    (:mod:`fastci.run.sample`); one line per sampled test says why, and what it showed."""
    from fastci.run.sample import drawn_why, sample, verdict

    seed = Git(root).head() or tree or ""
    if not seed:
        echo("fastci run: full-workload sample: no commit or tree to seed it: not drawn")
        return None
    drawn = sample(plan.tests, rate, seed)
    reduced = sum(1 for t in plan.tests if t.overrides)
    echo(f"fastci run: full-workload sample (rate {rate:g}, seed {seed[:12]}): {len(drawn)} of "
         f"the plan's {reduced} reduced test(s) drawn")
    todo = []
    for s in drawn:
        if _reduced_passed(rr, s.test):
            echo(f"  SAMPLED    {s.test} ({drawn_why(s, rate, seed)}): running at full workload")
            todo.append(s)
        else:
            echo(f"  SAMPLED    {s.test} (drawn {s.draw:.3f} < {rate:g}): not run at full "
                 "workload: its reduced run did not pass (no escape to find)")
    if not todo:
        return None
    if store is None:
        echo("fastci run: full-workload sample: results are not recorded (no store), so an "
             "escape found here raises no learned floor")
    run = _run_pruned(root, [s.test for s in todo], "", config, tree, store=store, bazel=bazel,
                      flags=flags, echo=echo, python=python, pytest_args=pytest_args,
                      header=f"fastci run: running {len(todo)} sampled reduced test(s) at full "
                             "workload, recorded at this commit",
                      tag="full-workload sample")
    for s in todo:
        echo(f"  {s.test}: {verdict(s, _full_outcome(run, s.test))}")
    return run


def _full_outcome(run: RunReport, test: TestId) -> bool | None:
    """Whether ``test`` passed in ``run`` (None: no result)."""
    if run.report is not None and normalize_test_id(test) in run.report.outcomes:
        return run.report.outcomes[normalize_test_id(test)].passed
    results = [r for r in (run.pytest.results if run.pytest else ()) if _matches(test, r.id)]
    return all(r.passed for r in results) if results else None


def _execute(root: Path, plan: Plan, config: Config, tree: str | None, t0: float, *,
             store: ResultHistory | None, bazel: Bazel | None, flags: tuple[str, ...],
             echo: Callable[[str], None], python: str | None, pytest_args: tuple[str, ...],
             fail_fast: bool, progress: Progress | None, source: Path | None = None) -> RunReport:
    """:func:`execute` up to its summary line, without running the pruned tests
    (``tree``: the current tree id, :func:`current_tree`; ``t0``: when the run began)."""
    plan, warning = for_runner(plan, tree, source, repo_root(root))
    if warning is not None:
        loud = "WARNING" if plan.mode == "all" else "warning"
        echo(f"fastci run: {loud}: {warning}")
    if fail_fast:
        pytest_args = ("-x", *pytest_args)
    if not is_bazel_workspace(root):
        if progress is not None:
            progress.close()  # nothing counted: says nothing
        return _execute_pytest_only(root, plan, config, tree, store=store, echo=echo,
                                    python=python, pytest_args=pytest_args, warning=warning,
                                    fail_fast=fail_fast, t0=t0)
    targets, others = planned_targets(plan, config)
    planned = tuple(dict.fromkeys(normalize_test_id(t.id) for t in plan.tests
                                  if is_label(t.id))) if plan.mode == "selective" else ()
    if plan.mode == "selective" and not planned and not others:
        # Still run Bazel: a test declared after the plan was made runs (full workload).
        echo("fastci run: the plan selects no tests: running only tests it does not list"
             + (f" ({plan.reason})" if plan.reason else ""))
    bazel = bazel or Bazel(root, config.bazel)
    bep = root / RUNS_DIR / f"bep-{_stamp()}.json"
    report, no_tests = _bazel_test(root, plan, config, tree, bazel, targets, planned, bep,
                                   flags=flags, fail_fast=fail_fast, echo=echo, progress=progress)
    first = report.first_failure(t0)
    not_run, stopped = _unfinished(report, planned, fail_fast=fail_fast, no_tests=no_tests,
                                   echo=echo)
    # The plan Bazel ran (a stale one became "all"): it tells a reduced run from a full one.
    recorded = _record(root, report, store, bazel, plan) if store is not None else 0
    misses = miss_report(plan, report) if plan.mode == "shadow" else ()
    py_run = None
    if others and fail_fast and report.failed:
        stopped = (*stopped, *others)  # stopped before the pytest half
    elif others:
        py_run = _pytest_in_workspace(root, plan, config, tree, others, store=store, echo=echo,
                                      python=python, pytest_args=pytest_args)
        recorded += _record_pytest(root, py_run, store) if store is not None else 0
    if first is None and py_run is not None:
        first = _pytest_first_failure(py_run, t0)
    rr = RunReport(tuple(targets), report, not_run, tuple(others), recorded, misses,
                   warning, plan.mode, py_run, stopped, first)
    _echo_bazel_run(plan, report, not_run, stopped, echo)
    if py_run is not None:
        _echo_pytest(py_run, (), echo)
    if plan.mode == "shadow":
        _echo_misses(plan, misses, bep.with_name(bep.name.replace("bep-", "miss-report-")), echo)
    _echo_first_failure(first, echo)
    return rr


def _bazel_test(root: Path, plan: Plan, config: Config, tree: str | None, bazel: Bazel,
                targets: Sequence[str], planned: tuple[str, ...], bep: Path, *,
                flags: tuple[str, ...], fail_fast: bool, echo: Callable[[str], None],
                progress: Progress | None) -> tuple[BuildReport, bool]:
    """``bazel test`` of ``targets`` under the plan this run decided (published for the
    GPU schedule), the build event file followed for ``progress``: its report, and
    whether Bazel found no test to run."""
    bep.parent.mkdir(parents=True, exist_ok=True)
    echo(f"fastci run: bazel test {' '.join(targets)} --config={config.bazel_config}"
         + (f" (plan mode {plan.mode}: {plan.reason})" if plan.mode != "selective" else
            f" ({len(planned)} planned, {len(plan.skipped)} skipped by the plan)"))
    if fail_fast:
        flags = ("--notest_keep_going", *flags)
    # The rules obey the plan this run decided, not whatever .fastci/plan.json holds.
    decided = plan_file(root, plan, tree)
    try:
        with schedule.publish(root, plan, fail_fast=fail_fast) as published:
            if published is not None and len(published.tests) > 1:
                flags = (*_concurrency(len(published.tests), flags, echo), *flags)
            with _following(bep, progress):
                # The plan's pruned tests stay skipped: this run runs them after a
                # failure (execute); without this the rules run them (plan_model.bzl).
                res = bazel.test(targets, flags=(f"--config={config.bazel_config}",
                                                 "--repo_env=FASTCI_PRUNES=rerun", *flags),
                                 bep_path=bep, plan=decided)
        no_tests = res.no_tests
    except BazelError as exc:
        if not _all_skipped(plan, bep, exc):
            raise
        # Bazel 4.2.3 fails (exit 1, "Unable to run tests") when every test it finds
        # is skipped: here that is the plan's decision, not an error.
        no_tests = True
    return parse_bep(bep), no_tests


def _unfinished(report: BuildReport, planned: tuple[str, ...], *, fail_fast: bool,
                no_tests: bool, echo: Callable[[str], None]
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The planned tests Bazel reported no result for, and those a ``--fail-fast`` stop
    left unfinished (not failures)."""
    seen = set(report.outcomes)
    not_run = tuple(t for t in planned if t not in seen)
    stopped: tuple[str, ...] = ()
    if fail_fast and report.failed:
        # Bazel stopped at a failure: what it did not finish did not run (not a failure).
        stopped = tuple(dict.fromkeys([*not_run, *(t for t in report.aborted if t not in seen)]))
        not_run = ()
    if no_tests and not_run:
        # Bazel found nothing to test: every planned test was filtered (e.g. by the
        # user's --test_tag_filters); say so instead of dropping them silently.
        echo(f"fastci run: bazel found no tests to run (exit 4): {len(not_run)} planned "
             "test(s) were filtered out by Bazel and did not run")
        not_run = ()
    return not_run, stopped


def _echo_bazel_run(plan: Plan, report: BuildReport, not_run: tuple[str, ...],
                    stopped: tuple[str, ...], echo: Callable[[str], None]) -> None:
    """One line per test Bazel ran, did not run, or left when the run stopped."""
    listed = {normalize_test_id(t.id) for t in plan.tests} | \
        {normalize_test_id(s.id) for s in plan.skipped}
    for label, outcome in sorted(report.outcomes.items()):
        cached = " (cached)" if outcome.cached else ""
        unplanned = " (not in the plan: full workload)" \
            if plan.mode == "selective" and label not in listed else ""
        echo(f"  {outcome.status:<10} {shown(label)} {outcome.duration_s:.1f}s{cached}{unplanned}")
    for label in not_run:
        echo(f"  NOT RUN    {shown(label)} (planned, but Bazel reported no result)")
    for label in stopped:
        echo(f"  NOT RUN    {shown(label)} (--fail-fast stopped the run)")
    if plan.mode == "selective" and report.skipped:
        echo(f"fastci run: {len(report.skipped)} test(s) skipped as the plan says")


def _failures(rr: RunReport) -> str:
    """What voided the prunes: ``2 test(s) failed``, ``1 test(s) were flaky`` or both."""
    parts = [f"{rr.failed} test(s) failed"] if rr.failed else []
    if rr.flaky:
        parts.append(f"{len(rr.flaky)} test(s) were flaky (failed, then passed: "
                     f"{', '.join(rr.flaky[:3])}{' ...' if len(rr.flaky) > 3 else ''})")
    return " and ".join(parts)


def _run_pruned(root: Path, pruned: list[TestId], failed: str, config: Config,
                tree: str | None, *,
                store: ResultHistory | None, bazel: Bazel | None, flags: tuple[str, ...],
                echo: Callable[[str], None], python: str | None,
                pytest_args: tuple[str, ...], header: str | None = None,
                tag: str = "pruned; run after a failure") -> RunReport:
    """Run the plan's pruned tests at full workload, after ``failed`` (what failed, or
    was flaky: :func:`_failures`). ``header`` and ``tag`` (the line before, and the note
    on each result) serve another use: the full-workload sample.

    A prune says the stand-ins' checks would catch what the pruned test catches; once a
    test fails that no longer holds for this change (a stand-in may have failed for
    another reason, or pass while the pruned test would fail), and a developer needs
    every failure to fix the change. Bazel labels run under a one-off ``@fastci_plan``
    that selects exactly them (no overrides: full workload); other ids through pytest.
    """
    from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
    from fastci.plan.model import PlannedTest

    echo(header or f"fastci run: {failed}: the plan's prunes do not hold for this "
         f"change; running the {len(pruned)} pruned test(s) at full workload")
    labels = [t for t in pruned if is_label(t)] if bazel is not None else []
    others = [t for t in pruned if t not in labels]
    esc = Plan(mode="selective", reason=tag,
               tests=tuple(PlannedTest(t, why=tag) for t in pruned))
    report: BuildReport | None = None
    not_run: tuple[str, ...] = ()
    recorded = 0
    if labels:
        assert bazel is not None
        bep = root / RUNS_DIR / f"bep-pruned-{_stamp()}.json"
        with tempfile.TemporaryDirectory(prefix="fastci-pruned-") as tmp:
            repo = write_plan_repo(Path(tmp) / "plan", {t: {} for t in labels}, status=tag)
            try:
                bazel.test(labels, flags=(f"--config={config.bazel_config}", override_flag(repo),
                                          *flags), bep_path=bep)
            except BazelError as exc:  # a test that cannot build counts as not run below
                echo(f"fastci run: bazel test of the pruned tests: {exc}")
        report = parse_bep(bep) if bep.is_file() else None
        seen = set(report.outcomes) if report is not None else set()
        not_run = tuple(normalize_test_id(t) for t in labels if normalize_test_id(t) not in seen)
        if report is not None and store is not None:
            recorded += _record(root, report, store, bazel, esc)
        for label, outcome in sorted((report.outcomes if report else {}).items()):
            echo(f"  {outcome.status:<10} {shown(label)} {outcome.duration_s:.1f}s ({tag})")
        for label in not_run:
            echo(f"  NOT RUN    {shown(label)} ({tag}; Bazel reported no result)")
    py_run = None
    if others:
        py_run = run_pytest(root, esc, config, tree, args=(*pytest_args, *others),
                            echo=echo, python=python)
        recorded += _record_pytest(root, py_run, store) if store is not None else 0
        missing = _not_reported(others, py_run.results) if py_run.error is None else ()
        _echo_pytest(py_run, missing, echo)
        not_run = (*not_run, *missing)
    return RunReport(tuple(labels), report, not_run, tuple(others), recorded, mode="selective",
                     pytest=py_run)


@contextlib.contextmanager
def _following(bep: Path, progress: Progress | None) -> Iterator[None]:
    """While Bazel writes ``bep``: each finished test advances ``progress``; closed after."""
    if progress is None:
        yield
        return
    with progress, follow_bep_progress(bep, progress):
        yield


#: The most tests ``fastci run`` lets Bazel start at once for the launchers to order
#: (each waits as a Python process): at least this many, or 8 per GPU.
MAX_STARTED = 64


def _concurrency(scheduled: int, flags: tuple[str, ...],
                 echo: Callable[[str], None]) -> tuple[str, ...]:
    """Flags that let Bazel start the scheduled tests at once, so the launchers order them.

    Only on a host with GPUs (without, the pool does not hold tests back and
    starting everything at once would only crowd the CPUs), and never over the
    user's own ``--jobs``/``--local_test_jobs``. Neither flag is in a cache key
    nor discards Bazel's analysis cache (measured, docs/RUNNING.md).
    """
    if any(f.startswith(("--jobs", "--local_test_jobs", "-j")) for f in flags):
        return ()
    devices = gpu_pool.discover_devices(os.environ).devices
    if not devices:
        return ()
    n = min(scheduled, max(MAX_STARTED, 8 * len(devices)))
    echo(f"fastci run: {scheduled} planned test(s) in priority order on {len(devices)} GPU(s)")
    return (f"--local_test_jobs={n}", f"--jobs={max(n, os.cpu_count() or 1)}")


def _pytest_first_failure(run: PytestRun, start: float) -> tuple[str, float] | None:
    """pytest's first failure: when pytest started, plus the durations of the tests up to it.

    The result lines carry durations, not times: collection and the time between
    tests are not counted, so this is a little early.
    """
    total = max(run.started - start, 0.0) if run.started else 0.0
    for r in run.results:
        total += r.duration_s
        if r.failed:
            return r.id, total
    return None


def _echo_first_failure(first: tuple[str, float] | None, echo: Callable[[str], None]) -> None:
    if first is not None:
        echo(f"fastci run: time to first failure: {first[1]:.1f}s ({first[0]})")


def _pytest_in_workspace(root: Path, plan: Plan, config: Config, tree: str | None, others: list[str],
                         *, store: ResultHistory | None, echo: Callable[[str], None],
                         python: str | None, pytest_args: tuple[str, ...]) -> PytestRun:
    """Run a selective plan's planned node ids through pytest (Bazel ran the labels)."""
    # A node id in the main file of a gpu_test the plan names is that gpu_test: Bazel runs it.
    mains = labels_by_main([*(t.id for t in plan.tests), *(s.id for s in plan.skipped)])
    ids = [t for t in others if node_path(t) not in mains]
    for t in others:
        if node_path(t) in mains:
            echo(f"fastci run: {shown(t)} is in the main file of {mains[node_path(t) or '']}: Bazel runs it")
    if not ids:
        return PytestRun((), 0)
    echo(f"fastci run: pytest {len(ids)} planned node id(s)")
    return run_pytest(root, plan, config, tree, args=(*pytest_args, *ids), echo=echo, python=python)


def _execute_pytest_only(root: Path, plan: Plan, config: Config, tree: str | None, *,
                         store: ResultHistory | None, echo: Callable[[str], None],
                         python: str | None, pytest_args: tuple[str, ...],
                         warning: str | None, fail_fast: bool = False, t0: float = 0.0) -> RunReport:
    """A repository without a Bazel workspace: the whole suite through pytest, under the plan."""
    ids = [t.id for t in plan.tests] if plan.mode == "selective" else []
    echo("fastci run: no Bazel workspace here: running the suite with pytest"
         + (f" (plan mode {plan.mode}: {plan.reason})" if plan.mode != "selective" else
            f" ({len(ids)} planned, {len(plan.skipped)} skipped by the plan)"))
    py_run = run_pytest(root, plan, config, tree, args=pytest_args, echo=echo, python=python)
    not_run: tuple[str, ...] = ()
    if py_run.error is None:
        not_run = _not_reported(ids, py_run.results)
    stopped: tuple[str, ...] = ()
    if fail_fast and any(r.failed for r in py_run.results):
        stopped, not_run = not_run, ()  # -x stopped pytest: the rest did not run
    recorded = _record_pytest(root, py_run, store) if store is not None else 0
    misses: tuple[tuple[str, str], ...] = ()
    if plan.mode == "shadow":
        misses = _pytest_misses(plan, py_run.results)
    first = _pytest_first_failure(py_run, t0)
    rr = RunReport((), None, not_run, tuple(ids), recorded, misses, warning, plan.mode, py_run,
                   stopped, first)
    _echo_pytest(py_run, not_run, echo)
    for test in stopped:
        echo(f"  NOT RUN    {shown(test)} (--fail-fast stopped the run)")
    if plan.mode == "shadow":
        stamp = _stamp()
        path = root / RUNS_DIR / f"miss-report-{stamp}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        _echo_misses(plan, misses, path, echo)
    _echo_first_failure(first, echo)
    return rr


def _matches(test: TestId, result_id: TestId) -> bool:
    """Whether a plan id names this result (the same node id, or the label of its main file)."""
    if is_label(test):
        main = conventional_main(test)
        return main is not None and node_path(result_id) == main
    return test == result_id


def _not_reported(ids: list[str], results: tuple[PytestResult, ...]) -> tuple[str, ...]:
    """Planned ids no result answers for."""
    return tuple(t for t in dict.fromkeys(ids) if not any(_matches(t, r.id) for r in results))


def _pytest_misses(plan: Plan, results: tuple[PytestResult, ...]) -> tuple[tuple[str, str], ...]:
    """Shadow mode: failures among the tests the plan would have skipped, with its reason."""
    return tuple((s.id, s.why) for s in plan.skipped
                 if any(r.failed and _matches(s.id, r.id) for r in results))


def _echo_pytest(run: PytestRun, not_run: tuple[str, ...], echo: Callable[[str], None]) -> None:
    for r in run.results:
        echo(f"  {r.outcome.upper():<10} {shown(r.id)} {r.duration_s:.1f}s")
    for test in not_run:
        echo(f"  NOT RUN    {shown(test)} (planned, but pytest reported no result)")
    if run.error is not None:
        echo(f"fastci run: FAILED: {run.error}")


#: pytest's exit statuses that end a run normally (0: all passed, 1: some failed).
_PYTEST_OK = (0, 1)


def plan_file(root: Path, plan: Plan, tree: str | None) -> Path:
    """Write the plan a run obeys to ``.fastci/runs/plan-<digest>.json``; return its path.

    Every runner of the run reads this one file: Bazel (``FASTCI_PLAN_FILE``) and the
    pytest plugin (``--fastci-plan``). ``plan`` was already checked against ``tree``: it
    is stamped with it (unknown: left as it was) and its tests are put in priority
    order (the plugin runs planned tests in the plan's order). Named by its content, so
    the same plan keeps one name (Bazel re-reads nothing) and two runs never write each
    other's file.
    """
    ordered = dataclasses.replace(plan, tests=tuple(schedule.order(plan.tests)))
    if tree:
        ordered = dataclasses.replace(ordered, tree=tree)
    path = root / RUNS_DIR / f"plan-{hashlib.sha256(ordered.to_json().encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        dump_plan(ordered, path)  # atomic: a reader never sees half a file
    return path


def run_pytest(root: Path, plan: Plan, config: Config, tree: str | None, *, args: tuple[str, ...] = (),
               echo: Callable[[str], None] = print, python: str | None = None) -> PytestRun:
    """Run pytest in ``root`` under ``plan`` (the plugin) and read each test's result.

    The plan handed to the plugin is the one already checked against ``tree``
    (stamped with it, so the plugin obeys it without a second warning). pytest's
    output is echoed line by line as it comes.
    """
    stamp = _stamp()
    results_file = root / RUNS_DIR / f"pytest-results-{stamp}.jsonl"
    decided = plan_file(root, plan, tree)
    if python is None:
        python = _python(root, config, echo)
    # `fastci run` runs the pruned tests after any failure (execute): they may stay skipped.
    cmd = (python, "-m", "pytest", "-p", "fastci.pytest_plugin", "--fastci-plan", str(decided),
           "--fastci-prunes-rerun", "--fastci-results", str(results_file), *args)
    echo(f"fastci run: {' '.join(cmd)}")
    started = time.time()
    try:
        proc = procs.start(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace")
    except OSError as exc:
        return PytestRun(cmd, -1, (), f"cannot start pytest ({exc})")
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
        rc = proc.wait()
    finally:
        procs.finish(proc)
    results = _read_results(results_file)
    error = None
    if rc not in _PYTEST_OK:
        what = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
                5: "no tests collected"}.get(rc, "unexpected exit status")
        error = f"pytest exited {rc} ({what})"
    return PytestRun(cmd, rc, results, error, started)


def _python(root: Path, config: Config, echo: Callable[[str], None]) -> str:
    """The interpreter the tests run with (config ``runner_python``), else this one."""
    from fastci.plan.inputs import runner_python

    try:
        return runner_python(root, config)
    except Exception as exc:  # noqa: BLE001 - run the tests anyway, with this interpreter
        echo(f"fastci run: warning: {exc}: running pytest with {sys.executable}")
        return sys.executable


def _read_results(path: Path) -> tuple[PytestResult, ...]:
    """The ``--fastci-results`` lines (a malformed line is skipped: its test counts as not run)."""
    out: list[PytestResult] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ()
    for line in lines:
        try:
            d = json.loads(line)
            overrides = d.get("overrides")
            out.append(PytestResult(str(d["id"]), str(d["outcome"]), float(d["duration_s"]),
                                    dict(d.get("workload") or {}),
                                    dict(overrides) if isinstance(overrides, dict) else None,
                                    int(d.get("gpus") or 0)))
        except (ValueError, KeyError, TypeError) as exc:
            LOG.warning("fastci run: unreadable pytest result line %r: %s", line[:200], exc)
    return tuple(out)


def _record_pytest(root: Path, run: PytestRun, store: ResultHistory) -> int:
    """Add each pytest result (not a skip) to the store's history, as Bazel results are."""
    commit = Git(root).head()
    n = 0
    for r in run.results:
        if r.outcome == "skipped":
            continue
        store.record_result(r.id, outcome="passed" if r.passed else "failed",
                            duration_s=r.duration_s, commit=commit, gpus=r.gpus,
                            workload=dict(r.workload), overrides=r.overrides, source="pytest")
        n += 1
    return n


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
