"""The selection rules: each maps a change (and the evidence) to reasons per test.

Rules are small functions over the evidence store's read side; each returns
``{test: [Reason, ...]}`` (and, for path rules, plan-wide widenings). They never
remove a test: the selector takes the union of what they return.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from fastci.changes.scan import ChangeSet, is_python
from fastci.changes.semantic_diff import ChangeKind, UnitChange
from fastci.config import Config, first_match, glob_match
from fastci.evidence.files import sha256_file
from fastci.changes.static_reach import ReachKind
from fastci.integrations.git.repository import shown
from fastci.select.decisions import DecisionKind, Reason
from fastci.types import Checksum, ContextSig, RelPath, TestId, UnitId

LOG = logging.getLogger(__name__)

Hits = dict[TestId, list[Reason]]


class RunLike(Protocol):
    """What selection reads from a recorded run (``fastci.evidence.store.RunRecord``).

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
    def last_full(self) -> RunLike | None: ...


class EvidenceReader(Protocol):
    """The read side of the evidence store that planning and selection use (CONTRACTS.md).

    :class:`fastci.evidence.store.EvidenceStore` implements it; so must any double
    a test passes instead (there is no fallback for a missing method).
    """

    def test_ids(self) -> list[TestId]: ...
    def latest_runs(self) -> Mapping[TestId, RunLike]: ...
    def tests_for_units(self, units: Iterable[UnitId]) -> Mapping[UnitId, set[TestId]]: ...
    def tests_for_files(self, paths: Iterable[RelPath]) -> Mapping[RelPath, set[TestId]]: ...
    def tests_for_modules(self, paths: Iterable[RelPath]) -> Mapping[RelPath, set[TestId]]: ...
    def file_digests(self, paths: Iterable[RelPath] | None = None) -> \
        Iterable[tuple[RelPath, TestId, str]]: ...
    def unit_checksums(self) -> Mapping[UnitId, Checksum]:
        """Unit id -> checksum when recorded (the change scan compares against it)."""
        ...
    def evidence_commits(self) -> set[str | None]:
        """The commits the held evidence was recorded at (None: not known)."""
        ...
    def units_of_test(self, test: TestId) -> Mapping[UnitId, Sequence[ContextSig]]:
        """Unit id -> the contexts ``test`` exercised it in (for ``fastci explain``)."""
        ...


if TYPE_CHECKING:
    from fastci.evidence.store import EvidenceStore, RunRecord

    def _store_conforms(store: EvidenceStore, run: RunRecord) -> tuple[EvidenceReader, RunLike]:
        """Never called: mypy checks here that the real store fits the protocols."""
        return store, run


@dataclass(frozen=True)
class DeclaredTest:
    """A test as its build declares it (from ``bazel query``)."""

    id: TestId
    gpus: int = 0
    workload: Mapping[str, Any] | None = None
    srcs: tuple[RelPath, ...] = ()


def _add(hits: Hits, test: TestId, reason: Reason) -> None:
    hits.setdefault(test, []).append(reason)


def unit_rules(changes: ChangeSet, store: EvidenceReader) -> Hits:
    """Changed units -> tests whose evidence executed them; import-time changes -> importers."""
    hits: Hits = {}
    direct = [u for u in changes.unit_changes if ChangeKind.ADDED not in u.kinds]
    recorded = store.tests_for_units(sorted({u.unit for u in direct}))
    for u in direct:
        for test in sorted(recorded.get(u.unit, ())):
            _add(hits, test, Reason(
                DecisionKind.CHANGED_UNIT, f"executes {u.unit}, whose {_kinds(u)}",
                unit=u.unit, change=_kinds(u), path=u.path,
                via=f"evidence: the test's recording executed {u.unit}"))
    by_module: dict[RelPath, UnitChange] = {}
    for u in direct:
        if u.import_time:
            by_module.setdefault(u.path, u)
    importers = store.tests_for_modules(sorted(by_module))
    for path, u in sorted(by_module.items()):
        for test in sorted(importers.get(path, ())):
            if any(r.unit == u.unit for r in hits.get(test, ())):
                continue
            _add(hits, test, Reason(
                DecisionKind.IMPORTS_CHANGED_MODULE,
                f"its evidence touches {path}, where {u.qualname} {_kinds(u)} "
                "(acts at import time)",
                unit=u.unit, change=_kinds(u), path=path,
                via="static rule: an import-time change reaches every test whose evidence "
                    "touches the module"))
    broken = sorted(f.path for f in changes.failures)
    if broken:
        touching = _merge(store.tests_for_modules(broken), store.tests_for_files(broken))
        for f in changes.failures:
            for test in sorted(touching.get(f.path, ())):
                _add(hits, test, Reason(
                    DecisionKind.UNPARSABLE_FILE, f"touches {f.path}, which does not parse",
                    change=f.failure, path=f.path,
                    via="static rule: a file that does not parse widens to every test touching it"))
    return hits


