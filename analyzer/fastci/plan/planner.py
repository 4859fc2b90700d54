"""The application behind ``fastci plan``: gather inputs, select, build the plan.

The I/O shell around the pure selector: git (:mod:`fastci.integrations.git.repository`), the evidence
store, ``bazel query`` for the declared tests and the environment fingerprint.
Any error on the way becomes a plan that runs everything (every test the store
or the build knows), with the error as its reason: selection never narrows
silently.

The runner (config ``runner``, :func:`choose_runner`) says where the declared
tests come from: Bazel (``bazel query``) in a Bazel workspace whose ``bazel`` is
found, else pytest (the store's tests: a pytest suite declares nothing ahead).

Two inputs are deliberately not taken from where the planner stands:

* the decision rules (:data:`fastci.config.DECISION_KEYS`) come from the *base*
  revision's config file, so a change cannot rewrite the rules that judge it; a
  change to the config file itself runs everything;
* the environment fingerprint is the *test runner's* (its interpreter is run to
  compute it), compared with the fingerprints the test processes recorded.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, NamedTuple, Sequence

from fastci.changes.scan import ChangeSet, scan
from fastci import config as config_mod
from fastci.config import Config
from fastci.errors import FastCIError, GitError
from fastci.gcpause import gc_paused
from fastci.integrations.git.repository import WORKTREE, Git
from fastci.plan.model import ABSENT_INPUT, Plan, PlannedTest, SkippedTest
from fastci.plan.reduce import Choice, choose
from fastci.select import (DeclaredTest, DecisionKind, Reason, Selection, select_tests,
                           widen_everything)
from fastci.select.decisions import SKIP_KINDS, Decision
from fastci.select.priority import (INPUT_BASED, RISK_BASED, STRATEGIES, RiskFacts, cofailure,
                                    failed_outcome, input_tokens, order, reorder)
from fastci.select.test_rules import EvidenceReader, own_output
from fastci.types import RelPath, TestId, UnitId

if TYPE_CHECKING:
    from fastci.integrations.bazel.query import TestDecl
    from fastci.select.lines import Reach
    from fastci.evidence.store.calibrations import CalibrationStore
    from fastci.evidence.store.db import EvidenceStore

LOG = logging.getLogger(__name__)

DeclaredProvider = Callable[[Path, Config], Mapping[TestId, DeclaredTest]]
#: ``analyze(declared=BY_RUNNER)``: the declared tests follow the runner (:func:`choose_runner`).
BY_RUNNER: Literal["runner"] = "runner"

#: Files that make a directory a Bazel workspace root.
WORKSPACE_FILES = ("WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel")


class Timing(NamedTuple):
    """A test's newest recorded duration and its GPUs (declared GPUs win over recorded).

    A named tuple: a plan makes one per known test (100,000 at scale)."""

    duration_s: float | None  # None: never run (or its duration is not known)
    gpus: int


@dataclass(frozen=True)
class Analysis:
    """What ``fastci plan`` computed: the selection, the plan, the changes, the time.

    ``runner`` and ``runner_why`` say who declared the tests and why
    (:func:`choose_runner`; None when the caller passed the declared tests);
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


def choose_runner(root: Path, config: Config) -> tuple[str, str]:
    """The runner whose tests make the universe (``bazel`` or ``pytest``), and why.

    Config ``runner`` (set by ``fastci.yaml``, ``$FASTCI_RUNNER`` or ``--bazel`` /
    ``--no-bazel``) wins; ``auto`` is Bazel when a Bazel workspace file is at
    ``root`` and the Bazel executable (config ``bazel``) is found, else pytest.
    """
    if config.runner in ("bazel", "pytest"):
        where = ("the command line or $FASTCI_RUNNER" if "runner" in config.overridden
                 else "config `runner`")
        return config.runner, f"set by {where}"
    marker = next((name for name in WORKSPACE_FILES if (Path(root) / name).is_file()), None)
    if marker is None:
        return "pytest", ("no Bazel workspace (no " + ", ".join(WORKSPACE_FILES)
                          + " at the repository root)")
    exe = config.bazel
    if "/" in exe:  # a path; a relative one is run from the root
        path = Path(exe) if Path(exe).is_absolute() else Path(root) / exe
        found = path.is_file() and os.access(path, os.X_OK)
    else:
        found = shutil.which(exe) is not None
    if not found:
        return "pytest", (f"{marker} is at the repository root, but the Bazel executable "
                          f"{exe!r} is not found (set `runner: bazel` to insist)")
    return "bazel", f"{marker} is at the repository root and {exe!r} is found"


