"""Whether a calibration still describes the tree a plan is made for (issue 34 item 1).

A calibrated rung (:class:`fastci.evidence.store.calibrations.Rung`) says which lines, arcs and
contexts a test ran at one workload, at the commit it was calibrated at. Reduction
(:mod:`fastci.plan.reduce`) and line granularity (:mod:`fastci.select.lines`) diff the
*changed unit's* calibrated version against the head, but a rung also depends on every
other unit it ran: a caller changed on main since the calibration (now calling the changed
function only from the second layer on) makes a one-layer rung reach the change zero
times, although the rung's lines of the changed function still look right.

:func:`drift` says why a rung no longer describes the plan's tree, or None. Every file the
rung executed must be unchanged since its calibration commit, unit by unit: a changed
unit the rung ran, and any changed import-time code (a module or class body, a
signature, a decorator: it runs whenever the file is imported), make the rung stale.
The units a plan diffs itself (``allowed``: the test's changed units) are left to it. A
new unit is no drift (nothing the rung ran calls it unless that code changed too), nor
is a change to a function the rung never ran.

Cheap by construction: one ``git diff`` per distinct calibration commit
(:meth:`fastci.changes.versions.Versions.changed_since`, cached on the plan's
:class:`~fastci.changes.versions.Versions`), and only the executed files git names are
read and diffed (also cached, by content). A calibration commit this clone does not hold
(a ``dirty:`` stamp, a shallow checkout) is compared file by file, by digest.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Collection

from fastci.changes.semantic_diff import ChangeKind
from fastci.types import RelPath, UnitId

if TYPE_CHECKING:
    from fastci.changes.versions import Versions
    from fastci.evidence.store.calibrations import Rung

LOG = logging.getLogger(__name__)


def drift(rung: Rung, versions: Versions, allowed: Collection[UnitId],
          base: str | None = None) -> str | None:
    """Why ``rung`` does not describe the head side of ``versions`` (a sentence), or None.

    Args:
        rung: a calibrated rung.
        versions: the plan's file versions (its head side is the plan's tree).
        allowed: units whose change the caller diffs itself (the test's changed units).
        base: the change's base commit, where a calibrated version is looked up too.
    """
    commit = rung.commit or ""
    at = commit[:12] if commit and not commit.startswith("dirty:") else "a modified tree"
    paths = set(rung.digests) | set(rung.lines)
    changed = versions.changed_since(commit) if commit else None
    if changed is not None:
        paths &= changed
    revs = [c for c in (commit, base) if c and not c.startswith("dirty:")]
    for path in sorted(paths):
        digest = rung.digests.get(path)
        if digest is None:
            return f"the calibration executed {path} without recording its version"
        if versions.digest_now(path) == digest:
            continue  # changed and changed back, or a calibration from a modified tree
        why = _units_drift(path, digest, rung, versions, allowed, revs, at)
        if why is not None:
            return why
    return None


def _units_drift(path: RelPath, digest: str, rung: Rung, versions: Versions,
                 allowed: Collection[UnitId], revs: list[str], at: str) -> str | None:
    """Why the changes to ``path`` since the rung's version of it affect the rung."""
    since = f"since the calibration (at {at})"
    if versions.now(path) is None:
        return f"{path}, which the calibration executed, was deleted or moved {since}"
    old = versions.find(path, digest, revs)
    if old is None:
        return (f"{path} changed {since}, and the version the calibration executed is not "
                "in the history")
    diff = versions.diff(path, old)
    if diff.failure is not None:
        return f"{path} changed {since} and does not parse"
    for uc in diff.units:
        if uc.unit in allowed or set(uc.kinds) <= {ChangeKind.ADDED}:
            continue
        if uc.unit in rung.units:
            return f"{uc.describe()} {since}, and the calibration ran it"
        if uc.import_time:
            return f"{uc.describe()} {since}: import-time code of a file the calibration ran"
    return None
