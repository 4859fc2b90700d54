"""Reduction declarations (frozen, check, reference) on the Python side.

The cases live in rules/tests/declaration_cases.json, shared with the Starlark
twin (rules/private/validate.bzl ``check_declaration``/``resolve_reduction``, run
by //rules/tests:validate_test), so a test declared by a pytest marker is held to
exactly what a gpu_test is held to at load time.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

from fastci.integrations.bazel import query
from fastci.cli.targets import decl_json, format_decl
from fastci.plan import workload as wl

ROOT = Path(__file__).resolve().parents[1]
CORPUS: dict[str, Any] = json.loads((ROOT / "rules" / "tests" / "declaration_cases.json").read_text(encoding="utf-8"))
SUITE_BZL = ROOT / "examples" / "microllm" / "tests" / "suite.bzl"


@dataclass(frozen=True)
class Decl:
    """A declaration as a pytest marker or a test would write it (any values, unchecked)."""

    workload: Any
    floors: Any
    scope: Any
    constraints: Any
    frozen: Any = None
    check: Any = None
    reference: Any = None


def _decl(case: Mapping[str, Any]) -> Decl:
    return Decl(**{**CORPUS["default_decl"], **case["with"]})


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in CORPUS["cases"]])
def test_declaration_corpus(case: dict[str, Any]) -> None:
    decl = _decl(case)
    problems = wl.reduction_problems(decl)
    if case.get("problem_prefix"):
        assert problems and problems[0].startswith(case["problem_prefix"]), problems
    elif case.get("problem") is not None:
        assert problems[:1] == [case["problem"]]
    else:
        assert problems == []
        got = wl.resolve_reduction(decl)
        assert {"frozen": list(got.frozen), "check": got.check, "reference": got.reference,
                "defaulted": list(got.defaulted)} == case["resolved"]
        assert {k: list(v) for k, v in wl.reducible_dims(decl).items()} == case["reducible"]
    if problems:
        assert wl.reducible_dims(decl) == {}, "an invalid declaration must reduce nothing"


def test_corpus_covers_every_rule_and_value() -> None:
    cases = CORPUS["cases"]
    valid = [c for c in cases if c.get("problem") is None and not c.get("problem_prefix")]
    assert len(valid) >= 5 and len(cases) - len(valid) >= 25
    attrs = {(c.get("problem") or c["problem_prefix"]).split(":")[0] for c in cases if c not in valid}
    assert attrs == {"workload", "floors", "scope", "constraints", "frozen", "check", "reference"}
    declared = {c["with"].get(a) for c in valid for a in ("check", "reference")}
    assert {"exact", "tolerance", "threshold", "completes", "performance", "relational", "absolute"} <= declared | {
        c["resolved"]["check"] for c in valid}


def test_vocabulary_matches_the_starlark_rules() -> None:
    text = (ROOT / "rules" / "private" / "validate.bzl").read_text(encoding="utf-8")
    values = {}
    for line in text.splitlines():
        for name in ("CHECKS", "REFERENCES", "DEFAULT_CHECK", "DEFAULT_REFERENCE"):
            if line.startswith(f"{name} = "):
                values[name] = ast.literal_eval(line.split(" = ", 1)[1])
    assert values == {"CHECKS": list(wl.CHECKS), "REFERENCES": list(wl.REFERENCES),
                      "DEFAULT_CHECK": wl.DEFAULT_CHECK, "DEFAULT_REFERENCE": wl.DEFAULT_REFERENCE}


def test_performance_is_never_reducible_even_if_floors_slip_through() -> None:
    # reduction_problems rejects floors on a performance check; reducible_dims stays empty either way.
    decl = Decl({"steps": 10}, {"steps": 2}, [], [], check="performance")
    assert wl.reduction_problems(decl) == [
        "check: a performance check is never reduced: it takes no floors (got steps)"]
    assert wl.reducible_dims(decl) == {}


def test_a_marker_declaration_without_the_new_fields_is_checked_with_defaults() -> None:
    @dataclass(frozen=True)
    class Marker:  # the pytest plugin's Declaration today: no frozen/check/reference
        workload: Mapping[str, Any]
        floors: Mapping[str, Any]
        constraints: Sequence[str]
        scope: Sequence[str]

    marker = Marker({"steps": 10, "tp": 2}, {"steps": 2}, ("tp == 2",), ())
    assert wl.reduction_problems(marker) == []
    assert wl.resolve_reduction(marker) == wl.Reduction(("tp",), "completes", "absolute",
                                                        ("check", "frozen", "reference"))
    assert wl.reducible_dims(marker) == {"steps": (2, 10)}
    assert wl.reduction_problems(Marker({"steps": 10}, {"steps": 2}, ("steps > 10",), ())) == [
        'constraints: "steps > 10" does not hold on the full workload']


XML = """<?xml version="1.1" encoding="UTF-8" standalone="no"?>
<query version="2">
  <rule class="fastci_meta" location="/ws/p/BUILD:3:9" name="//p:t__fastci_meta">
    <label name="test" value="//p:t"/>
    <int name="gpus" value="2"/>
    <dict name="workload">
      <pair><string value="steps"/><string value="10"/></pair>
      <pair><string value="tp"/><string value="2"/></pair>
      <pair><string value="dtype"/><string value="&quot;bf16&quot;"/></pair>
    </dict>
    <dict name="floors"><pair><string value="steps"/><string value="2"/></pair></dict>
    <list name="scope"><string value="parallel_parity"/></list>
    <list name="constraints"><string value="tp == 2"/></list>
    <list name="frozen"><string value="dtype"/><string value="tp"/></list>
    <string name="check" value="tolerance"/>
    <string name="reference" value="relational"/>
    <list name="defaulted"/>
    <list name="srcs"><label value="//p:t.py"/></list>
    <string name="main" value="t.py"/>
  </rule>
  <rule class="fastci_meta" location="/ws/p/BUILD:9:9" name="//p:u__fastci_meta">
    <label name="test" value="//p:u"/>
    <dict name="workload"><pair><string value="steps"/><string value="5"/></pair></dict>
    <list name="frozen"><string value="steps"/></list>
    <string name="check" value="completes"/>
    <string name="reference" value="absolute"/>
    <list name="defaulted"><string value="check"/><string value="frozen"/><string value="reference"/></list>
  </rule>
