"""List a workspace's gpu_tests with their declarations via real ``bazel query``.

Each ``gpu_test`` has a sibling ``fastci_meta`` target; ``--output=xml`` of
``kind(fastci_meta, //...)`` carries every attribute (workload and floor
values JSON-encoded, so their types survive; ``frozen``, ``check`` and
``reference`` resolved, ``defaulted`` naming those the test left undeclared).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Mapping

from fastci.integrations.bazel.runner import Bazel
from fastci.errors import BazelError
from fastci.types import TestId, WorkloadValue, normalize_test_id


@dataclass(frozen=True)
class TestDecl:
    """What a gpu_test declares in BUILD."""

    id: TestId
    gpus: int
    workload: Mapping[str, WorkloadValue]
    floors: Mapping[str, WorkloadValue]
    scope: tuple[str, ...]
    constraints: tuple[str, ...]
    srcs: tuple[str, ...]
    main: str = ""
    #: Dimensions a plan never reduces (None: not declared, i.e. every dimension
    #: without a floor; the rules always write the resolved list).
    frozen: tuple[str, ...] | None = None
    #: exact, tolerance, threshold, completes or performance (None: not declared).
    check: str | None = None
    #: relational or absolute (None: not declared).
    reference: str | None = None
    #: Which of frozen, check and reference the gpu_test left to their defaults.
    defaulted: tuple[str, ...] = ()


def _decode_dict(rule_name: str, attr: str, elem: ET.Element | None) -> dict[str, WorkloadValue]:
    out: dict[str, WorkloadValue] = {}
    if elem is None:
        return out
    for pair in elem.findall("pair"):
        key, value = (s.get("value", "") for s in pair.findall("string"))
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError as exc:
            raise BazelError(f"{rule_name}: {attr}.{key}: not JSON: {value!r}") from exc
    return out


def parse_query_xml(text: str) -> list[TestDecl]:
    """Parse ``bazel query --output=xml`` of ``fastci_meta`` rules (pure), sorted by id."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise BazelError(f"bazel query returned malformed XML: {exc}") from exc
    decls = []
    for rule in root.iter("rule"):
        if rule.get("class") != "fastci_meta":
            continue
        name = rule.get("name", "?")
        attrs = {e.get("name"): e for e in rule if e.get("name")}
        test = attrs.get("test")
        gpus = attrs.get("gpus")
        if test is None:
            raise BazelError(f"{name}: fastci_meta without a test attribute")

        def strings(attr: str) -> tuple[str, ...]:
            elem = attrs.get(attr)
            return tuple(s.get("value", "") for s in elem) if elem is not None else ()

        def optional(attr: str) -> str | None:
            elem = attrs.get(attr)
            return (elem.get("value") or None) if elem is not None else None

        main = attrs.get("main")
        decls.append(
            TestDecl(
                id=normalize_test_id(test.get("value", "")),
                gpus=int(gpus.get("value", "0")) if gpus is not None else 0,
                workload=_decode_dict(name, "workload", attrs.get("workload")),
                floors=_decode_dict(name, "floors", attrs.get("floors")),
                scope=strings("scope"),
                constraints=strings("constraints"),
                srcs=strings("srcs"),
                main=main.get("value", "") if main is not None else "",
                # Absent from rules older than these attributes: not declared.
                frozen=strings("frozen") if "frozen" in attrs else None,
                check=optional("check"),
                reference=optional("reference"),
                defaulted=strings("defaulted"),
            )
        )
    return sorted(decls, key=lambda d: d.id)


def list_gpu_tests(bazel: Bazel, universe: str = "//...") -> list[TestDecl]:
    """Every gpu_test under ``universe`` with its declaration.

    Raises:
        BazelError: the query failed (e.g. a BUILD file does not load).
    """
    return parse_query_xml(bazel.query(f"kind(fastci_meta, {universe})", output="xml"))