def label_to_path(label: str) -> str | None:
    """``//pkg/sub:file.py`` -> ``pkg/sub/file.py``; None for another repository's file.

    Raises:
        LabelError: ``label`` is not a well-formed label.
    """
    from fastci.types import parse_label  # the one label parser (fastci.types)

    return parse_label(label).source_path()


def bazel_declared(root: Path, config: Config, *, bazel: Any = None) -> dict[TestId, DeclaredTest]:
    """The declared gpu_tests from ``bazel query`` (:mod:`fastci.integrations.bazel.query`)."""
    from fastci.integrations.bazel.query import list_gpu_tests  # imported lazily: it shells out
    from fastci.integrations.bazel.runner import Bazel

    return declared_tests(list_gpu_tests(bazel or Bazel(root, config.bazel), config.targets))


def declared_tests(decls: Iterable[TestDecl]) -> dict[TestId, DeclaredTest]:
    """``bazel query``'s test declarations as the selector takes them, by test id."""
    out: dict[TestId, DeclaredTest] = {}
    for d in decls:
        # A source in another repository has no path here: no change of ours can touch it.
        srcs = tuple(p for p in map(label_to_path, d.srcs) if p is not None)
        out[d.id] = declared_test(d, srcs)
    return out


def declared_test(d: TestDecl, srcs: tuple[RelPath, ...] = ()) -> DeclaredTest:
    """A :class:`~fastci.integrations.bazel.query.TestDecl` as the selector takes it:
    GPUs, workload and sources, and the whole reduction declaration."""
    return DeclaredTest(d.id, int(d.gpus), dict(d.workload), srcs, floors=dict(d.floors),
                        frozen=d.frozen, scope=tuple(d.scope), constraints=tuple(d.constraints),
                        check=d.check, reference=d.reference, defaulted=tuple(d.defaulted))


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


