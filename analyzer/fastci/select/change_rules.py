"""Change rules that compare every test with its own baseline.

A store filled over many commits (a CI that records what ran on every merge, a
local re-run, a lost shard) holds evidence of different ages. Each test's
evidence describes the code as *its* recording saw it: the checksum of every unit
it executed, the digest of every Python file and data file it opened, and the
commit it ran at. A test is affected by a change when something it depends on
differs from that baseline now; never because another test's baseline differs.

* **Units it executed**: the checksum it recorded differs from the head's (or the
  unit is gone).
* **Import-time code of a module it touches** (module statements, decorators,
  class bodies, signatures): the diff from the version of the file it recorded
  (found by digest at the commits that may hold it) to the head has an
  import-time change. A version the history does not hold (recorded from a
  modified tree) counts as changed.
* **Compiled or traced code**, a file that no longer parses: as above, per module.
* **Changed functions no recording executed** (:mod:`fastci.select.unseen`): the tests
  that run the module's other code, at full workload.
* **Static reach** (new, deleted and newly named modules): when the reached path
  changed since the test's commit.
* **Files it read**: the digest it recorded differs from the head's.
* **Dependency manifests** (:mod:`fastci.select.manifest_rules`): the manifest as
  of the test's commit against the head; a changed requirement selects the tests
  that imported that distribution.
* **Paths no test reads** (configured ``run_all``, unknown paths, ``path_tests``):
  when the path changed since the test's commit. A path changed since every
  baseline widens the whole plan, as before.

Evidence with no known baseline commit is compared file by file with what it
recorded, against every change the scan saw (the safe side).
"""

from __future__ import annotations

import fnmatch
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from fastci.changes.names import NARROWABLE, NameReach, narrow
from fastci.changes.scan import ChangeSet, is_python
from fastci.changes.semantic_diff import ChangeKind, FileDiff, UnitChange
from fastci.changes.compiled_code import Compiled
from fastci.changes.static_reach import ReachKind
from fastci.changes.versions import Versions
from fastci.config import Config, first_match, glob_match
from fastci.integrations.git.repository import FileChange, shown
from fastci.select.compiled import compiled_of, compiled_reason
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.own_code import in_test_code
from fastci.select.manifest_rules import manifest_rules
from fastci.select.test_rules import EvidenceReader, Hits, add_hit, kinds_of, own_output
from fastci.select.unseen import unseen_code_rules
from fastci.types import Checksum, RelPath, TestId, UnitId

LOG = logging.getLogger(__name__)


def _paths(changes: Iterable[FileChange]) -> frozenset[RelPath]:
    return frozenset(p for ch in changes for p in (ch.path, ch.old_path) if p)


@dataclass(frozen=True)
class Baselines:
    """Which paths may differ from each test's evidence.

    ``commits`` maps a test with evidence to the commit it was recorded at; a test
    whose commit is not in ``since`` has no known baseline (``None`` from
    :meth:`changed_since`), and every path the scan saw change is a candidate.
    """

    commits: Mapping[TestId, str | None]
    since: Mapping[str, frozenset[RelPath]]
    everything: frozenset[RelPath]

    @classmethod
    def of(cls, changes: ChangeSet, commits: Mapping[TestId, str | None]) -> Baselines:
        """The baselines of the tests in ``commits`` for ``changes``."""
        since = {c: _paths(chs) for c, chs in changes.since.items()}
        everything = frozenset(changes.paths).union(*since.values())
        return cls(commits, since, everything)

    def changed_since(self, test: TestId) -> frozenset[RelPath] | None:
        """Paths that differ between the test's commit and the head; None: not known."""
        return self.since.get(self.commits.get(test) or "")

    def candidates(self, test: TestId) -> frozenset[RelPath]:
        """Paths that may differ from what the test saw (every changed one when unknown)."""
        known = self.changed_since(test)
        return self.everything if known is None else known

    def unknown(self) -> set[TestId]:
        """Tests with evidence but no known baseline commit."""
        return {t for t, c in self.commits.items() if (c or "") not in self.since}

    def src_changed(self, changes: ChangeSet, versions: Versions, test: TestId,
                    path: RelPath) -> bool:
        """Whether ``path`` changed since the test's baseline: semantically for Python
        (a comment is no change), by content otherwise."""
        if path not in self.candidates(test):
            return False
        if not is_python(path):
            return True
        commit = self.commits.get(test) or ""
        if commit in self.since:
            fd = versions.diff(path, versions.at(commit, path))
        else:
            found = [f for f in changes.files if path in (f.path, f.old_path)]
            if not found:
                return True  # unknown baseline and not in the base diff: assume it changed
            fd = found[0]
        return bool(fd.units or fd.failure)


