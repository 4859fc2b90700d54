"""``fastci plan``'s summary counts a test under every reason it has (issue 11 item 6)."""

from __future__ import annotations

from fastci.plan.build import Analysis, summarize
from fastci.plan.model import Plan
from fastci.select.decisions import Decision, DecisionKind, Reason, Selection

K = DecisionKind


def _reason(kind: DecisionKind) -> Reason:
    return Reason(kind, f"because {kind.name}")


def _summary(*decisions: Decision) -> list[str]:
    sel = Selection(tuple(decisions), summary="test")
    return summarize(Analysis(sel, Plan(mode="selective"), None, 0.0))


def test_every_reason_of_a_test_is_counted() -> None:
    lines = _summary(
        Decision("//t:a", (_reason(K.CHANGED_UNIT), _reason(K.FAILED_LAST))),
        Decision("//t:b", (_reason(K.CHANGED_UNIT), _reason(K.CHANGED_UNIT))),  # same kind twice
        Decision("//t:c", (_reason(K.NO_EVIDENCE),)),
        Decision("//t:d", (_reason(K.NOT_AFFECTED),)),
    )
    counts = {line.split(None, 1)[1]: int(line.split(None, 1)[0])
              for line in lines if line[:6].strip().isdigit()}
    assert counts == {K.CHANGED_UNIT.value: 2, K.FAILED_LAST.value: 1,
                      K.NO_EVIDENCE.value: 1, K.NOT_AFFECTED.value: 1}
    assert "  tests by reason (1 with several reasons count under each):" in lines


def test_single_reason_tests_need_no_note() -> None:
    lines = _summary(Decision("//t:a", (_reason(K.NEW_TEST),)))
    assert f"     1  {K.NEW_TEST.value}" in lines
    assert not any("several reasons" in line for line in lines)
