"""The Python side of the shared plan/test-id corpus (rules/tests/plan_cases.json).

The Starlark twin (rules/private/plan_model.bzl, run by //rules/tests:plan_corpus_test)
reads the same cases, so both languages make the same accept/reject decisions
with the same one-line problem text, and normalize test ids alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastci.errors import PlanError
from fastci.plan.model import Plan, normalize_test_id
from fastci.types import LabelError, is_label, label_problem, parse_label

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = ROOT / "rules" / "tests" / "plan_cases.json"
CORPUS: dict[str, Any] = json.loads(CASES_FILE.read_text(encoding="utf-8"))


def _plan_of(case: dict[str, Any]) -> object:
    if "plan" in case:
        return case["plan"]
    plan = dict(CORPUS["base_plan"])
    plan.update(case.get("with", {}))
    for key in case.get("without", []):
        del plan[key]
    return plan


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CORPUS["plans"]])
def test_plan_corpus(case: dict[str, Any]) -> None:
    data = _plan_of(case)
    if "error" in case:
        with pytest.raises(PlanError) as info:
            Plan.from_dict(data)
        assert str(info.value) == case["error"]
        return
    plan = Plan.from_dict(data)
    assert {normalize_test_id(t.id): dict(t.overrides) for t in plan.tests} == case["ok"]["tests"]
    assert {normalize_test_id(s.id): s.why for s in plan.skipped} == case["ok"]["skipped"]
    # What a plan accepts it writes back the same way (the runners read what `fastci plan` wrote).
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("case", [pytest.param(c, id=repr(c["id"])) for c in CORPUS["labels"]])
def test_label_corpus(case: dict[str, Any]) -> None:
    text = case["id"]
    assert is_label(text) is (case["kind"] != "pytest")
    assert normalize_test_id(text) == case["normalized"]
    if case["kind"] == "label":
        assert label_problem(text) is None
        assert str(parse_label(text)) == case["normalized"]
        assert parse_label(case["normalized"]) == parse_label(text)  # canonical is a fixed point
    elif case["kind"] == "malformed":
        assert label_problem(text) == case["problem"]
        with pytest.raises(LabelError) as info:
            parse_label(text)
        assert str(info.value) == f"{text!r} is not a valid Bazel label: {case['problem']}"
        assert "\n" not in str(info.value)


def test_corpus_covers_every_kind() -> None:
    plans = CORPUS["plans"]
    assert any("ok" in c for c in plans) and any("error" in c for c in plans)
    assert all(("ok" in c) != ("error" in c) for c in plans)
    assert {c["kind"] for c in CORPUS["labels"]} == {"label", "pytest", "malformed"}
    problems = {c["problem"] for c in CORPUS["labels"] if c["kind"] == "malformed"}
    assert len(problems) >= 9  # every way label_problem can say no


def test_starlark_corpus_is_in_sync() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "rules" / "tests" / "sync_cases.py"), "--check"],
        capture_output=True, text=True, check=False,
    )
    assert res.returncode == 0, res.stderr