def change_rules(changes: ChangeSet, store: EvidenceReader, config: Config,
                 universe: Iterable[TestId], base: Baselines | None = None,
                 versions: Versions | None = None) -> tuple[Hits, list[Reason], list[str]]:
    """Every change rule, per test against its baseline: (hits, plan-wide widenings, notes)."""
    versions = versions or changes.versions
    if versions is None:
        if changes.tree is None:
            raise ValueError("a ChangeSet without a tree cannot be compared with baselines")
        versions = Versions(changes.tree.git, changes.tree.head)
    base = base or Baselines.of(changes, store.baselines())
    hits: Hits = {}
    _unit_rules(hits, changes, store, base, versions, config)
    _reach_rules(hits, changes, store, base)
    _read_rules(hits, store, base, versions)
    widen, notes = _path_rules(hits, changes, store, config, base, sorted(universe))
    return hits, widen, notes


# ---------------------------------------------------------------------- Python files


def _unit_rules(hits: Hits, changes: ChangeSet, store: EvidenceReader, base: Baselines,
                versions: Versions, config: Config) -> None:
    """Units executed, import-time code, compiled code and parse failures, per test.

    The (test, file) pairs whose recorded version differs from the head are grouped
    by that version (its digest, else the commit it was recorded at): each group is
    diffed once, and only the changed units are looked up in the evidence. An
    import-time change that only (re)binds names is resolved to the units that use
    them (:func:`fastci.changes.names.narrow`), once per group.
    """
    grouped = _version_groups(store, base, versions)
    diffs = _diff_groups(grouped, changes, versions, config)
    changed_units = {u.unit for fd in diffs.diffs.values() if fd is not None for u in fd.units
                     if ChangeKind.ADDED not in u.kinds}
    users = {u for by_unit in diffs.narrowed.values() for r in by_unit.values() if r
             for u in r.units}
    users |= {w for by_unit in diffs.compiled.values() for c in by_unit.values()
              for w in c.witnesses}
    executed = store.tests_for_units(sorted(changed_units | users))
    runs = store.latest_runs() if diffs.compiled else {}
    base_diffs = {f.path: f for f in changes.files}
    for (path, key), members in sorted(grouped.groups.items()):
        fd = diffs.diffs[(path, key)]
        if fd is not None:
            narrowed = diffs.narrowed.get((path, key), {})
            for test in members:
                _executed(hits, test, path, fd, executed, narrowed)
                # A failure to parse widens here too.
                _import_time(hits, test, path, fd, narrowed, executed,
                             (diffs.compiled.get((path, key), {}), runs.get(test)))
        elif versions.checksums_now(path) is None:
            for test in members:
                add_hit(hits, test, Reason(
                    DecisionKind.UNPARSABLE_FILE, f"touches {path}, which does not parse",
                    path=path, change="does not parse",
                    via="static rule: a file that does not parse widens to every test touching "
                        "it"))
        else:
            _unknown_versions(hits, store, versions, path, members, base_diffs.get(path),
                              {t: grouped.digests.get((t, path)) for t in members})
    # Last: a test another rule already selected for the same unit needs no second reason.
    unseen_code_rules(hits, grouped.groups, diffs.diffs, executed, store, versions)


#: A (path, version) group: the path and ``digest:<sha>``, ``commit:<sha>`` or ``unknown``.
GroupKey = tuple[RelPath, str]