@gc_paused
def analyze(root: Path, config: Config, *, base: str | None = None, head: str = WORKTREE,
            declared: Mapping[TestId, DeclaredTest] | DeclaredProvider | None
            | Literal["runner"] = BY_RUNNER,
            env_fingerprint: str | None | Callable[[], str] = None,
            store: EvidenceReader | None = None, reduce: bool = True,
            prune: str | None = None, granularity: str | None = None) -> Analysis:
    """Analyze the change ``base`` -> ``head`` and return the selection and its plan.

    Args:
        root: the repository root.
        config: the effective configuration (from :func:`fastci.config.load`). Its
            decision keys are replaced by the base revision's (see :func:`decision_rules`);
            a Config built in code (no ``origin``) keeps its own.
        base: the base revision (``config.base`` when None).
        head: a revision, or :data:`fastci.integrations.git.repository.WORKTREE` for the working tree.
        declared: the declared tests, a provider of them, None to use the tests in
            the store only (pytest suites), or :data:`BY_RUNNER` (default): ``bazel
            query`` when the runner is Bazel, else None (:func:`choose_runner`, with
            the decision rules' ``runner``).
        env_fingerprint: the test runner's fingerprint, a callable giving it, or None to
            compute it by running the runner's interpreter (:func:`runner_python`).
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
    base = base or config.base
    decl: Mapping[TestId, DeclaredTest] | None = None
    opened: EvidenceStore | None = None
    changes: ChangeSet | None = None
    choices: dict[TestId, Choice] = {}
    lines: dict[TestId, tuple[Reach, ...]] = {}
    git = Git(root)
    rules, rules_changed, rules_error = config, None, None
    try:
        rules, rules_changed = decision_rules(git, root, config, base, head)
    except Exception as exc:  # noqa: BLE001 - raised below, once the universe is known
        rules_error = exc
    runner: str | None = None
    runner_why = ""
    if isinstance(declared, str):  # BY_RUNNER
        runner, runner_why = choose_runner(root, rules)
        declared = bazel_declared if runner == "bazel" else None
    store_error: Exception | None = None
    try:
        if store is None:
            # Opened before the build is asked, so that a failing `bazel query` widens
            # to every recorded test, not to none (and a missing store to every declared one).
            from fastci.evidence.store.db import EvidenceStore

            try:
                store = opened = EvidenceStore.open(config.path(root, "store"))
            except Exception as exc:  # noqa: BLE001 - raised below, once the build answered
                store_error = exc
        decl = declared(root, rules) if callable(declared) else declared
        for error in (rules_error, store_error):
            if error is not None:
                raise error
        assert store is not None
        fingerprint, environment = _environment(env_fingerprint, root, rules)
        changes = scan(git, base, head, evidence_commits=store.evidence_commits())
        # FastCI's own outputs are no change; a rename keeps its old path (a file moved
        # into .fastci/ is a deletion for the tests that read it).
        changes = replace(changes, others=tuple(
            o for o in changes.others
            if not all(own_output(p, config) for p in (o.path, o.old_path) if p)))
        selection = select_tests(changes, store, rules, declared=decl,
                                 env_fingerprint=fingerprint, environment=environment)
        if rules_changed is not None:
            selection = widen(selection, rules_changed)
        granularity = granularity if granularity is not None else rules.granularity
        if (reduce or granularity == "line") and not selection.widen:
            calibration, calibration_error = _calibration(root, config, git, head, changes)
            try:
                declared_now = _with_calibrated(selection, decl or {}, calibration)
                if granularity == "line" or config.priority in RISK_BASED:
                    lines = _line_facts(selection, changes, calibration, declared_now, store)
                if granularity == "line":
                    from fastci.select.lines import narrow_by_lines

                    selection, _narrowed = narrow_by_lines(selection, lines)
                if reduce:
                    choices = _reductions(changes, selection, declared_now, store, calibration,
                                          calibration_error)
            finally:
                if calibration is not None:
                    calibration.close()
        prune = prune if prune is not None else rules.prune
        if prune != "off" and not selection.widen:
            from fastci.select.prune import prune as prune_selection

            cost = {d.test: planned_cost(d, choices) for d in selection.selected}
            import_time = frozenset(uc.unit for uc in changes.unit_changes if uc.import_time)
            selection, _pruned = prune_selection(selection, store, decl or {}, cost, prune,
                                                 import_time)
        if not selection.widen:
            selection = prioritized(selection, store, choices, config.priority, lines,
                                    history=(git, changed_paths(changes)), declared=decl)
    except Exception as exc:  # noqa: BLE001 - any failure must widen, never narrow
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not isinstance(exc, FastCIError):
            LOG.exception("unexpected error during change analysis")
            message = f"{type(exc).__name__}: {message}"
        LOG.warning("widening to every test: %s", message)
        reason = Reason(DecisionKind.ERROR, f"change analysis failed ({message}): everything runs",
                        via="safety rule: any error widens the plan")
        selection = widen_everything(reason, store, decl)
        choices, lines = {}, {}
    try:
        timing = _timing(store, decl) if store is not None else {}
    finally:
        if opened is not None:
            opened.close()
    head_name = head if head != WORKTREE else "worktree"
    plan = to_plan(selection, base=changes.base if changes else base, head=(
        changes.head if changes and changes.head != WORKTREE else head_name), choices=choices)
    return Analysis(selection, plan, changes, time.perf_counter() - started,
                    runner=runner, runner_why=runner_why, timing=timing, choices=choices,
                    lines=lines)


def _calibration(root: Path, config: Config, git: Git, head: str, changes: ChangeSet
                 ) -> tuple[CalibrationStore | None, str | None]:
    """The calibration store, or why there is none to trust (None, None: not calibrated)."""
    from fastci.evidence.store.calibrations import CalibrationStore

    path = config.path(root, "calibration")
    calibration: CalibrationStore | None = None
    error: str | None = None
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = None
    written = {p for f in changes.files for p in (f.path, f.old_path) if p}
    written |= {p for o in changes.others for p in (o.path, o.old_path) if p}
    if rel is not None and (rel in written or rel in git.tracked_files(head)):
        # A calibration the change itself can write could make any test look reducible.
        error = f"the calibration {rel} is part of the repository or of the change: not trusted"
    elif path.is_file():
        try:
            calibration = CalibrationStore.open(path)
        except FastCIError as exc:
            error = f"calibration unusable ({str(exc).splitlines()[0]})"
    return calibration, error


def _with_calibrated(selection: Selection, declared: Mapping[TestId, DeclaredTest],
                     calibration: CalibrationStore | None) -> dict[TestId, DeclaredTest]:
    """``declared`` plus, for a runner without declarations at plan time (pytest), the
    declarations the calibration kept for the selected tests."""
    out = dict(declared)
    if calibration is not None:
        for d in selection.selected:
            if d.test not in out:
                got = calibrated_declaration(d.test, calibration)
                if got is not None:
                    out[d.test] = got
    return out


def _line_facts(selection: Selection, changes: ChangeSet, calibration: CalibrationStore | None,
                declared: Mapping[TestId, DeclaredTest], store: EvidenceReader
                ) -> dict[TestId, tuple[Reach, ...]]:
    """:func:`fastci.select.lines.line_facts` of the selected, declared tests."""
    from fastci.select.lines import COMPILER_MARKERS, declaration_digests, line_facts

    if calibration is None or changes.versions is None:
        return {}
    # A test whose run executed a file that names a compiler or tracer may have run code
    # that produced no line events: no line facts for it.
    sources: dict[TestId, set[RelPath]] = {}
    for test, path, _digest in store.source_digests(
            tests=[d.test for d in selection.selected if d.test in declared]):
        sources.setdefault(test, set()).add(path)
    compiling = {p for p in set().union(*sources.values())
                 if any(m.encode() in (changes.versions.now(p) or b"") for m in COMPILER_MARKERS)}
    if compiling:
        LOG.info("no line evidence for tests that ran %s: it may compile or trace Python code, "
                 "whose frames produce no line events", sorted(compiling)[0])
    candidates = [d.test for d in selection.selected if d.test in declared
                  and d.test in sources and not sources[d.test] & compiling
                  and not _traced_any(store, d.test)]
    recorded: dict[TestId, dict[UnitId, str]] = {}
    for test, unit, checksum in store.recorded_units(tests=candidates):
        recorded.setdefault(test, {})[unit] = checksum
    digests = declaration_digests({t: declared[t] for t in candidates})
    return line_facts(selection, changes.versions, calibration, digests, recorded, changes.base)


def _traced_any(store: EvidenceReader, test: TestId) -> bool:
    """Whether the test's evidence holds code dynamo traced (no line events: no line facts)."""
    from fastci.evidence.record.traced import TRACED_CONTEXT

    return any(TRACED_CONTEXT in sigs for sigs in store.units_of_test(test).values())


