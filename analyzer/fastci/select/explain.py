"""``fastci explain TEST``: why a test runs or not, as a chain from change to test.

Each reason is printed as its chain: the changed unit or path, what happened to
it, the evidence row (with the contexts the test exercised the unit in) or the
static rule that connects it to the test, and the test.

Either kind of test id names a test: a pytest node id of an item in a gpu_test's
main file names that gpu_test, and a gpu_test's label names the node ids of its
main file's items (:mod:`fastci.integrations.bazel.mains`), whichever kind the
evidence was recorded under.
"""

from __future__ import annotations

import difflib
import logging
from typing import Mapping, Sequence

from fastci.integrations.bazel.mains import same_test
from fastci.select import Decision, Selection
from fastci.select.decisions import Reason
from fastci.select.test_rules import EvidenceReader
from fastci.types import RelPath, TestId, normalize_test_id, shown

LOG = logging.getLogger(__name__)

_MAX_CONTEXTS = 3
_MAX_CONTEXT_CHARS = 100


def _contexts_of(store: EvidenceReader | None, test: TestId) -> Mapping[str, Sequence[str]]:
    """Unit -> contexts the test exercised it in (read once per explained test)."""
    if store is None:
        return {}
    try:
        return store.units_of_test(test)
    except Exception as exc:  # noqa: BLE001 - explanation is best effort, the decision stands
        LOG.debug("cannot read contexts of %s: %s", test, exc)
        return {}


def chain(reason: Reason, test: TestId,
          contexts: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """The chain of one reason, one step per line; ``contexts`` as from ``units_of_test``."""
    steps: list[str] = []
    if reason.unit:
        steps.append(f"changed unit  {reason.unit}")
    elif reason.path:
        steps.append(f"changed path  {reason.path}")
    if reason.change:
        steps.append(f"change        {reason.change}")
    if reason.via:
        steps.append(f"link          {reason.via}")
    ctx = list((contexts or {}).get(reason.unit, [])) if reason.unit else []
    if ctx:
        listed = ", ".join(c if len(c) <= _MAX_CONTEXT_CHARS else c[:_MAX_CONTEXT_CHARS] + "..."
                           for c in ctx[:_MAX_CONTEXTS])
        more = f" (+{len(ctx) - _MAX_CONTEXTS} more)" if len(ctx) > _MAX_CONTEXTS else ""
        steps.append(f"contexts      {listed}{more}")
    steps.append(f"test          {shown(test)}")
    return steps


def resolve(selection: Selection, test: TestId,
            mains: Mapping[TestId, RelPath] | None = None) -> list[TestId]:
    """The ids ``selection`` knows ``test`` by: itself, or its twins of the other kind.

    ``mains`` (label -> main file, from the declarations) wins over the default
    main ``<name>.py``. Empty: the test is unknown.
    """
    test = normalize_test_id(test)
    if test in selection.by_test:
        return [test]
    return same_test(test, selection.by_test, mains)


def explain(selection: Selection, test: TestId, store: EvidenceReader | None = None,
            mains: Mapping[TestId, RelPath] | None = None) -> list[str]:
    """Lines explaining the decision for ``test`` (or that the test is unknown).

    ``test`` may be a label or a node id, whichever kind the selection holds
    (see :func:`resolve`); a label whose main file holds several items explains each.
    """
    known = resolve(selection, test, mains)
    if not known:
        close = difflib.get_close_matches(test, list(selection.by_test), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return [f"{shown(test)}: not a known test (neither declared nor in the evidence){hint}"]
    lines: list[str] = []
    for tid in known:
        lines.extend(_explain_one(selection, tid, store, alias=None if tid == test else test))
    return lines


def _explain_one(selection: Selection, test: TestId, store: EvidenceReader | None,
                 alias: TestId | None) -> list[str]:
    decision: Decision = selection.by_test[test]
    verdict = "RUNS" if decision.selected else "SKIPPED"
    lines = [f"{shown(test)}: {verdict}" + (f" (as {alias})" if alias else "")]
    if selection.widen:
        lines.append(f"  plan widened to every test ({len(selection.widen)} reason(s))")
    contexts = _contexts_of(store, test) if any(r.unit for r in decision.reasons) else {}
    for i, reason in enumerate(decision.reasons, 1):
        lines.append(f"  {i}. {reason.kind.value}: {reason.sentence}")
        lines.extend(f"       {step}" for step in chain(reason, test, contexts))
    if decision.est_gpu_s is not None:
        lines.append(f"  estimated cost: {decision.est_gpu_s:.1f} GPU-seconds (recorded duration x GPUs)")
    return lines