@dataclass(frozen=True)
class _Grouped:
    """The (test, file) pairs whose recorded version may differ from the head, grouped by
    that version (``groups``); each pair's recorded digest (``digests``), and the baseline
    commits of the tests that recorded each (path, digest) (``holders``: where to look
    for that version)."""

    groups: dict[GroupKey, list[TestId]]
    digests: dict[tuple[TestId, RelPath], str]
    holders: dict[tuple[RelPath, str], set[str]]


def _version_groups(store: EvidenceReader, base: Baselines, versions: Versions) -> _Grouped:
    """Every Python file a test touched, grouped by the version the test recorded; a file
    it ran byte for byte as the head has it is left out."""
    python = sorted(p for p in base.everything if is_python(p))
    unknown = base.unknown()
    touching = {p: set(ts) for p, ts in store.tests_for_modules(python).items()}
    digests: dict[tuple[TestId, RelPath], str] = {}
    holders: dict[tuple[RelPath, str], set[str]] = defaultdict(set)
    for test, path, seen in store.source_digests(paths=python, tests=unknown):
        digests[(test, path)] = seen
        touching.setdefault(path, set()).add(test)
        held_at = base.commits.get(test) or ""
        if seen and held_at in base.since:
            holders[(path, seen)].add(held_at)
    if unknown:  # no baseline commit: every file their evidence touches is compared
        for test, uid, _ in store.recorded_units(tests=unknown):
            touching.setdefault(uid.partition("::")[0], set()).add(test)
    groups: dict[GroupKey, list[TestId]] = defaultdict(list)
    for path, tests in sorted(touching.items()):
        now_digest = versions.digest_now(path)
        for test in sorted(tests):
            if test not in unknown and path not in base.candidates(test):
                continue
            digest = digests.get((test, path))
            commit = base.commits.get(test) or ""
            if digest:
                if digest == now_digest:
                    continue  # byte for byte the file the test ran
                groups[(path, f"digest:{digest}")].append(test)
            elif digest is None and commit in base.since:
                groups[(path, f"commit:{commit}")].append(test)
            else:
                groups[(path, "unknown")].append(test)
    return _Grouped(groups, digests, holders)


@dataclass(frozen=True)
class _GroupDiffs:
    """Per group: the diff from its version to the head (None: the version is not found),
    the units that use each name an import-time change (re)binds, and the compiled units."""

    diffs: dict[GroupKey, FileDiff | None]
    narrowed: dict[GroupKey, dict[UnitId, NameReach | None]]
    compiled: dict[GroupKey, dict[UnitId, Compiled]]


def _diff_groups(grouped: _Grouped, changes: ChangeSet, versions: Versions,
                 config: Config) -> _GroupDiffs:
    """Each group's version found (by digest at the commits that may hold it, or at its
    commit) and diffed once against the head."""
    out = _GroupDiffs({}, {}, {})
    for (path, key) in grouped.groups:
        old: bytes | None = None
        found = False
        kind, _, value = key.partition(":")
        if kind == "digest":
            revs = sorted(grouped.holders[(path, value)]) + [changes.base]
            old = versions.find(path, value, revs)
            found = old is not None
        elif kind == "commit":
            old, found = versions.at(value, path), True
        out.diffs[(path, key)] = fd = versions.diff(path, old) if found else None
        if fd is not None and not fd.failure:
            out.narrowed[(path, key)] = _narrow(fd, old, versions.now(path), changes, config)
            out.compiled[(path, key)] = compiled_of(fd, old, versions)
    return out