def _reductions(changes: ChangeSet, selection: Selection, declared: Mapping[TestId, DeclaredTest],
                store: EvidenceReader, calibration: CalibrationStore | None,
                error: str | None) -> dict[TestId, Choice]:
    """Each selected test's workload from the calibration (full workload on any doubt)."""
    history = getattr(store, "runs_of_test", None)
    return choose([d for d in selection.selected if d.test in declared], declared,
                  calibration, changes.versions, changes.base, history=history,
                  calibration_error=error)


def planned_cost(d: Decision, choices: Mapping[TestId, Choice]) -> float | None:
    """A selected test's expected GPU-seconds at the workload the plan gives it: the chosen
    rung's calibrated cost when reduced, else the selector's estimate (None: unknown)."""
    c = choices.get(d.test)
    return c.est_gpu_s if c is not None and c.reduced and c.est_gpu_s is not None \
        else d.est_gpu_s


#: Commits: where a test's runs were recorded (its history) and what the change changes.
History = tuple[Git, frozenset[RelPath]]


def changed_paths(changes: ChangeSet | None) -> frozenset[RelPath]:
    """Every path the change touches (both sides of a rename; :attr:`ChangeSet.paths`)."""
    return frozenset(changes.paths) if changes is not None else frozenset()


def prioritized(selection: Selection, store: EvidenceReader, choices: Mapping[TestId, Choice],
                strategy: str, lines: Mapping[TestId, Sequence[Reach]] | None = None, *,
                history: History | None = None,
                declared: Mapping[TestId, DeclaredTest] | None = None) -> Selection:
    """The selected tests in the order of the ``priority`` strategy (fastci.select.priority),
    scored with their expected cost at the planned workload, their recorded outcomes (with
    ``history``: also their failures at commits that changed the same paths) and, where
    line evidence speaks for them, how many changed lines they ran."""
    strategy = _affordable(strategy, selection, log=True)
    # Only the history-aware strategies pay for reading the tests' recent runs, and only
    # the input-aware ones for the contexts of the changed units.
    risky = strategy in RISK_BASED
    facts = _risk_facts(selection, store, choices, lines, history=risky,
                        inputs=strategy in INPUT_BASED, commits=history if risky else None,
                        declared=declared)
    return reorder(selection, lambda d: facts[d.test], STRATEGIES[strategy])