def static_rules(changes: ChangeSet, store: EvidenceReader) -> Hits:
    """Changes evidence cannot see: compiled code, new/deleted files and names (static_reach)."""
    hits: Hits = {}
    compiled = {u.path: u for u in changes.unit_changes if ChangeKind.COMPILED in u.kinds}
    touching = store.tests_for_modules(sorted(compiled))
    for path, u in sorted(compiled.items()):
        for test in sorted(touching.get(path, ())):
            _add(hits, test, Reason(
                DecisionKind.COMPILED_CODE,
                f"its evidence touches {path}, where {u.qualname} changed and is compiled or "
                f"traced ({u.detail}): compiled code never produces Python line events, so no "
                "evidence records which tests run it", unit=u.unit, change=_kinds(u), path=path,
                via="static rule: a change to compiled code reaches every test whose evidence "
                    "touches its module"))
    by_unit = store.tests_for_units(sorted({r.unit for r in changes.reach if r.unit}))
    by_module = store.tests_for_modules(sorted({r.module for r in changes.reach if r.module}))
    for r in changes.reach:
        tests = by_unit.get(r.unit, set()) if r.unit else by_module.get(r.module or "", set())
        for test in sorted(tests):
            if r.unit and r.kind is ReachKind.COMPILED:
                reason = Reason(
                    DecisionKind.COMPILED_CODE,
                    f"executes {r.unit}, a caller of compiled {r.change}: compiled code never "
                    "produces Python line events, so evidence cannot see the call",
                    unit=r.changed_unit, change=r.change, path=r.path,
                    via=f"static rule: {r.how}")
            else:
                reason = Reason(
                    DecisionKind.STATIC_REACH,
                    f"its evidence touches {r.module or r.unit}, which {r.kind.value}: "
                    f"{r.change} ({r.how})", unit=r.changed_unit, change=r.change, path=r.path,
                    via=f"static rule: {r.how}")
            if reason not in hits.get(test, ()):
                _add(hits, test, reason)
    return hits


def ignored_read_rules(changes: ChangeSet, store: EvidenceReader) -> Hits:
    """Recorded reads of files git does not track, compared with the disk now.

    Git-ignored inputs (downloaded data, tokenizer folders, generated goldens) never
    show in a diff: a test is selected when the digest it recorded differs from the
    file's current digest (same function as the recorder), or the file is gone.
    """
    hits: Hits = {}
    if changes.tree is None:
        return hits
    rows = list(store.file_digests())
    if not rows:
        return hits
    git = changes.tree.git
    tracked = git.tracked_files(changes.tree.head)
    seen = set(changes.paths)  # already a changed path: path_rules says so
    now: dict[RelPath, str | None] = {}
    for path, test, digest in sorted(rows):
        if path in tracked or path in seen:
            continue
        if path not in now:
            local = git.root / path
            now[path] = sha256_file(local) if local.is_file() else None
        current = now[path]
        if current is not None and current == digest:
            continue
        state = "is gone" if current is None else "whose content differs from when it was recorded"
        _add(hits, test, Reason(
            DecisionKind.READ_CHANGED_FILE,
            f"read {shown(path)} (not tracked by git), {'which ' if current is None else ''}{state}",
            path=path, change="deleted" if current is None else "content changed",
            via="evidence: the recorded digest of an untracked file differs from the disk"))
    return hits


def _kinds(u: UnitChange) -> str:
    return u.describe().split(": ", 1)[1]


def _merge(*maps: Mapping[RelPath, set[TestId]]) -> dict[RelPath, set[TestId]]:
    out: dict[RelPath, set[TestId]] = defaultdict(set)
    for m in maps:
        for k, v in m.items():
            out[k] |= set(v)
    return out


def path_rules(changes: ChangeSet, store: EvidenceReader, config: Config,
               universe: Iterable[TestId]) -> tuple[Hits, list[Reason], list[str]]:
    """Changed paths -> tests (recorded reads, ``path_tests``) or plan-wide widening."""
    hits: Hits = {}
    widen: list[Reason] = []
    notes: list[str] = []
    tests = sorted(universe)
    paths = changes.paths
    readers = store.tests_for_files([p for p in paths if not is_python(p)])
    for path in paths:
        if own_output(path, config):
            continue
        rule = first_match(path, config.run_all)
        if rule is not None:
            widen.append(Reason(DecisionKind.RUN_ALL_PATH,
                                f"{shown(path)} changed and matches run_all {rule!r}: everything runs",
                                path=path, via=f"fastci.yaml run_all: {rule}"))
            continue
        matched = is_python(path)  # Python is analysed unit by unit
        for glob, test_globs in config.path_tests:
            if glob_match(path, glob):
                matched = True
                for test in tests:
                    if any(fnmatch.fnmatchcase(test, g) for g in test_globs):
                        _add(hits, test, Reason(
                            DecisionKind.PATH_RULE, f"{shown(path)} changed and fastci.yaml maps {glob!r} "
                            "to it", path=path, via=f"fastci.yaml path_tests: {glob}"))
        for test in sorted(readers.get(path, ())):
            matched = True
            _add(hits, test, Reason(DecisionKind.READ_CHANGED_FILE, f"read {shown(path)}, which changed",
                                    path=path, via="evidence: the test's recording read the file"))
        if matched:
            continue
        rule = first_match(path, config.ignore)
        if rule is not None:
            notes.append(f"{shown(path)}: ignored (fastci.yaml ignore {rule!r})")
            continue
        widen.append(Reason(DecisionKind.UNKNOWN_PATH,
                            f"{shown(path)} changed: no test recorded reading it and no rule in "
                            "fastci.yaml maps it, so everything runs", path=path,
                            via="safety rule: an unknown path widens to every test"))
    return hits, widen, notes