def _executed(hits: Hits, test: TestId, path: RelPath, fd: FileDiff,
              executed: Mapping[UnitId, set[TestId]],
              narrowed: Mapping[UnitId, NameReach | None]) -> None:
    """Units the test executed that changed between its version of ``path`` and the head.

    The semantic diff decides, as for any diff: a unit whose checksum moved only
    because a new definition joined its scope did not change for this test. Module
    code resolved to the names it binds is left to :func:`_import_time` (every test
    that imports the module executes it).
    """
    for u in fd.units:
        if narrowed.get(u.unit) is not None:
            continue
        if ChangeKind.DOCTEST in u.kinds and test.startswith(f"{path}::"):
            # A doctest item of this module (pytest --doctest-modules names it
            # ``path::module.qualname``) runs the docstring's examples, which need
            # not execute the unit itself: a test collected from the file counts.
            add_hit(hits, test, Reason(
                DecisionKind.CHANGED_UNIT, f"is collected from {path}, whose {u.unit} "
                f"{ChangeKind.DOCTEST.value}", unit=u.unit, change=ChangeKind.DOCTEST.value,
                path=path, via="evidence: a doctest's examples are code its test runs"))
            continue
        if ChangeKind.ADDED not in u.kinds and test in executed.get(u.unit, ()):
            change = kinds_of(u)
            add_hit(hits, test, Reason(
                DecisionKind.CHANGED_UNIT, f"executes {u.unit}, whose {change}",
                unit=u.unit, change=change, path=path,
                via=f"evidence: the test's recording executed {u.unit}; diffed from the "
                    "version of the file it recorded"))


def _unknown_versions(hits: Hits, store: EvidenceReader, versions: Versions, path: RelPath,
                      tests: list[TestId], fallback: FileDiff | None,
                      digests: Mapping[TestId, str | None]) -> None:
    """Tests whose version of ``path`` the history does not hold: every recorded checksum
    that differs from the head's counts, and so does any import-time code."""
    now = versions.checksums_now(path) or {}
    now_digest = versions.digest_now(path)
    recorded: dict[TestId, dict[UnitId, Checksum]] = defaultdict(dict)
    for test, uid, checksum in store.recorded_units(paths=[path], tests=None):
        if test in digests:
            recorded[test][uid] = checksum
    for test in tests:
        for uid, checksum in sorted(recorded[test].items()):
            current = now.get(uid)
            if current is not None and current == checksum:
                continue
            change = ChangeKind.DELETED.value if current is None else ChangeKind.STALE.value
            add_hit(hits, test, Reason(
                DecisionKind.CHANGED_UNIT, f"executes {uid}, whose {change}", unit=uid,
                change=change, path=path,
                via=f"evidence: the test's recording executed {uid} (checksum "
                    f"{checksum[:8] or 'unknown'}, now {current[:8] if current else 'gone'})"))
        if digests[test] != now_digest or fallback is not None:
            _unknown_version(hits, test, path, fallback)


def _narrow(fd: FileDiff, old: bytes | None, new: bytes | None, changes: ChangeSet,
            config: Config) -> dict[UnitId, NameReach | None]:
    """The import-time changes of ``fd`` that only rebind names, resolved to their users."""
    out: dict[UnitId, NameReach | None] = {}
    for u in fd.units:
        if u.import_time and u.kinds and all(k in NARROWABLE for k in u.kinds):
            try:
                out[u.unit] = narrow(u, old, new, changes.tree, pure=config.pure_callables)
            except Exception as exc:  # noqa: BLE001 - narrowing is an optimisation: widen
                LOG.warning("import-time change of %s stays module-wide: %s: %s",
                            fd.path, type(exc).__name__, exc)
                out[u.unit] = None
    return out