def strategy_orders(analysis: Analysis, store: EvidenceReader, git: Git | None = None,
                    declared: Mapping[TestId, DeclaredTest] | None = None
                    ) -> dict[str, list[TestId]]:
    """The analysis's selected tests in the order of every prioritization strategy
    (:data:`fastci.select.priority.STRATEGIES`), as ``fastci plan`` would order them
    with ``priority:`` set to it (``git``: the repository, for failures at commits that
    changed the same paths; ``declared``: the tests' declarations, for their scopes
    and checks); {} when the selection was widened (nothing to order).
    What the strategies read is read once for all of them."""
    selection = analysis.selection
    if selection.widen:
        return {}
    used = {name: _affordable(name, selection) for name in STRATEGIES}
    facts = _risk_facts(selection, store, analysis.choices, analysis.lines, history=True,
                        inputs=bool(INPUT_BASED & set(used.values())),
                        commits=(git, changed_paths(analysis.changes)) if git else None,
                        declared=declared)
    return {name: [d.test for d in order(selection.selected, lambda d: facts[d.test],
                                          STRATEGIES[strategy])]
            for name, strategy in used.items()}


def _affordable(strategy: str, selection: Selection, log: bool = False) -> str:
    """``strategy``, or ``reasons`` when it reads the tests' inputs and more than
    :data:`INPUTS_MAX_TESTS` tests are selected."""
    if strategy not in INPUT_BASED or len(selection.selected) <= INPUTS_MAX_TESTS:
        return strategy
    if log:
        LOG.info("%d tests selected (more than %d): ordered by their reasons, without "
                 "reading their inputs and histories", len(selection.selected), INPUTS_MAX_TESTS)
    return "reasons"


#: Runs per test read for its failures at commits that changed the same paths, and the
#: most distinct commits whose paths one plan asks git for (one ``git log``).
HISTORY_RUNS = 20
HISTORY_COMMITS = 2000


