"""The planner behind ``fastci plan``: a change in, a selection and its plan out.

The I/O shell around the pure selector, as a pipeline of named steps over typed values::

    PlanRequest (root, config, base, head, which optional steps)
      ─ gather ─► PlanInputs (decision rules, declared tests, evidence store)
      ─ scan_change ─► ChangeSet (units changed since base and each evidence commit)
      ─ run_stages: select_tests ─► narrow_and_reduce (line facts and workloads from
                    the calibration) ─► pruned ─► prioritized ─► Stages
      ─ to_plan ─► Plan

Where the inputs come from is typed (:mod:`fastci.plan.inputs`): the declared tests
(:class:`~fastci.plan.inputs.Declarations`: the runner's, given, or a query) and the
test runner's environment (:class:`~fastci.plan.inputs.EnvironmentProbe`); the
calibration is seen through :class:`~fastci.plan.calibrated.CalibrationView`, the
ordering is :mod:`fastci.plan.prioritize`. Any error on the way becomes a plan that
runs everything (every test the store or the build knows), with the error as its
reason (:func:`widened_on_error`): selection never narrows silently.

Two inputs are deliberately not taken from where the planner stands:

* the decision rules (:data:`fastci.config.DECISION_KEYS`) come from the *base*
  revision's config file, so a change cannot rewrite the rules that judge it; a
  change to the config file itself runs everything;
* the environment fingerprint is the *test runner's* (its interpreter is run to
  compute it), compared with the fingerprints the test processes recorded.
"""

from __future__ import annotations

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from fastci.changes.scan import ChangeSet, scan
from fastci import config as config_mod
from fastci.config import Config
from fastci.errors import FastCIError
from fastci.gcpause import gc_paused
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.plan.analysis import Analysis
from fastci.plan.calibrated import line_facts_of, open_calibration, reductions, with_calibrated
from fastci.plan.inputs import (BY_RUNNER, RUNNER_ENVIRONMENT, DeclaredBy, Declarations,
                                Environment, EnvironmentProbe)
from fastci.plan.model import ABSENT_INPUT, Plan, PlannedTest, SkippedTest
from fastci.plan.prioritize import changed_paths, prioritized
from fastci.plan.reduce import Choice, planned_cost
from fastci.plan.summary import timing_of
from fastci.select import (DeclaredTest, DecisionKind, Reason, Selection, select_tests,
                           widen_everything)
from fastci.select.decisions import SKIP_KINDS, Decision
from fastci.select.priority import RISK_BASED
from fastci.select.test_rules import EvidenceReader, own_output
from fastci.types import TestId