def _import_time(hits: Hits, test: TestId, path: RelPath, fd: FileDiff,
                 narrowed: Mapping[UnitId, NameReach | None] | None = None,
                 executed: Mapping[UnitId, set[TestId]] | None = None,
                 compiled: tuple[Mapping[UnitId, Compiled], Any] | None = None) -> None:
    """Import-time code of ``path`` changed between the test's version and the head.

    A change resolved to the names it binds (``narrowed``) reaches the test only when
    it executed a unit that uses one of them; any other reaches it module-wide.
    Compiled code (``compiled``: how each unit is compiled, and the test's run) reaches
    it as :func:`fastci.select.compiled.compiled_reason` says.
    """
    if fd.failure:
        add_hit(hits, test, Reason(
            DecisionKind.UNPARSABLE_FILE, f"touches {path}, which does not parse",
            path=path, change=fd.failure,
            via="static rule: a file that does not parse widens to every test touching it"))
        return
    selected = {r.unit for r in hits.get(test, ()) if r.kind is DecisionKind.CHANGED_UNIT}
    for u in fd.units:
        if ChangeKind.COMPILED in u.kinds:
            how, run = compiled or ({}, None)
            reason = compiled_reason(test, path, u, how.get(u.unit), run, executed or {})
            if reason is not None:
                add_hit(hits, test, reason)
        elif u.import_time and u.unit not in selected and ChangeKind.ADDED not in u.kinds:
            reach = (narrowed or {}).get(u.unit)
            if reach is not None:
                users = [x for x in reach.units if test in (executed or {}).get(x, ())]
                if users:
                    add_hit(hits, test, Reason(
                        DecisionKind.USES_CHANGED_NAME,
                        f"executes {users[0]}, which uses {', '.join(reach.names)} "
                        f"(rebound at import time in {path}: {kinds_of(u)})",
                        unit=users[0], change=kinds_of(u), path=path,
                        via=f"static rule: the change {reach.why}; evidence: the test "
                            f"executed {len(users)} of them"))
                continue
            add_hit(hits, test, Reason(
                DecisionKind.IMPORTS_CHANGED_MODULE,
                f"its evidence touches {path}, where {u.qualname} {kinds_of(u)} "
                "(acts at import time)", unit=u.unit, change=kinds_of(u), path=path,
                via="static rule: an import-time change reaches every test whose evidence "
                    "touches the module"))


def _unknown_version(hits: Hits, test: TestId, path: RelPath, fallback: FileDiff | None) -> None:
    """The test's version of ``path`` is not in the history: any import-time change counts."""
    add_hit(hits, test, Reason(
        DecisionKind.IMPORTS_CHANGED_MODULE,
        f"its evidence of {path} was recorded from a version the history does not hold "
        "(a modified tree or an unknown commit), and the file differs from it now",
        path=path, change=ChangeKind.STALE.value,
        via="safety rule: import-time code of an unknown version counts as changed"))
    if fallback is not None and fallback.failure:
        _import_time(hits, test, path, fallback)


def _reach_rules(hits: Hits, changes: ChangeSet, store: EvidenceReader,
                 base: Baselines) -> None:
    """New, deleted and newly named modules; callers of compiled code (static reach)."""
    by_unit = store.tests_for_units(sorted({r.unit for r in changes.reach if r.unit}))
    by_module = store.tests_for_modules(sorted({r.module for r in changes.reach if r.module}))
    for r in changes.reach:
        tests = by_unit.get(r.unit, set()) if r.unit else by_module.get(r.module or "", set())
        views = changes.reach_views.get(r)
        for test in sorted(tests):
            if r.path not in base.candidates(test):
                continue  # the test's own recording already saw this change
            commit = base.commits.get(test) or ""
            if views is not None and commit in base.since and commit not in views:
                continue  # new (deleted, named) since another baseline, not since this one
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
                add_hit(hits, test, reason)


# ---------------------------------------------------------------------- other files


def _read_rules(hits: Hits, store: EvidenceReader, base: Baselines, versions: Versions) -> None:
    """Tracked files a test read whose digest differs from the one it recorded."""
    paths = sorted(p for p in base.everything if not is_python(p))
    for path, test, digest in store.file_digests(paths):
        if path not in base.candidates(test):
            continue
        now = versions.digest_now(path)
        if now is not None and now == digest:
            continue
        gone = now is None
        add_hit(hits, test, Reason(
            DecisionKind.READ_CHANGED_FILE,
            f"read {shown(path)}, which {'is gone' if gone else 'changed since it was recorded'}",
            path=path, change="deleted" if gone else "content changed",
            via="evidence: the test's recording read the file"))


