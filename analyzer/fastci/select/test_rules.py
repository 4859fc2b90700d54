"""The selection rules' shared parts, and the rules about tests themselves.

Rules are small functions over the evidence store's read side; each returns
``{test: [Reason, ...]}`` (and, for path rules, plan-wide widenings). They never
remove a test: the selector takes the union of what they return. The rules that
follow a change into the evidence, test by test against each test's own
baseline, are in :mod:`fastci.select.change_rules`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from fastci.changes.scan import ChangeSet
from fastci.changes.semantic_diff import UnitChange
from fastci.config import Config
from fastci.evidence.record.files import sha256_file
from fastci.integrations.git.repository import shown
from fastci.select.decisions import DecisionKind, Reason
from fastci.types import (Checksum, ContextSig, RelPath, TestId, UnitId, is_failure,
                          is_tool_artifact)

LOG = logging.getLogger(__name__)

Hits = dict[TestId, list[Reason]]


class RunLike(Protocol):
    """What selection reads from a recorded run (``fastci.evidence.store.db.RunRecord``).

    ``workload`` is the declared (full) workload the run knew; ``overrides`` what
    the run changed of it (``{}``: full workload, ``None``: not known);
    ``last_full`` the test's newest run known to be at full workload.
    """

    # Read-only members (properties), so a frozen record such as ``RunRecord`` satisfies it.
    @property
    def commit(self) -> str | None: ...
    @property
    def env_fingerprint(self) -> str: ...
    @property
    def workload(self) -> Mapping[str, Any]: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def gpus(self) -> int: ...
    @property
    def outcome(self) -> str: ...
    @property
    def complete(self) -> bool: ...
    @property
    def overrides(self) -> Mapping[str, Any] | None: ...
    @property
    def environment(self) -> Mapping[str, Any]: ...

    @property
    def last_full(self) -> RunLike | None: ...


class EvidenceReader(Protocol):
    """The read side of the evidence store that planning and selection use (CONTRACTS.md).

    :class:`fastci.evidence.store.db.EvidenceStore` implements it; so must any double
    a test passes instead (there is no fallback for a missing method).
    """

    def test_ids(self) -> list[TestId]: ...
    def latest_runs(self) -> Mapping[TestId, RunLike]: ...
    def tests_for_units(self, units: Iterable[UnitId]) -> Mapping[UnitId, set[TestId]]: ...
    def tests_for_files(self, paths: Iterable[RelPath]) -> Mapping[RelPath, set[TestId]]: ...
    def tests_for_modules(self, paths: Iterable[RelPath]) -> Mapping[RelPath, set[TestId]]: ...
    def file_digests(self, paths: Iterable[RelPath] | None = None) -> \
        Iterable[tuple[RelPath, TestId, str]]: ...
    def evidence_commits(self) -> set[str | None]:
        """The commits the held evidence was recorded at (None: not known)."""
        ...
    def baselines(self) -> Mapping[TestId, str | None]:
        """Test -> the commit its held evidence was recorded at (None: not known)."""
        ...
    def recorded_units(self, *, paths: Iterable[RelPath] | None = None,
                       tests: Iterable[TestId] | None = None) -> \
            Iterable[tuple[TestId, UnitId, Checksum]]:
        """(test, unit, the checksum that test recorded) in ``paths`` or of ``tests``."""
        ...
    def source_digests(self, *, paths: Iterable[RelPath] | None = None,
                       tests: Iterable[TestId] | None = None) -> \
            Iterable[tuple[TestId, RelPath, str]]:
        """(test, Python path, the file's digest when that test was recorded)."""
        ...
    def tests_for_distributions(self, names: Iterable[str]) -> Mapping[str, set[TestId]]:
        """Distribution name -> tests whose evidence imported it."""
        ...
    def distributions_of_tests(self, tests: Iterable[TestId] | None = None) -> \
            Mapping[TestId, Mapping[str, str]]:
        """Test -> {distribution: version} its evidence imported."""
        ...
    def units_of_test(self, test: TestId) -> Mapping[UnitId, Sequence[ContextSig]]:
        """Unit id -> the contexts ``test`` exercised it in (for ``fastci explain``)."""
        ...


if TYPE_CHECKING:
    from fastci.evidence.store.db import EvidenceStore, RunRecord

    def _store_conforms(store: EvidenceStore, run: RunRecord) -> tuple[EvidenceReader, RunLike]:
        """Never called: mypy checks here that the real store fits the protocols."""
        return store, run


@dataclass(frozen=True)
class DeclaredTest:
    """A test as its build declares it (``bazel query``, or a pytest marker).

    Besides what selection needs (GPUs, workload, sources), the reduction
    declaration (issue 13): ``floors`` (how far each reducible dimension may shrink),
    ``frozen`` (dimensions never reduced; None: not declared, every dimension
    without a floor), ``scope`` (what the test validates), ``constraints``
    (expressions every run must satisfy), ``check`` and ``reference`` (None: not
    declared) and ``defaulted`` (which of them the build left to defaults). It
    satisfies :class:`fastci.plan.workload.ReductionDecl`.
    """

    id: TestId
    gpus: int = 0
    workload: Mapping[str, Any] | None = None
    srcs: tuple[RelPath, ...] = ()
    floors: Mapping[str, Any] = field(default_factory=dict)
    frozen: tuple[str, ...] | None = None
    scope: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    check: str | None = None
    reference: str | None = None
    defaulted: tuple[str, ...] = ()


def add_hit(hits: Hits, test: TestId, reason: Reason) -> None:
    """Add ``reason`` to ``test``'s reasons in ``hits``."""
    hits.setdefault(test, []).append(reason)


def ignored_read_rules(changes: ChangeSet, store: EvidenceReader,
                       seen: dict[RelPath, str | None] | None = None) -> Hits:
    """Recorded reads of files git does not track, compared with the disk now.

    Git-ignored inputs (downloaded data, tokenizer folders, generated goldens) never
    show in a diff: a test is selected when the digest it recorded differs from the
    file's current digest (same function as the recorder), or the file is gone.
    ``seen`` receives each such file's current digest (None: gone): the plan carries
    them, and runners re-check them (``Plan.inputs``).
    """
    hits: Hits = {}
    if changes.tree is None:
        return hits
    rows = list(store.file_digests())
    if not rows:
        return hits
    git = changes.tree.git
    tracked = git.tracked_files(changes.tree.head)
    now: dict[RelPath, str | None] = {}
    for path, test, digest in sorted(rows):
        if path in tracked:
            continue  # a diff sees it: the baseline rules compare it
        if is_tool_artifact(path):
            continue  # recorded before artifacts were left out: never an input
        if path not in now:
            local = git.root / path
            now[path] = sha256_file(local) if local.is_file() else None
        current = now[path]
        if seen is not None:
            seen[path] = current
        if current is not None and current == digest:
            continue
        state = "is gone" if current is None else "whose content differs from when it was recorded"
        add_hit(hits, test, Reason(
            DecisionKind.READ_CHANGED_FILE,
            f"read {shown(path)} (not tracked by git), {'which ' if current is None else ''}{state}",
            path=path, change="deleted" if current is None else "content changed",
            via="evidence: the recorded digest of an untracked file differs from the disk"))
    return hits


def kinds_of(u: UnitChange) -> str:
    """What happened to a changed unit, as a phrase (``function body changed``)."""
    return u.describe().split(": ", 1)[1]


def own_output(path: RelPath, config: Config) -> bool:
    """FastCI's own outputs (store, plan, caches, run logs) are never a change to the code.

    Everything under ``.fastci/`` is FastCI's, except its BUILD file (Bazel's view of the plan).
    """
    if path.startswith(".fastci/"):
        return not path.rsplit("/", 1)[-1].startswith("BUILD")
    return path in (config.store, config.plan) or path.startswith(f"{config.store}-")


def test_rules(universe: Iterable[TestId], runs: Mapping[TestId, RunLike],
               declared: Mapping[TestId, DeclaredTest] | None,
               src_changed: Callable[[TestId, RelPath], bool],
               evidence_tests: set[TestId]) -> Hits:
    """Always-select rules: no/incomplete evidence, failed last, new/modified test.

    (The environment is compared by :func:`fastci.select.manifest_rules.environment_rules`.)

    ``src_changed(test, path)`` says whether a declared source of the test changed
    (semantically, for Python) since the test's baseline.
    """
    hits: Hits = {}
    for test in sorted(universe):
        run = runs.get(test)
        decl = declared.get(test) if declared is not None else None
        if run is None or test not in evidence_tests:
            kind = DecisionKind.NEW_TEST if decl is not None else DecisionKind.NO_EVIDENCE
            add_hit(hits, test, Reason(kind, f"{test} has no recorded evidence"
                                    + (" (declared, never recorded)" if decl else ""),
                                    via="safety rule: a test without evidence is selected"))
            continue
        if not run.complete:
            # A recording that knows why it is partial says so (RunRecord.incomplete_reason).
            why = getattr(run, "incomplete_reason", "")
            add_hit(hits, test, Reason(DecisionKind.INCOMPLETE_EVIDENCE,
                                    f"its last recording is incomplete: {why}" if why
                                    else "its last recording did not complete",
                                    via="safety rule: incomplete evidence is selected"))
        # "Failed last" is kept per workload: the newest run failed (at any
        # workload), or the newest full-workload run did, whatever passed since at a
        # reduced (or unknown) workload: a reduced pass never clears a full failure.
        full = getattr(run, "last_full", None)
        if is_failure(run.outcome):
            add_hit(hits, test, Reason(DecisionKind.FAILED_LAST,
                                    f"its last run ended {run.outcome!r} {_at_workload(run)}",
                                    via="safety rule: a test that failed last time is selected"))
        elif full is not None and full is not run and is_failure(full.outcome):
            add_hit(hits, test, Reason(
                DecisionKind.FAILED_LAST,
                f"its last full-workload run ended {full.outcome!r}; the later pass was "
                f"{_at_workload(run)}, which does not clear it",
                via="safety rule: a test whose last full-workload run failed is selected"))
        if decl is not None:
            _declaration_reasons(hits, test, decl, run,
                                 {src for src in decl.srcs if src_changed(test, src)})
    return hits


def _declaration_reasons(hits: Hits, test: TestId, decl: DeclaredTest, run: RunLike,
                         changed_paths: set[RelPath]) -> None:
    # run.workload is the workload the run was *declared* with, never the reduced
    # one it ran at (run.overrides): a reduced run is not a modified test.
    if decl.workload is not None and dict(decl.workload) != dict(run.workload or {}):
        diff = sorted(k for k in set(decl.workload) | set(run.workload or {})
                      if decl.workload.get(k) != (run.workload or {}).get(k))
        add_hit(hits, test, Reason(DecisionKind.MODIFIED_TEST,
                                "its declared workload differs from the one declared at its last "
                                f"run ({', '.join(diff)})",
                                via="safety rule: a modified gpu_test declaration is selected"))
    if decl.gpus != run.gpus:
        add_hit(hits, test, Reason(DecisionKind.MODIFIED_TEST,
                                f"it now declares {decl.gpus} GPUs, recorded with {run.gpus}",
                                via="safety rule: a modified gpu_test declaration is selected"))
    for src in decl.srcs:
        if src in changed_paths:
            add_hit(hits, test, Reason(DecisionKind.MODIFIED_TEST, f"its source {src} changed",
                                    path=src, via="safety rule: a modified test is selected"))


def _at_workload(run: RunLike) -> str:
    """Where a run stood: ``at full workload``, ``at reduced workload a=1``, or unknown."""
    overrides = getattr(run, "overrides", None)
    if overrides is None:
        return "at a workload it did not record (not known to be the full one)"
    if not overrides:
        return "at full workload"
    return "at reduced workload " + ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))
