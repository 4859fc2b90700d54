"""Tests of fastci.plan.workload: the safe constraint evaluator and the override rules.

The cases live in rules/tests/constraint_cases.json, shared with the Starlark
twin (rules/private/constraints.bzl, run by //rules/tests:constraints_test), so
both languages are held to the same expectations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastci.plan import workload as wl

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = ROOT / "rules" / "tests" / "constraint_cases.json"
CORPUS: dict[str, Any] = json.loads(CASES_FILE.read_text(encoding="utf-8"))


def _constraint_cases() -> list[Any]:
    return [pytest.param(c, id=c["expr"] or "<empty>") for c in CORPUS["constraints"]]


def _override_cases() -> list[Any]:
    return [pytest.param(c, id=c["name"]) for c in CORPUS["overrides"]]


@pytest.mark.parametrize("case", _constraint_cases())
def test_constraint_corpus(case: dict[str, Any]) -> None:
    workload = case.get("workload", CORPUS["default_workload"])
    if "error" in case:
        with pytest.raises(wl.ConstraintError) as info:
            wl.evaluate(case["expr"], workload)
        assert case["error"] in str(info.value)
    else:
        assert wl.evaluate(case["expr"], workload) is case["result"]


@pytest.mark.parametrize("case", _override_cases())
def test_override_corpus(case: dict[str, Any]) -> None:
    problems = wl.override_problems(case["workload"], case["floors"], case["constraints"], case["overrides"])
    assert len(problems) == len(case["problems"]), problems
    for got, prefix in zip(problems, case["problems"]):
        assert got.startswith(prefix), (got, prefix)


def test_corpus_covers_both_outcomes_and_every_error_kind() -> None:
    cases = CORPUS["constraints"]
    assert {c.get("result") for c in cases if "result" in c} == {True, False}
    kinds = {c["error"] for c in cases if "error" in c}
    for kind in ("unknown name", "division by zero", "chained comparison", "unsupported operator **", "unknown function"):
        assert kind in kinds
    assert any(not c["problems"] for c in CORPUS["overrides"])
    assert any(c["problems"] for c in CORPUS["overrides"])


def test_no_eval_no_code_execution(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    attack = f"__import__('os').system('touch {marker}') == 0"
    with pytest.raises(wl.ConstraintError):
        wl.evaluate(attack, {})
    with pytest.raises(wl.ConstraintError, match="unknown function"):
        wl.evaluate("__import__('os') == 0", {})
    assert not marker.exists()
    source = Path(wl.__file__).read_text(encoding="utf-8")
    assert "eval(" not in source.replace("evaluate(", "").replace("_eval(", "")
    assert "import ast" not in source


def test_parse_reports_names_and_rpn() -> None:
    c = wl.parse_constraint("gbs // mbs >= max(pp, load_pp)")
    assert c.names == ("gbs", "mbs", "pp", "load_pp")
    assert [item[1] for item in c.program] == ["gbs", "mbs", "//", "pp", "load_pp", "max", ">="]


def test_non_string_constraint_is_an_error() -> None:
    with pytest.raises(wl.ConstraintError, match="must be a string"):
        wl.parse_constraint(3)  # type: ignore[arg-type]


def test_constraint_problems_lists_each_failing_constraint() -> None:
    w = {"a": 4, "b": 3}
    assert wl.constraint_problems(["a % 2 == 0", "a % b == 0", "c > 1"], w) == [
        'constraint "a % b == 0" does not hold',
        "constraint \"c > 1\" cannot be evaluated: unknown name 'c' (workload dimensions: a, b)",
    ]


def test_frozen_dimension_cannot_be_overridden_even_within_range() -> None:
    # Regression (issue 9 item 11): a dimension without a floor used to accept any value.
    problems = wl.override_problems({"tp": 2, "steps": 10}, {"steps": 2}, [], {"tp": 1})
    assert problems == ["tp: frozen (no floor declared), stays 2"]
    assert wl.override_problems({"steps": 10}, {"steps": 2}, [], {"steps": 11}) == [
        "steps: 11 is above the full value 10"
    ]


def test_starlark_corpus_is_in_sync() -> None:
    res = subprocess.run(
        [sys.executable, str(ROOT / "rules" / "tests" / "sync_cases.py"), "--check"],
        capture_output=True, text=True, check=False,
    )
    assert res.returncode == 0, res.stderr