def _path_rules(hits: Hits, changes: ChangeSet, store: EvidenceReader, config: Config,
                base: Baselines, tests: list[TestId]) -> tuple[list[Reason], list[str]]:
    """Changed paths no evidence reads: ``run_all``, manifests, ``path_tests``, ``ignore``,
    repository metadata, unknown."""
    manifests = manifest_rules(changes, store, config, base.commits)
    for test, reasons in manifests.hits.items():
        for reason in reasons:
            add_hit(hits, test, reason)
    widen: list[Reason] = list(manifests.widen)
    notes: list[str] = list(manifests.notes)
    _python_path_rules(hits, widen, config, base)
    paths = sorted(p for p in base.everything if not is_python(p))
    readers = store.tests_for_files(paths)
    evidence_tests = sorted(base.commits)
    n_tests = len(evidence_tests)
    for path in paths:
        if own_output(path, config):
            continue
        reached = [t for t in evidence_tests if path in base.candidates(t)]
        rule = first_match(path, config.run_all)
        if rule is not None:
            _widen(hits, widen, reached, n_tests, _run_all_reason(path, rule),
                   rule=f"run_all {rule!r}")
            continue
        mapped = _path_tests_rules(hits, path, config, base, tests, reached)
        if readers.get(path) or path in manifests.handled or mapped:
            continue
        rule = first_match(path, config.ignore)
        if rule is not None:
            notes.append(f"{shown(path)}: ignored (fastci.yaml ignore {rule!r})")
            continue
        _widen(hits, widen, reached, n_tests, Reason(
            DecisionKind.UNKNOWN_PATH,
            f"{shown(path)} changed: no test recorded reading it and no rule in fastci.yaml "
            "maps it, so everything runs", path=path,
            via="safety rule: an unknown path widens to every test"), rule="an unknown path")
    return widen, notes


def _python_path_rules(hits: Hits, widen: list[Reason], config: Config, base: Baselines) -> None:
    """Changed Python files no evidence can name (FastCI's own in-test code) or that a
    person marked ``run_all`` (setup.py, conftest.py, build scripts): everything runs."""
    evidence_tests = sorted(base.commits)
    for path in sorted(p for p in base.everything if is_python(p)):
        own = in_test_code(path)
        if own is not None:  # no evidence can name it: core (fastci.select.own_code)
            reached = [t for t in evidence_tests if path in base.candidates(t)]
            _widen(hits, widen, reached, len(evidence_tests), Reason(
                DecisionKind.RUN_ALL_PATH,
                f"{shown(path)} changed: FastCI's own code that runs inside every test "
                f"process ({own}): everything runs", path=path,
                via="core rule: FastCI's in-test code (launcher, recorder, pytest plugin)"),
                rule="FastCI's in-test code")
            continue
        rule = first_match(path, config.run_all)
        if rule is not None:
            reached = [t for t in evidence_tests if path in base.candidates(t)]
            _widen(hits, widen, reached, len(evidence_tests), _run_all_reason(path, rule),
                   rule=f"run_all {rule!r}")


def _run_all_reason(path: RelPath, rule: str) -> Reason:
    return Reason(DecisionKind.RUN_ALL_PATH,
                  f"{shown(path)} changed and matches run_all {rule!r}: everything runs",
                  path=path, via=f"fastci.yaml run_all: {rule}")


def _path_tests_rules(hits: Hits, path: RelPath, config: Config, base: Baselines,
                      tests: list[TestId], reached: list[TestId]) -> bool:
    """The tests ``path_tests`` maps ``path`` to (those recorded before it changed, or with
    no baseline); whether any ``path_tests`` glob matches it."""
    matched = False
    for glob, test_globs in config.path_tests:
        if glob_match(path, glob):
            matched = True
            since = set(reached)
            for test in tests:
                if (test in since or test not in base.commits) and \
                        any(fnmatch.fnmatchcase(test, g) for g in test_globs):
                    add_hit(hits, test, Reason(
                        DecisionKind.PATH_RULE, f"{shown(path)} changed and fastci.yaml maps "
                        f"{glob!r} to it", path=path, via=f"fastci.yaml path_tests: {glob}"))
    return matched


def _widen(hits: Hits, widen: list[Reason], reached: list[TestId], n_tests: int, reason: Reason,
           *, rule: str) -> None:
    """Widen the plan, or, when only some baselines predate the change, those tests."""
    if len(reached) == n_tests:
        widen.append(reason)
        return
    for test in reached:
        add_hit(hits, test, Reason(
            DecisionKind.CHANGED_SINCE_RECORDED,
            f"{shown(reason.path or '')} changed since its evidence was recorded, and {rule} "
            "runs every test whose evidence predates it", path=reason.path,
            via=f"safety rule: {rule} widens to every test recorded before the change"))
