"""The calibration as a plan sees it: trusted or not, declarations, line facts, reductions.

The view a plan takes of ``fastci calibrate``'s store (:mod:`fastci.evidence.store.calibrations`):
:func:`open_calibration` opens it unless the change could have written it;
:func:`with_calibrated` adds the declarations it kept (pytest declares nothing at plan
time); :func:`line_facts_of` gives the line evidence of the selected tests it speaks
for; :func:`reductions` the workload of each (:mod:`fastci.plan.reduce`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from fastci.changes.scan import ChangeSet
from fastci.config import Config
from fastci.errors import FastCIError
from fastci.integrations.git.repository import Git
from fastci.plan.reduce import Choice, choose
from fastci.select import Selection
from fastci.select.test_rules import DeclaredTest, EvidenceReader
from fastci.types import RelPath, TestId, UnitId

if TYPE_CHECKING:
    from fastci.evidence.store.calibrations import CalibrationStore
    from fastci.select.lines import Reach

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationView:
    """The calibration a plan may use: its open store (None: none to use) and, when there
    is one the plan must not trust, why (None, None: not calibrated)."""

    store: CalibrationStore | None
    error: str | None = None

    def close(self) -> None:
        """Close the store, if one was opened."""
        if self.store is not None:
            self.store.close()


def open_calibration(root: Path, config: Config, git: Git, head: str, changes: ChangeSet
                     ) -> CalibrationView:
    """The calibration store (config ``calibration``), unless the change could have written it."""
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
    return CalibrationView(calibration, error)


def with_calibrated(selection: Selection, declared: Mapping[TestId, DeclaredTest],
                    calibration: CalibrationView) -> dict[TestId, DeclaredTest]:
    """``declared`` plus, for a runner without declarations at plan time (pytest), the
    declarations the calibration kept for the selected tests."""
    out = dict(declared)
    if calibration.store is not None:
        for d in selection.selected:
            if d.test not in out:
                got = calibrated_declaration(d.test, calibration.store)
                if got is not None:
                    out[d.test] = got
    return out


def line_facts_of(selection: Selection, changes: ChangeSet, calibration: CalibrationView,
                  declared: Mapping[TestId, DeclaredTest], store: EvidenceReader
                  ) -> dict[TestId, tuple[Reach, ...]]:
    """:func:`fastci.select.lines.line_facts` of the selected, declared tests."""
    from fastci.select.lines import COMPILER_MARKERS, declaration_digests, line_facts

    if calibration.store is None or changes.versions is None:
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
    return line_facts(selection, changes.versions, calibration.store, digests, recorded,
                      changes.base)


def _traced_any(store: EvidenceReader, test: TestId) -> bool:
    """Whether the test's evidence holds code dynamo traced (no line events: no line facts)."""
    from fastci.evidence.record.traced import TRACED_CONTEXT

    return any(TRACED_CONTEXT in sigs for sigs in store.units_of_test(test).values())


def reductions(changes: ChangeSet, selection: Selection, declared: Mapping[TestId, DeclaredTest],
               store: EvidenceReader, calibration: CalibrationView) -> dict[TestId, Choice]:
    """Each selected test's workload from the calibration (full workload on any doubt)."""
    history = getattr(store, "runs_of_test", None)
    return choose([d for d in selection.selected if d.test in declared], declared,
                  calibration.store, changes.versions, changes.base, history=history,
                  calibration_error=calibration.error)


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