</query>
"""


def test_query_xml_carries_frozen_check_reference_and_defaulted() -> None:
    t, u = query.parse_query_xml(XML)
    assert (t.frozen, t.check, t.reference, t.defaulted) == (("dtype", "tp"), "tolerance", "relational", ())
    assert (u.frozen, u.check, u.reference, u.defaulted) == (("steps",), "completes", "absolute",
                                                             ("check", "frozen", "reference"))
    assert wl.reduction_problems(t) == [] and wl.reducible_dims(t) == {"steps": (2, 10)}
    assert wl.reducible_dims(u) == {}


def test_query_xml_of_older_rules_leaves_the_fields_undeclared() -> None:
    # A fastci_meta without the new attributes (rules older than this change) means "not declared".
    old = XML.split("<rule", 2)
    text = "<rule".join(old[:2]).replace('<list name="frozen"><string value="dtype"/><string value="tp"/></list>', "")
    text = text.replace('<string name="check" value="tolerance"/>', "").replace(
        '<string name="reference" value="relational"/>', "").replace('<list name="defaulted"/>', "") + "</query>\n"
    (t,) = query.parse_query_xml(text)
    assert (t.frozen, t.check, t.reference) == (None, None, None)
    assert wl.resolve_reduction(t).frozen == ("dtype", "tp")


def test_targets_shows_what_shrinks_what_is_frozen_check_and_reference() -> None:
    t, u = query.parse_query_xml(XML)
    assert format_decl(t) == (
        "//p:t  gpus=2  scope=parallel_parity  check=tolerance  reference=relational  "
        'workload: dtype="bf16" (frozen), steps=10 (shrinks to 2), tp=2 (frozen)')
    assert format_decl(u) == (
        "//p:u  gpus=0  scope=-  check=completes (default)  reference=absolute (default)  "
        "workload: steps=5 (frozen, default)")
    data = decl_json(t)
    assert (data["frozen"], data["check"], data["reference"], data["defaulted"]) == (
        ["dtype", "tp"], "tolerance", "relational", [])
    assert data["reducible"] == {"steps": {"floor": 2, "full": 10}} and data["problems"] == []
    assert decl_json(query.TestDecl("//p:v", 0, {"steps": 5}, {"steps": 9}, (), (), ()))["problems"] == [
        "floors: steps: floor 9 is above the full value 5"]


def test_microllm_suite_declares_every_dimension_and_its_check() -> None:
    tree = ast.parse(SUITE_BZL.read_text(encoding="utf-8"))
    suite = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign))
    for name, spec in suite.items():
        decl = Decl(spec["workload"], spec["floors"], spec["scope"], spec["constraints"],
                    spec["frozen"], spec["check"], spec["reference"])
        assert wl.reduction_problems(decl) == [], name
        assert not [t for t in spec["tags"] if t.startswith(("check:", "reference:"))], name
    assert suite["throughput_test"]["check"] == "performance"
    assert suite["golden_loss_test"]["reference"] == "absolute"
    assert {"tp"} <= set(suite["tp_parity_test"]["frozen"])


def test_a_declared_test_without_a_workload_reduces_nothing() -> None:
    @dataclass(frozen=True)
    class Declared:  # shaped like fastci.select.DeclaredTest: the workload may be None
        workload: Mapping[str, Any] | None = None
        floors: Mapping[str, Any] = field(default_factory=dict)
        scope: tuple[str, ...] = ()
        constraints: tuple[str, ...] = ()

    assert wl.reduction_problems(Declared()) == ["workload: expected a dict of dimension -> value, got NoneType"]
    assert wl.reducible_dims(Declared()) == {}
    assert wl.reducible_dims(Declared({"steps": 4}, {"steps": 1})) == {"steps": (1, 4)}


def test_the_selector_sees_the_whole_declaration() -> None:
    """Issue 13 item 0: floors, frozen, scope, constraints, check and reference reach the
    planner (``DeclaredTest``), and it is a valid ``ReductionDecl``."""
    from fastci.integrations.bazel.query import TestDecl
    from fastci.plan.inputs import declared_test
    from fastci.plan.workload import reducible_dims, resolve_reduction

    d = TestDecl(id="//p:t", gpus=2, workload={"train_iters": 8, "tp": 2},
                 floors={"train_iters": 2}, scope=("parallel_parity",),
                 constraints=("train_iters >= 1",), srcs=("//p:t.py",), frozen=("tp",),
                 check="tolerance", reference="relational", defaulted=("reference",))
    got = declared_test(d, ("p/t.py",))
    assert (got.id, got.gpus, got.srcs) == ("//p:t", 2, ("p/t.py",))
    assert got.floors == {"train_iters": 2} and got.frozen == ("tp",)
    assert got.scope == ("parallel_parity",) and got.constraints == ("train_iters >= 1",)
    assert (got.check, got.reference, got.defaulted) == ("tolerance", "relational", ("reference",))
    assert reducible_dims(got) == {"train_iters": (2, 8)}
    assert resolve_reduction(got).defaulted == ("reference",)