def own_output(path: RelPath, config: Config) -> bool:
    """FastCI's own outputs (store, plan, caches, run logs) are never a change to the code.

    Everything under ``.fastci/`` is FastCI's, except its BUILD file (Bazel's view of the plan).
    """
    if path.startswith(".fastci/"):
        return not path.rsplit("/", 1)[-1].startswith("BUILD")
    return path in (config.store, config.plan) or path.startswith(f"{config.store}-")


def test_rules(universe: Iterable[TestId], runs: Mapping[TestId, RunLike],
               declared: Mapping[TestId, DeclaredTest] | None, env_fingerprint: str | None,
               changes: ChangeSet, evidence_tests: set[TestId]) -> Hits:
    """Always-select rules: no/incomplete evidence, failed last, new/modified test, environment."""
    hits: Hits = {}
    changed_paths = {f.path for f in changes.files if f.units or f.failure} | \
        {f.old_path for f in changes.files if f.old_path}
    for test in sorted(universe):
        run = runs.get(test)
        decl = declared.get(test) if declared is not None else None
        if run is None or test not in evidence_tests:
            kind = DecisionKind.NEW_TEST if decl is not None else DecisionKind.NO_EVIDENCE
            _add(hits, test, Reason(kind, f"{test} has no recorded evidence"
                                    + (" (declared, never recorded)" if decl else ""),
                                    via="safety rule: a test without evidence is selected"))
            continue
        if not run.complete:
            _add(hits, test, Reason(DecisionKind.INCOMPLETE_EVIDENCE,
                                    "its last recording did not complete",
                                    via="safety rule: incomplete evidence is selected"))
        # "Failed last" is kept per workload: the newest run failed (at any
        # workload), or the newest full-workload run did, whatever passed since at a
        # reduced (or unknown) workload: a reduced pass never clears a full failure.
        full = getattr(run, "last_full", None)
        if run.outcome != "passed":
            _add(hits, test, Reason(DecisionKind.FAILED_LAST,
                                    f"its last run ended {run.outcome!r} {_at_workload(run)}",
                                    via="safety rule: a test that failed last time is selected"))
        elif full is not None and full is not run and full.outcome != "passed":
            _add(hits, test, Reason(
                DecisionKind.FAILED_LAST,
                f"its last full-workload run ended {full.outcome!r}; the later pass was "
                f"{_at_workload(run)}, which does not clear it",
                via="safety rule: a test whose last full-workload run failed is selected"))
        if env_fingerprint is None or run.env_fingerprint != env_fingerprint:
            now = env_fingerprint or "unknown"
            _add(hits, test, Reason(
                DecisionKind.ENVIRONMENT_CHANGED,
                f"recorded in environment {run.env_fingerprint or 'unknown'}, now {now} "
                "(Python, packages incl. torch/CUDA, or GPU differ)",
                via="safety rule: a changed environment invalidates evidence"))
        if decl is not None:
            _declaration_reasons(hits, test, decl, run, changed_paths)
    return hits


def _declaration_reasons(hits: Hits, test: TestId, decl: DeclaredTest, run: RunLike,
                         changed_paths: set[RelPath]) -> None:
    # run.workload is the workload the run was *declared* with, never the reduced
    # one it ran at (run.overrides): a reduced run is not a modified test.
    if decl.workload is not None and dict(decl.workload) != dict(run.workload or {}):
        diff = sorted(k for k in set(decl.workload) | set(run.workload or {})
                      if decl.workload.get(k) != (run.workload or {}).get(k))
        _add(hits, test, Reason(DecisionKind.MODIFIED_TEST,
                                "its declared workload differs from the one declared at its last "
                                f"run ({', '.join(diff)})",
                                via="safety rule: a modified gpu_test declaration is selected"))
    if decl.gpus != run.gpus:
        _add(hits, test, Reason(DecisionKind.MODIFIED_TEST,
                                f"it now declares {decl.gpus} GPUs, recorded with {run.gpus}",
                                via="safety rule: a modified gpu_test declaration is selected"))
    for src in decl.srcs:
        if src in changed_paths:
            _add(hits, test, Reason(DecisionKind.MODIFIED_TEST, f"its source {src} changed",
                                    path=src, via="safety rule: a modified test is selected"))


def _at_workload(run: RunLike) -> str:
    """Where a run stood: ``at full workload``, ``at reduced workload a=1``, or unknown."""
    overrides = getattr(run, "overrides", None)
    if overrides is None:
        return "at a workload it did not record (not known to be the full one)"
    if not overrides:
        return "at full workload"
    return "at reduced workload " + ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))