def _risk_facts(selection: Selection, store: EvidenceReader, choices: Mapping[TestId, Choice],
                lines: Mapping[TestId, Sequence[Reach]] | None, *, history: bool,
                inputs: bool, commits: History | None = None,
                declared: Mapping[TestId, DeclaredTest] | None = None) -> dict[TestId, RiskFacts]:
    """What a strategy may know of each selected test: its cost at the planned workload
    and its line facts; with ``history`` its recent outcomes (one query per chunk of
    tests when the store has ``recent_outcomes``) and, with ``commits`` too, its failure
    history correlated with the changed paths (:func:`fastci.select.priority.cofailure`;
    the paths of the commits its runs were recorded at, from git); with ``inputs`` its
    inputs to the changed units (:func:`changed_unit_inputs`); from ``declared``, its
    scope and check."""
    tests = [d.test for d in selection.selected]
    recent: Mapping[TestId, tuple[str, ...]] = {}
    correlated: dict[TestId, float] = {}
    if history:
        with_commits = getattr(store, "recent_runs", None)
        batch = getattr(store, "recent_outcomes", None)
        runs = getattr(store, "runs_of_test", None)
        if commits is not None and commits[1] and with_commits is not None:
            got = with_commits(tests, HISTORY_RUNS)
            recent = {t: tuple(o for o, _ in r[:10]) for t, r in got.items()}
            correlated = _correlated(got, *commits)
        elif batch is not None:
            recent = batch(tests)
        elif runs is not None:
            recent = {t: tuple(r.outcome for r in reversed(runs(t))) for t in tests}
    given = changed_unit_inputs(selection, store) if inputs else {}
    out: dict[TestId, RiskFacts] = {}
    for d in selection.selected:
        reach = (lines or {}).get(d.test)
        decl = (declared or {}).get(d.test)
        out[d.test] = RiskFacts(d, planned_cost(d, choices), recent.get(d.test, ()),
                                sum(r.ran for r in reach) if reach else None,
                                given.get(d.test, {}), correlated.get(d.test, 0.0),
                                decl.scope if decl else (),
                                decl.check if decl and "check" not in decl.defaulted else None)
    return out


def _correlated(runs: Mapping[TestId, Sequence[tuple[str, str | None]]], git: Git,
                changed: frozenset[RelPath]) -> dict[TestId, float]:
    """:func:`fastci.select.priority.cofailure` of each test that failed in one of ``runs``
    (one that never failed scores 0: git is asked only about its failing tests' commits)."""
    failing = {t: r for t, r in runs.items() if any(failed_outcome(o) for o, _ in r)}
    wanted = list(dict.fromkeys(c for r in failing.values() for _, c in r if c))
    if not wanted:
        return {}
    try:
        files_of = git.files_of_commits(wanted[:HISTORY_COMMITS])
    except GitError as exc:  # only the order loses a signal
        LOG.info("failure history by changed files not read: %s", exc)
        return {}
    return {t: cofailure(r, files_of, changed) for t, r in failing.items()}


#: Above this many selected tests, ``rare_inputs`` reads neither the contexts of the
#: changed units nor the tests' histories (about 0.07 s per 1,000 tests here; the
#: plan-time budget is 2 s at 100,000 tests) and orders as ``reasons`` does.
INPUTS_MAX_TESTS = 5000


def changed_unit_inputs(selection: Selection, store: EvidenceReader
                        ) -> dict[TestId, dict[UnitId, frozenset[str]]]:
    """Per selected test, the input tokens (:func:`fastci.select.priority.input_tokens`)
    of the contexts its evidence recorded for each changed unit it reached
    (:func:`fastci.select.prune.changed_unit_contexts`: what pruning reads)."""
    from fastci.select.prune import changed_unit_contexts

    return {t: {u: input_tokens(contexts) for u, contexts in units.items() if contexts}
            for t, units in changed_unit_contexts(selection, store).items()}


def calibrated_declaration(test: TestId, calibration: CalibrationStore) -> DeclaredTest | None:
    """The declaration ``test`` was calibrated under, as the selector takes it (None: none kept).

    For runners that cannot list declarations when planning (pytest: they live in
    markers that only collection sees). The newest rung that kept its declaration
    speaks; a declaration that does not hash to the digest its rung was stored
    under is not used. The pytest plugin checks the plan's overrides against the
    live marker when the test runs (floors, constraints, a valid declaration) and
    runs the full workload when they do not fit; a marker edit is a change to the
    test's file (or to a file its collection read), which runs the test full anyway.
    """
    from fastci.evidence.store.calibrations import declaration_digest

    rungs = [r for r in calibration.rungs(test) if r.spec]
    if not rungs:
        return None
    rung = max(rungs, key=lambda r: r.recorded_at)
    spec = rung.spec
    try:
        got = DeclaredTest(
            test, int(spec.get("gpus") or 0), dict(spec["workload"]), (),
            floors=dict(spec["floors"]), frozen=tuple(str(x) for x in spec["frozen"]) or None,
            scope=tuple(str(x) for x in spec["scope"]),
            constraints=tuple(str(x) for x in spec["constraints"]),
            check=None if spec.get("check") is None else str(spec["check"]),
            reference=None if spec.get("reference") is None else str(spec["reference"]))
    except (KeyError, TypeError, ValueError):
        return None
    return got if declaration_digest(got) == rung.declaration else None