if TYPE_CHECKING:
    from fastci.evidence.store.db import EvidenceStore
    from fastci.select.lines import Reach

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the change ``base`` -> ``head`` in the repository at ``root``, and
    which optional steps run (``None``: the decision rules' value)."""

    root: Path
    config: Config
    base: str
    head: str
    reduce: bool = True
    prune: str | None = None
    granularity: str | None = None


@dataclass(frozen=True)
class PlanInputs:
    """What the planner stands on before it looks at the change.

    ``rules`` is the configuration to decide with (:func:`decision_rules`) and
    ``rules_changed`` the widening when the change edits it; ``declared_by`` who declares
    the tests, ``declared`` the tests it declared (None: the store's tests); ``store`` the
    evidence store's read side (``opened``: the one the planner opened and closes).
    ``errors`` are the failures met gathering them, raised where they widen the plan.
    """

    rules: Config
    rules_changed: Reason | None
    declared_by: DeclaredBy
    declared: Mapping[TestId, DeclaredTest] | None
    store: EvidenceReader | None
    opened: EvidenceStore | None
    errors: tuple[Exception, ...] = ()


@dataclass(frozen=True)
class Stages:
    """What the steps after the change scan made: the selection (selected, narrowed by
    lines, pruned, ordered), each selected test's workload, and its line facts."""

    selection: Selection
    choices: Mapping[TestId, Choice] = field(default_factory=dict)
    lines: Mapping[TestId, tuple[Reach, ...]] = field(default_factory=dict)


@gc_paused
def analyze(root: Path, config: Config, *, base: str | None = None, head: str = WORKTREE,
            declared: Declarations = BY_RUNNER,
            environment: EnvironmentProbe = RUNNER_ENVIRONMENT,
            store: EvidenceReader | None = None, reduce: bool = True,
            prune: str | None = None, granularity: str | None = None) -> Analysis:
    """Analyze the change ``base`` -> ``head`` and return the selection and its plan.

    The pipeline: gather the inputs (:func:`gather`), scan the change
    (:func:`scan_change`), then select, narrow by lines and reduce, prune and
    prioritize (:func:`run_stages`); any error on the way widens to every test
    (:func:`widened_on_error`). Then the plan (:func:`to_plan`).

    Args:
        root: the repository root.
        config: the effective configuration (from :func:`fastci.config.load`). Its
            decision keys are replaced by the base revision's (see :func:`decision_rules`);
            a Config built in code (no ``origin``) keeps its own.
        base: the base revision (``config.base`` when None).
        head: a revision, or :data:`fastci.integrations.git.repository.WORKTREE` for the working tree.
        declared: where the declared tests come from (:mod:`fastci.plan.inputs`; default:
            the runner's, ``bazel query`` for Bazel, else the store's tests).
        environment: the test runner's environment (default: its interpreter is run).
        store: an open evidence store (opened from ``config.store`` when None).
        reduce: choose reduced workloads from the calibration (``config.calibration``)
            for the selected tests of a selective plan (:mod:`fastci.plan.reduce`).
        prune: ``off``, ``safe`` or ``aggressive`` equivalent-context pruning of a
            selective plan's tests (:mod:`fastci.select.prune`), after the workloads are
            chosen (a test's cost is its expected GPU-seconds at its planned workload);
            None: the decision rules' ``prune`` (the base revision's config).
        granularity: ``unit``, or ``line``: a selected test whose every reason is a
            function body it entered without running a changed line (line evidence
            from the calibration, :mod:`fastci.select.lines`) is skipped; None: the
            decision rules' ``granularity``.
    """
    started = time.perf_counter()
    request = PlanRequest(root, config, base or config.base, head, reduce, prune, granularity)
    git = Git(root)
    inputs = gather(request, git, declared, store)
    changes: ChangeSet | None = None
    try:
        if inputs.errors:
            raise inputs.errors[0]
        env = environment.probe(root, inputs.rules)
        changes = scan_change(request, git, inputs)
        stages = run_stages(request, git, inputs, env, changes)
    except Exception as exc:  # noqa: BLE001 - any failure must widen, never narrow
        stages = widened_on_error(exc, inputs)
    try:
        timing = timing_of(inputs.store, inputs.declared) if inputs.store is not None else {}
    finally:
        if inputs.opened is not None:
            inputs.opened.close()
    plan = to_plan(stages.selection, base=changes.base if changes else request.base,
                   head=_head_name(changes, request.head), choices=stages.choices)
    return Analysis(stages.selection, plan, changes, time.perf_counter() - started,
                    runner=inputs.declared_by.runner, runner_why=inputs.declared_by.why,
                    timing=timing, choices=stages.choices, lines=stages.lines)


def gather(request: PlanRequest, git: Git, declarations: Declarations,
           store: EvidenceReader | None) -> PlanInputs:
    """The decision rules, the declared tests and the evidence store, with what failed.

    The store is opened before the build is asked for its tests, so that a failing
    ``bazel query`` widens to every recorded test, not to none (and a missing store to
    every declared one). Failures are kept, not raised: the first one (the query's, the
    rules', the store's) widens the plan once the universe is known.
    """
    rules, rules_changed, rules_error = request.config, None, None
    try:
        rules, rules_changed = decision_rules(git, request.root, request.config, request.base,
                                              request.head)
    except Exception as exc:  # noqa: BLE001 - raised where it widens
        rules_error = exc
    declared_by = declarations.declared_by(request.root, rules)
    opened, store_error = None, None
    if store is None:
        from fastci.evidence.store.db import EvidenceStore

        try:
            store = opened = EvidenceStore.open(request.config.path(request.root, "store"))
        except Exception as exc:  # noqa: BLE001 - raised where it widens
            store_error = exc
    declared, query_error = None, None
    try:
        declared = declared_by.ask(request.root, rules)
    except Exception as exc:  # noqa: BLE001 - raised where it widens
        query_error = exc
    errors = tuple(e for e in (query_error, rules_error, store_error) if e is not None)
    return PlanInputs(rules, rules_changed, declared_by, declared, store, opened, errors)


def scan_change(request: PlanRequest, git: Git, inputs: PlanInputs) -> ChangeSet:
    """The change since ``base`` and since each evidence commit, less FastCI's own outputs.

    A rename keeps its old path (a file moved into ``.fastci/`` is a deletion for the
    tests that read it).
    """
    assert inputs.store is not None  # no store is an error of `inputs`, raised before
    changes = scan(git, request.base, request.head,
                   evidence_commits=inputs.store.evidence_commits())
    return replace(changes, others=tuple(
        o for o in changes.others
        if not all(own_output(p, request.config) for p in (o.path, o.old_path) if p)))


def run_stages(request: PlanRequest, git: Git, inputs: PlanInputs, env: Environment,
               changes: ChangeSet) -> Stages:
    """Select, then (for a plan not widened) narrow by lines and reduce, prune, prioritize."""
    assert inputs.store is not None
    selection = select_tests(changes, inputs.store, inputs.rules, declared=inputs.declared,
                             env_fingerprint=env.fingerprint, environment=env.parts)
    if inputs.rules_changed is not None:
        selection = widen(selection, inputs.rules_changed)
    if selection.widen:
        return Stages(selection)
    selection, choices, lines = narrow_and_reduce(request, git, inputs, changes, selection)
    selection = pruned(request, inputs, changes, selection, choices)
    if not selection.widen:
        selection = prioritized(selection, inputs.store, choices, request.config.priority, lines,
                                history=(git, changed_paths(changes)), declared=inputs.declared)
    return Stages(selection, choices, lines)


def narrow_and_reduce(request: PlanRequest, git: Git, inputs: PlanInputs, changes: ChangeSet,
                      selection: Selection
                      ) -> tuple[Selection, dict[TestId, Choice], dict[TestId, tuple[Reach, ...]]]:
    """The steps that read the calibration: line facts (for ``granularity: line`` and the
    risk-based priorities), the tests line evidence shows the change does not reach
    skipped, and each selected test's workload (with ``reduce``)."""
    assert inputs.store is not None
    granularity = (request.granularity if request.granularity is not None
                   else inputs.rules.granularity)
    choices: dict[TestId, Choice] = {}
    lines: dict[TestId, tuple[Reach, ...]] = {}
    if not (request.reduce or granularity == "line"):
        return selection, choices, lines
    calibration = open_calibration(request.root, request.config, git, request.head, changes)
    try:
        declared_now = with_calibrated(selection, inputs.declared or {}, calibration)
        if granularity == "line" or request.config.priority in RISK_BASED:
            lines = line_facts_of(selection, changes, calibration, declared_now, inputs.store)
        if granularity == "line":
            from fastci.select.lines import narrow_by_lines

            selection, _narrowed = narrow_by_lines(selection, lines)
        if request.reduce:
            choices = reductions(changes, selection, declared_now, inputs.store, calibration)
    finally:
        calibration.close()
    return selection, choices, lines


def pruned(request: PlanRequest, inputs: PlanInputs, changes: ChangeSet, selection: Selection,
           choices: Mapping[TestId, Choice]) -> Selection:
    """``selection`` less the tests equivalent-context pruning leaves out (``prune``: the
    request's, else the decision rules'), costed at their planned workloads."""
    assert inputs.store is not None
    prune = request.prune if request.prune is not None else inputs.rules.prune
    if prune == "off" or selection.widen:
        return selection
    from fastci.select.prune import prune as prune_selection

    cost = {d.test: planned_cost(d, choices) for d in selection.selected}
    import_time = frozenset(uc.unit for uc in changes.unit_changes if uc.import_time)
    selection, _pruned = prune_selection(selection, inputs.store, inputs.declared or {}, cost,
                                         prune, import_time)
    return selection


def widened_on_error(exc: Exception, inputs: PlanInputs) -> Stages:
    """Every test the store or the build knows, for the error ``exc`` (logged once)."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not isinstance(exc, FastCIError):
        LOG.exception("unexpected error during change analysis")
        message = f"{type(exc).__name__}: {message}"
    LOG.warning("widening to every test: %s", message)
    reason = Reason(DecisionKind.ERROR, f"change analysis failed ({message}): everything runs",
                    via="safety rule: any error widens the plan")
    return Stages(widen_everything(reason, inputs.store, inputs.declared))


def _head_name(changes: ChangeSet | None, head: str) -> str:
    """The plan's ``head``: the scanned revision, or ``worktree`` for the working tree."""
    if changes is not None and changes.head != WORKTREE:
        return changes.head
    return head if head != WORKTREE else "worktree"


def to_plan(selection: Selection, *, base: str | None, head: str | None,
            choices: Mapping[TestId, Choice] | None = None) -> Plan:
    """Turn a selection into a plan: every selected test, at the workload ``choices`` gives
    it (:mod:`fastci.plan.reduce`; absent: full workload)."""
    choices = choices or {}

    def planned(d: Decision) -> PlannedTest:
        c = choices.get(d.test)
        if c is None:
            return PlannedTest(d.test, {}, d.priority, d.why, d.est_gpu_s)
        return PlannedTest(d.test, dict(c.overrides), d.priority, f"{d.why}; {c.why}",
                           planned_cost(d, choices))

    tests = tuple(planned(d) for d in selection.selected)
    if selection.widen:
        reason = "; ".join(dict.fromkeys(r.sentence for r in selection.widen))
        return Plan(mode="all", reason=reason, tests=tests, base=base, head=head)
    skipped = tuple(SkippedTest(d.test, d.why, d.stand_ins) for d in selection.skipped)
    reason = f"{selection.summary}; {len(tests)} of {len(tests) + len(skipped)} tests selected"
    return Plan(mode="selective", reason=reason, tests=tests, skipped=skipped, base=base, head=head,
                inputs=tuple((p, d or ABSENT_INPUT) for p, d in selection.inputs))


def decision_rules(git: Git, root: Path, config: Config, base: str,
                   head: str) -> tuple[Config, Reason | None]:
    """The configuration to decide with, and the widening reason if the config file changed.

    The decision keys come from the config file as of ``base`` (built-in defaults
    when ``base`` has none), with the environment's and command line's values on
    top: the head's file, or the working tree's, never decides. A config file that
    differs between ``base`` and ``head`` (edited, added, deleted, unparsable) runs
    everything, whatever either version's ``run_all`` says. A config file outside
    the repository is the CI's own and is used as loaded; so is a Config built in
    code (no ``origin``), though a change to ``<root>/fastci.yaml`` still widens.

    Raises:
        GitError: ``base`` does not exist.
        ConfigError: the base revision's config file is invalid.
    """
    rel = config_mod.repo_config_path(root, config)
    if rel is None:
        return config, None
    base_id = git.resolve(base)
    old = git.read(base_id, rel)
    new = git.read(head, rel)
    changed = None
    if old != new:
        what = "added" if old is None else "deleted" if new is None else "changed"
        changed = Reason(
            DecisionKind.RUN_ALL_PATH,
            f"{rel} {what}: decisions use the base's rules, and a change to the rules runs "
            "everything", path=rel,
            via="safety rule: the configuration is read at the base revision")
    if config.origin is None:
        return config, changed
    return config_mod.with_rules_from(config, old, f"{rel} at {base_id[:12]}"), changed


def plan_file_at(root: Path, config: Config, rev: str) -> tuple[Path, str | None]:
    """The plan file as the config file at ``rev`` (the base) names it, and a note when the
    working tree's config names another.

    A change never chooses its own plan file: ``fastci plan`` writes where the base's
    ``plan`` key says, and ``fastci run`` obeys a plan only where the config at the
    plan's ``base`` puts it (invariant 10; a change that moved it could otherwise point
    the runners at a plan it committed, or have a plan written over a file of its
    choosing). ``--out``/``--plan`` and ``$FASTCI_PLAN`` (``config.overridden``) are the
    CI's own choice and win; so does a config file outside the repository. When the
    base's file cannot be read (no git, an unknown or unfetched ``rev``, a file that
    does not parse) the working tree's value stands: the plan's ``tree`` still decides.
    """
    here = config.path(root, "plan")
    rel = config_mod.repo_config_path(root, config)
    if "plan" in config.overridden or rel is None or config.origin is None:
        return here, None
    try:
        git = Git(root)
        text = git.read(git.resolve(rev), rel)
        values = config_mod.parse_text(text, f"{rel} at {rev}") if text is not None else {}
    except FastCIError as exc:
        LOG.debug("cannot read %s at %s: %s", rel, rev, exc)
        return here, None
    value = values.get("plan", config_mod.DEFAULTS.plan)
    there = Path(value) if Path(value).is_absolute() else root / value
    if os.path.abspath(there) == os.path.abspath(here):
        return here, None
    return there, (f"{rel} names the plan file {config.plan!r}, the base ({rev[:12]}) "
                   f"{value!r}: a change never chooses its own plan file")


def widen(selection: Selection, reason: Reason) -> Selection:
    """``selection`` with every runnable test selected for ``reason`` (a plan-wide widening).

    ``reason`` comes first (it is why everything runs); tests the change already
    reached keep their other reasons and run first, in their order; a test no longer
    declared by the build stays out (it cannot run).
    """
    decisions = []
    for d in selection.decisions:
        if d.reasons and all(r.kind is DecisionKind.NOT_DECLARED for r in d.reasons):
            decisions.append(d)
            continue
        kept = tuple(r for r in d.reasons if r.kind not in SKIP_KINDS)
        decisions.append(replace(d, reasons=(reason,) + kept))
    return replace(selection, decisions=tuple(decisions), widen=(reason,) + selection.widen)


def change_config(root: Path, *, base: str | None = None, store: str | None = None,
                  plan: str | None = None, runner: str | None = None,
                  prune: str | None = None, granularity: str | None = None) -> Config:
    """The effective config of a command that analyses a change (its options win, level 4).

    Args:
        root: the repository root.
        base: ``--base`` (None: the config's ``base``).
        store: ``--store`` (None: the config's ``store``).
        plan: ``--out``, the plan file to write (None: the config's ``plan``).
        runner: ``--bazel`` / ``--no-bazel`` (``bazel`` / ``pytest``; None: the config's ``runner``).
        prune: ``--prune`` (None: the config's ``prune``).
        granularity: ``--granularity`` (None: the config's ``granularity``).
    """
    return config_mod.load(root, overrides={"base": base, "store": store, "plan": plan,
                                            "runner": runner, "prune": prune,
                                            "granularity": granularity})


def analyze_change(root: Path, *, base: str | None = None, head: str | None = None,
                   store: str | None = None, plan: str | None = None,
                   runner: str | None = None, prune: str | None = None,
                   granularity: str | None = None) -> tuple[Config, Analysis]:
    """Analyze a change described the way ``fastci plan`` and ``fastci explain`` take it.

    Args:
        root: the repository root.
        base: the base revision (None: the config's ``base``).
        head: the head revision (None: the working tree, untracked files included).
        store: the evidence store (None: the config's ``store``).
        plan: the plan file (None: the config's ``plan``); only part of the config.
        runner: ``bazel`` (declared tests from ``bazel query``) or ``pytest`` (the
            universe is the store's tests); None: config ``runner``
            (:func:`fastci.plan.inputs.choose_runner`).

    Returns:
        The effective config and the analysis (:func:`analyze`).
    """
    cfg = change_config(root, base=base, store=store, plan=plan, runner=runner, prune=prune,
                        granularity=granularity)
    return cfg, analyze(root, cfg, base=cfg.base, head=head or WORKTREE)
