"""Dependency manifests, repository metadata and package environments, read for meaning.

* :func:`manifest_rules`: a changed manifest (``pyproject.toml``, requirements,
  ``setup.cfg``, lock files; :mod:`fastci.changes.manifests`) selects the tests
  whose evidence imported a distribution whose requirement changed; settings that
  can change any test, core packages (the interpreter, torch, CUDA), new
  distributions no test imported yet, and manifests that cannot be read run
  everything. Repository metadata no test process opens (``metadata_ignore``:
  ``.pre-commit-config.yaml``, ``CODEOWNERS`` ...) is noted, not run for.
* :func:`environment_rules`: evidence recorded in another environment is kept
  when the two environments differ only in packages the test never imported.

Paths this module read are returned as *handled*: the path rules still apply
``path_tests`` and recorded reads to them (a test that opened the file runs),
but neither ignore nor widen them again. A path that ``run_all`` matches is left
to the path rules (configuration wins).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple, Protocol

from fastci.changes.manifests import ManifestChange, is_manifest, read_change
from fastci.changes.scan import ChangeSet
from fastci.config import Config, first_match
from fastci.evidence.record.environment import parse_listing
from fastci.integrations.git.repository import shown
from fastci.select.decisions import DecisionKind, Reason
from fastci.types import RelPath, TestId

Hits = dict[TestId, list[Reason]]

#: Distributions whose change reaches every test whatever it imported: the GPU stack
#: (loaded by torch without a Python import of its own), build tools used by JIT builds,
#: and FastCI itself (its launcher, recorder and pytest plugin run inside every test
#: process, where no evidence names them: fastci.select.own_code).
CORE_NAMES = frozenset({"torch", "triton", "pytorch-triton", "pytorch-triton-rocm",
                        "pytorch-triton-xpu", "jax", "jaxlib", "ninja", "cmake", "fastci"})
CORE_PREFIXES = ("nvidia-", "cuda-", "cupy-cuda")


class DistributionReader(Protocol):
    """What these rules read from the evidence store."""

    def tests_for_distributions(self, names: Iterable[str]) -> Mapping[str, set[TestId]]: ...
    def distributions_of_tests(self, tests: Iterable[TestId] | None = None) -> \
        Mapping[TestId, Mapping[str, str]]: ...
    def evidence_commits(self) -> set[str | None]: ...


class ManifestSelection(NamedTuple):
    """What :func:`manifest_rules` found: per-test hits, plan-wide widenings, paths read, notes."""

    hits: Hits
    widen: list[Reason]
    handled: set[RelPath]
    notes: list[str]


def is_core(name: str) -> bool:
    """Whether a change to distribution ``name`` reaches every test (torch, CUDA wheels ...)."""
    return name in CORE_NAMES or name.startswith(CORE_PREFIXES)


def manifest_rules(changes: ChangeSet, store: DistributionReader, config: Config,
                   baselines: Mapping[TestId, str | None] | None = None) -> ManifestSelection:
    """Changed manifests -> tests that imported a changed distribution, or widening.

    Each test is compared with the manifest as of the commit its evidence was
    recorded at (``baselines``: test -> commit; a test re-recorded after a pin bump
    is not selected for it again, and one that never imported the package never
    is). Tests with no known baseline commit, or every test when ``baselines`` is
    None, are compared with the base and every evidence commit (the union).
    What runs everything for some baselines but not all selects those tests only.
    """
    out = ManifestSelection({}, [], set(), [])
    since = {c: {ch.path: ch for ch in chs} for c, chs in changes.since.items()}
    renamed = {o.path: o.old_path for o in changes.others if o.old_path}
    paths = sorted({*changes.paths, *(p for chs in since.values() for p in chs)})
    paths = [p for p in paths if first_match(p, config.run_all) is None]
    for path in paths:
        rule = first_match(path, config.metadata_ignore)
        if rule is not None and not is_manifest(path):
            out.handled.add(path)
            out.notes.append(f"{shown(path)}: repository metadata, ignored unless a test "
                             f"recorded opening it (fastci.yaml metadata_ignore {rule!r})")
    manifests = [p for p in paths if is_manifest(p)]
    if not manifests or changes.tree is None:
        return out  # not read from git: the path rules decide (run_all, unknown)
    groups: dict[str, list[TestId] | None] = {"": None}
    if baselines is not None:
        known: dict[str, list[TestId]] = {}
        for test, commit in sorted(baselines.items()):
            known.setdefault(commit if commit and commit in since else "", []).append(test)
        groups = dict(known)
    everyone = len(baselines) if baselines is not None else None
    for path in manifests:
        out.handled.add(path)
        for key, tests in sorted(groups.items()):
            if key and path not in since[key]:
                continue  # unchanged since these tests were recorded
            if key:
                ch = since[key][path]
                change = _read(changes, path, [(key, ch.old_path or path)])
            else:
                revs = {changes.base} | {c for c in store.evidence_commits()
                                         if c and c in since}
                change = _read(changes, path, [(r, renamed.get(path, path)) for r in sorted(revs)])
            whole = tests is None or len(tests) == everyone
            _apply(path, change, store, out, tests, whole)
    return out


def _read(changes: ChangeSet, path: RelPath,
          olds: list[tuple[str, RelPath]]) -> ManifestChange | None:
    """The union of the change from each ``(revision, path there)`` to head (None: unreadable)."""
    assert changes.tree is not None
    git = changes.tree.git
    new = git.read(changes.head, path)
    merged: dict[str, set[str]] = {"distributions": set(), "added": set(), "settings": set(),
                                   "inert": set()}
    required: dict[str, tuple[str, ...]] = {}
    for rev, old_path in olds:
        got = read_change(path, git.read(rev, old_path), new)
        if got is None:
            return None
        for key, values in merged.items():
            values.update(getattr(got, key))
        required.update(got.requirements)  # the new side's entries: the same from every old
    return ManifestChange(path, tuple(sorted(merged["distributions"])),
                          tuple(sorted(merged["added"])), tuple(sorted(merged["settings"])),
                          tuple(sorted(merged["inert"])), tuple(sorted(required.items())))


def _apply(path: RelPath, change: ManifestChange | None, store: DistributionReader,
           out: ManifestSelection, tests: list[TestId] | None, whole: bool) -> None:
    """Add what ``change`` means for ``tests`` (None: every test) to ``out``."""
    widen: list[Reason] = []
    if change is None:
        widen.append(Reason(
            DecisionKind.RUN_ALL_PATH, f"{shown(path)} changed and could not be read as a "
            "dependency manifest: everything runs", path=path,
            via="safety rule: an unreadable manifest widens to every test"))
        change = ManifestChange(path)
    importers = store.tests_for_distributions(change.distributions)
    widen += _widenings(path, change, importers)
    if widen and whole:
        out.widen.extend(widen)
    elif widen:
        for test in tests or ():
            for reason in widen:
                out.hits.setdefault(test, []).append(Reason(
                    DecisionKind.CHANGED_SINCE_RECORDED,
                    f"{reason.sentence.rsplit(':', 1)[0]} since its evidence was recorded, "
                    "which runs every test recorded before it", path=path, change=reason.change,
                    via=reason.via))
    admitted = _importer_hits(path, change, store, importers,
                              None if tests is None else set(tests), out)
    if admitted:
        _note(out, f"{shown(path)}: the new requirement still admits the version recorded "
                   f"({', '.join(sorted(admitted))}): no test runs for it")
    if change.inert and not (change.settings or change.distributions):
        _note(out, f"{shown(path)}: only {', '.join(change.inert)} changed, which no test "
                   "reads: nothing runs for it")


def _widenings(path: RelPath, change: ManifestChange,
               importers: Mapping[str, Iterable[TestId]]) -> list[Reason]:
    """What of ``change`` reaches every test: settings, a core package's requirement, a
    new dependency no recorded test imported."""
    widen: list[Reason] = []
    if change.settings:
        widen.append(Reason(
            DecisionKind.RUN_ALL_PATH, f"{shown(path)} changed {', '.join(change.settings)}, "
            "which can change any test: everything runs", path=path,
            change=", ".join(change.settings),
            via="static rule: build, interpreter and test-runner settings reach every test"))
    core = [n for n in change.distributions if is_core(n)]
    if core:
        widen.append(Reason(
            DecisionKind.RUN_ALL_PATH, f"{shown(path)} changed the requirement of "
            f"{', '.join(core)} (interpreter, torch or CUDA stack): everything runs", path=path,
            change=", ".join(core), via="safety rule: a core package change reaches every test"))
    new = [n for n in change.added if not importers.get(n)]
    if new:
        widen.append(Reason(
            DecisionKind.RUN_ALL_PATH, f"{shown(path)} adds {', '.join(new)}, which no recorded "
            "test imported: code that imports it only when it is installed (try/except "
            "ImportError, plugin entry points) left no evidence, so everything runs", path=path,
            change="added " + ", ".join(new),
            via="safety rule: a new dependency widens to every test"))
    return widen


def _importer_hits(path: RelPath, change: ManifestChange, store: DistributionReader,
                   importers: Mapping[str, Iterable[TestId]], mine: set[TestId] | None,
                   out: ManifestSelection) -> set[str]:
    """The tests (of ``mine``; None: any) that imported a distribution whose requirement
    changed, unless the new requirement still admits the version they ran with; returns
    those admitted (``name version``)."""
    reached = sorted({t for n in change.distributions for t in importers.get(n, ())
                      if mine is None or t in mine})
    versions = store.distributions_of_tests(reached) if reached else {}
    admitted: set[str] = set()
    for name in change.distributions:
        for test in sorted(importers.get(name, ())):
            if mine is not None and test not in mine:
                continue
            version = (versions.get(test) or {}).get(name)
            if change.admits(name, version):
                # A pin changed in text only: the version this test ran with still
                # satisfies it (an environment that differs is the environment rules').
                admitted.add(f"{name} {version}")
                continue
            what = f" {version}, which the new requirement does not admit" if version else ""
            out.hits.setdefault(test, []).append(Reason(
                DecisionKind.CHANGED_DISTRIBUTION,
                f"imported {name}{what}, whose requirement changed in {shown(path)}",
                path=path, change=f"requirement of {name} changed",
                via="evidence: the test's recording imported the distribution"))
    return admitted


def _note(out: ManifestSelection, note: str) -> None:
    if note not in out.notes:
        out.notes.append(note)


# ------------------------------------------------------------------------ environments


def package_changes(recorded: Mapping[str, Any],
                    current: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """``(changed or removed, added)`` distribution names between two environments.

    None when they cannot be compared by package: either lacks a ``packages_list``
    or a ``base_fingerprint``, or the bases differ (interpreter, platform, GPUs,
    driver, CUDA toolkit, system libraries).
    """
    keys = ("base_fingerprint", "packages_list")
    if not all(recorded.get(k) for k in keys) or not all(current.get(k) for k in keys):
        return None
    if recorded["base_fingerprint"] != current["base_fingerprint"]:
        return None
    old = parse_listing(str(recorded["packages_list"]))
    now = parse_listing(str(current["packages_list"]))
    changed = sorted(n for n in old if now.get(n) != old[n])
    return changed, sorted(set(now) - set(old))


def environment_rules(runs: Mapping[TestId, Any], current: Mapping[str, Any] | None,
                      imported: Mapping[TestId, Mapping[str, str]]) -> Hits:
    """Tests whose evidence another environment invalidates (replaces the fingerprint check).

    Args:
        runs: test -> its latest run (``env_fingerprint`` and ``environment``, the
            run's environment JSON).
        current: the test runner's environment (``environment_of_interpreter``),
            None when unknown.
        imported: test -> {distribution: version} its evidence imported.

    Same fingerprint: nothing. Otherwise the test runs, unless the environments
    differ only in packages (same base fingerprint), none of them core, none new,
    and the test recorded its imports and imported none of them.
    """
    hits: Hits = {}
    now = (current or {}).get("fingerprint") or None
    for test, run in sorted(runs.items()):
        recorded = run.env_fingerprint
        if now is not None and recorded == now:
            continue
        env = getattr(run, "environment", None) or {}
        diff = package_changes(env, current) if current is not None else None
        mine = imported.get(test) or {}
        reason: str | None
        if diff is None or not mine:
            why = "" if diff is None or mine else \
                " (its evidence does not say which packages it imported)"
            reason = (f"recorded in environment {recorded or 'unknown'}, now {now or 'unknown'} "
                      f"(Python, packages incl. torch/CUDA, or GPU differ){why}")
        else:
            changed, added = diff
            core = [n for n in changed + added if is_core(n)]
            used = [n for n in changed if n in mine]
            if core:
                reason = f"the environment's {', '.join(core)} changed (reaches every test)"
            elif added:
                reason = (f"the environment gained {', '.join(added)}, which no evidence can "
                          "rule out (optional imports, plugin entry points)")
            elif used:
                reason = "it imported " + ", ".join(
                    f"{n} {mine[n]}" for n in used) + ", which changed in the environment"
            else:
                continue  # only packages it never imported differ: its evidence stands
        hits[test] = [Reason(
            DecisionKind.ENVIRONMENT_PACKAGES if diff is not None and mine else DecisionKind.ENVIRONMENT_CHANGED,
            reason, via="safety rule: a changed environment invalidates evidence that "
                        "depends on what changed")]
    return hits