def _timing(store: EvidenceReader, declared: Mapping[TestId, DeclaredTest] | None
            ) -> dict[TestId, Timing]:
    """Each known test's newest recorded duration and GPUs (declared GPUs win), for the summary."""
    try:
        runs = store.latest_runs()
    except Exception as exc:  # noqa: BLE001 - the summary only loses its estimate
        LOG.warning("cannot read recorded durations: %s", exc)
        runs = {}
    out = {t: Timing(float(r.duration_s), int(r.gpus)) for t, r in runs.items()}
    for t, d in (declared or {}).items():
        run = runs.get(t)
        out[t] = Timing(float(run.duration_s) if run is not None else None, int(d.gpus))
    return out


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


def runner_python(root: Path, config: Config) -> str:
    """The interpreter the tests run with, whose environment the fingerprint must describe.

    ``runner_python`` from the config: a path (relative to ``root``), a command on
    ``PATH``, or ``auto``: the lookup of the Bazel Python toolchain
    (``rules/private/python_interpreter.bzl``) -- ``$FASTCI_PYTHON``,
    ``$VIRTUAL_ENV/bin/python3``, ``<root>/.venv/bin/python3`` -- then this process's
    interpreter (a pytest suite run with the planner's Python).

    Raises:
        FastCIError: a configured command is not on ``PATH``.
    """
    value = config.runner_python
    if value != "auto":
        if "/" in value:
            path = Path(value).expanduser()
            return str(path if path.is_absolute() else Path(root) / path)
        found = shutil.which(value)
        if found is None:
            raise FastCIError(f"runner_python {value!r} is not on PATH")
        return found
    if os.environ.get("FASTCI_PYTHON"):
        return os.environ["FASTCI_PYTHON"]
    if os.environ.get("VIRTUAL_ENV"):
        return os.path.join(os.environ["VIRTUAL_ENV"], "bin", "python3")
    venv = Path(root) / ".venv" / "bin" / "python3"
    return str(venv) if venv.exists() else sys.executable


def _environment(value: str | None | Callable[[], str], root: Path,
                 config: Config) -> tuple[str | None, dict[str, str] | None]:
    """The test runner's environment: (fingerprint, every part of it, or None).

    A caller's fingerprint (a string or a function) is all there is; otherwise the
    runner's interpreter describes itself, packages included, so evidence recorded in an
    environment that differs only in packages a test never imported stays usable.
    """
    if isinstance(value, str):
        return value, None
    try:
        if callable(value):
            return value(), None
        from fastci.evidence.record.environment import environment_of_interpreter

        env = environment_of_interpreter(runner_python(root, config), cwd=root)
        return env["fingerprint"], env
    except Exception as exc:  # noqa: BLE001 - unknown environment: every test re-runs
        LOG.warning("cannot compute the test runner's environment fingerprint: %s", exc)
        return None, None


