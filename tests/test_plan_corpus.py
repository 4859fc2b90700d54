"""The Python side of the shared plan/test-id corpus (rules/tests/plan_cases.json).

The Starlark twin (rules/private/plan_model.bzl, run by //rules/tests:plan_corpus_test)
reads the same cases, so both languages make the same accept/reject decisions
with the same one-line problem text, and normalize test ids alike.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastci.errors import PlanError
from fastci.plan import model
from fastci.plan.model import Plan, normalize_test_id
from fastci.types import LabelError, is_label, label_problem, parse_label

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = ROOT / "rules" / "tests" / "plan_cases.json"
CORPUS: dict[str, Any] = json.loads(CASES_FILE.read_text(encoding="utf-8"))
PLAN_BZL = ROOT / "rules" / "private" / "plan.bzl"
PLAN_MODEL_BZL = ROOT / "rules" / "private" / "plan_model.bzl"
CAPS = ("MAX_PLAN_BYTES", "MAX_ENTRIES", "MAX_STRING_CHARS", "MAX_PROBLEM_CHARS")


def _bzl_caps() -> dict[str, int]:
    """The caps as plan_model.bzl declares them (integer arithmetic only)."""
    text = PLAN_MODEL_BZL.read_text(encoding="utf-8")
    out = {}
    for name in CAPS:
        found = re.search(rf"^{name} = ([0-9 *]+)$", text, re.MULTILINE)
        assert found, f"{name} not declared in plan_model.bzl"
        value = 1
        for factor in found.group(1).split("*"):
            value *= int(factor)
        out[name] = value
    return out


def json_check_script() -> str:
    """The python3 program plan.bzl runs before json.decode, as the repository rule formats it."""
    text = PLAN_BZL.read_text(encoding="utf-8")
    found = re.search(r'^_JSON_CHECK = """(.*?)""" % \(MAX_PLAN_BYTES, MAX_PROBLEM_CHARS\)$', text,
                      re.MULTILINE | re.DOTALL)
    assert found, "plan.bzl: _JSON_CHECK not found"
    caps = _bzl_caps()
    return found.group(1) % (caps["MAX_PLAN_BYTES"], caps["MAX_PROBLEM_CHARS"])


def run_json_check(path: Path) -> subprocess.CompletedProcess[str]:
    """Run plan.bzl's check on ``path`` (stdout: the one-line problem; rc 3: too big, not read)."""
    return subprocess.run([sys.executable, "-c", json_check_script(), str(path)],
                          capture_output=True, text=True, check=False, timeout=60)


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


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CORPUS["texts"]])
def test_text_corpus(case: dict[str, Any], tmp_path: Path) -> None:
    # Refused before the schema, by both readers, with the same one line: the Python
    # model and the python3 check the repository rule runs before json.decode.
    text = case["text"] * case.get("repeat", 1)
    with pytest.raises(PlanError) as info:
        Plan.from_json(text)
    assert str(info.value) == case["error"]
    path = tmp_path / "plan.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlanError) as info:
        model.load_plan(path)
    assert str(info.value) == case["error"]
    res = run_json_check(path)
    assert (res.returncode, res.stdout, res.stderr) == (1, case["error"], "")


def test_valid_plans_pass_the_bazel_json_check(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    for case in CORPUS["plans"]:
        data = _plan_of(case)
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        res = run_json_check(path)  # the schema is plan_model.bzl's job: the text is fine
        assert res.returncode == 0, case["name"]
        # What json.decode gets: the same plan, spelled in ASCII (\u escapes).
        assert res.stdout.isascii() and json.loads(res.stdout) == data, case["name"]


def test_caps_are_the_same_in_both_twins() -> None:
    assert _bzl_caps() == {name: getattr(model, name) for name in CAPS}


def test_corpus_covers_every_kind() -> None:
    plans = CORPUS["plans"]
    assert any("ok" in c for c in plans) and any("error" in c for c in plans)
    assert all(("ok" in c) != ("error" in c) for c in plans)
    assert {c["kind"] for c in CORPUS["labels"]} == {"label", "pytest", "malformed"}
    problems = {c["problem"] for c in CORPUS["labels"] if c["kind"] == "malformed"}
    assert len(problems) >= 9  # every way label_problem can say no
    assert len(CORPUS["texts"]) >= 5 and all(c["error"].startswith("plan.json: ") for c in CORPUS["texts"])


def test_starlark_corpus_is_in_sync() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "rules" / "tests" / "sync_cases.py"), "--check"],
        capture_output=True, text=True, check=False,
    )
    assert res.returncode == 0, res.stderr