def summarize(analysis: Analysis) -> list[str]:
    """The human summary ``fastci plan`` prints."""
    sel, plan = analysis.selection, analysis.plan
    n_sel, n_all = len(sel.selected), len(sel.decisions)
    if plan.mode == "all":
        lines = [f"fastci plan: all: every test runs at full workload ({n_all} known)"]
    else:
        lines = [f"fastci plan: {plan.mode}: {n_sel} of {n_all} tests selected, "
                 f"{n_all - n_sel} skipped ({sel.summary})"]
    if analysis.runner is not None:
        lines.append(f"  runner: {analysis.runner} ({analysis.runner_why})")
    lines.extend(_cost_lines(sel, analysis.timing, analysis.choices))
    reduced = sum(1 for d in sel.selected if (c := analysis.choices.get(d.test)) and c.reduced)
    if reduced:
        lines.append(f"  reduced: {reduced} of {n_sel} selected tests run at a reduced workload")
    for r in sel.widen:
        lines.append(f"  widened: {r.sentence}")
    for note in sel.notes:
        lines.append(f"  note: {note}")
    # Every reason a test has counts, not only its first: a test that both executes a
    # changed unit and failed last time shows under both (so the counts may add up to
    # more than the number of tests; the header says so when they do).
    # Decisions made alike share their reasons tuple (Decision.sharing: ~98,000 of
    # 100,000 at scale), so the kinds are counted per tuple.
    groups: dict[int, list[Any]] = {}
    for d in sel.decisions:
        group = groups.get(id(d.reasons))
        if group is None:
            groups[id(d.reasons)] = [d.reasons, 1]
        else:
            group[1] += 1
    by_kind: dict[str, int] = {}
    several = 0
    for reasons, n in groups.values():
        kinds = list(dict.fromkeys(r.kind.value for r in reasons)) or ["?"]
        several += n if len(kinds) > 1 else 0
        for key in kinds:
            by_kind[key] = by_kind.get(key, 0) + n
    if several:
        lines.append(f"  tests by reason ({several} with several reasons count under each):")
    for kind, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {n:4d}  {kind}")
    lines.append(f"  analysis took {analysis.elapsed_s:.2f} s")
    return lines


def _cost_lines(sel: Selection, timing: Mapping[TestId, Timing],
                choices: Mapping[TestId, Choice] | None = None) -> list[str]:
    """What the selected tests cost of all: GPU-seconds, measured test time, or both.

    A suite without GPU tests reports its recorded test time (GPU-seconds would be
    0.0 of 0.0); a mixed one reports both; a test never run counts as never timed.
    GPU-seconds are at the workloads the plan chose (:func:`planned_cost`); when some
    run reduced, the full-workload figure follows. "Of all" is every test at full workload.
    """
    choices = choices or {}
    n_sel = len(sel.selected)
    gpu_suite = any(timing[d.test].gpus > 0 for d in sel.decisions if d.test in timing)
    cpu_tests = any(timing[d.test].gpus <= 0 for d in sel.decisions if d.test in timing)
    lines = []
    if gpu_suite or not timing:  # no timing at all (a caller's own Analysis): the old estimate
        known = [x for d in sel.selected if (x := planned_cost(d, choices)) is not None]
        full = [d.est_gpu_s for d in sel.selected if d.est_gpu_s is not None]
        every = [d.est_gpu_s for d in sel.decisions if d.est_gpu_s is not None]
        unknown = n_sel - len(known)
        notes = ([f"at the planned workloads; {sum(full):.1f} at full workload"]
                 if sum(known) != sum(full) else []) \
            + ([f"+{unknown} tests never timed"] if unknown else [])
        lines.append(f"  estimated GPU-seconds: {sum(known):.1f} of {sum(every):.1f} for all"
                     + "".join(f" ({n})" for n in notes))
    if timing and (cpu_tests or not gpu_suite):
        def seconds(t: TestId) -> float | None:
            return timing[t].duration_s if t in timing else None

        chosen = [x for d in sel.selected if (x := seconds(d.test)) is not None]
        every_s = [x for d in sel.decisions if (x := seconds(d.test)) is not None]
        unknown = n_sel - len(chosen)
        kind = " (GPU and CPU tests)" if gpu_suite else " (CPU)" if cpu_tests else ""
        lines.append(f"  estimated test time: {sum(chosen):.1f} s of {sum(every_s):.1f} s{kind}"
                     + (f" (+{unknown} tests never timed)" if unknown else ""))
    return lines


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
            universe is the store's tests); None: config ``runner`` (:func:`choose_runner`).

    Returns:
        The effective config and the analysis (:func:`analyze`).
    """
    cfg = change_config(root, base=base, store=store, plan=plan, runner=runner, prune=prune,
                        granularity=granularity)
    return cfg, analyze(root, cfg, base=cfg.base, head=head or WORKTREE)
