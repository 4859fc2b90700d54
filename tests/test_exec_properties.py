"""gpu_test's remote-execution properties, end to end with the real Bazel 4.2.3.

A gpu_test's declaration (``gpus``, optional ``gpu_kind`` and ``pool``, the caller's own
``exec_properties``) becomes the platform of its test action, which is what a remote
executor matches workers on (docs/REMOTE.md). Measured on 4.2.3: ``bazel aquery`` lists
the TestRunner action but prints no execution properties for it (nor its env); the
execution log (``--execution_log_json_file``) prints the platform each spawn carries,
so the properties are checked there, on the spawn that runs the test.

No remote executor runs here: the tests run locally, where the properties are ignored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.bazel.runner import Bazel
from bazel_support import fixture_workspace, remove_tree, require_bazel

require_bazel()  # skips without bazel; fails under CI

REPO = Path(__file__).resolve().parents[1]

BUILD = '''load("@fastci//rules:defs.bzl", "gpu_test")
load("@fastci//rules/tests:exec_props_tests.bzl", "EXEC_PROPS_CASES")
load("@fastci//rules/tests:unittest.bzl", "starlark_unit_test")

gpu_test(
    name = "h100_test",
    srcs = ["h100_test.py"],
    gpus = 2,
    gpu_kind = "h100-80gb",
    pool = "gpu-h100",
    exec_properties = {"container-image": "docker://example/trainer:1"},
    workload = {"steps": 3},
)

gpu_test(
    name = "cpu_test",
    srcs = ["cpu_test.py"],
    gpus = 0,
    workload = {"steps": 1},
)

# The unit tests of rules/private/exec_props.bzl (kept out of //rules/tests:all).
starlark_unit_test(
    name = "exec_props_test",
    size = "small",
    cases = EXEC_PROPS_CASES,
)
'''

BAD_BUILD = '''load("@fastci//rules:defs.bzl", "gpu_test")

gpu_test(
    name = "kind_without_gpus_test",
    srcs = ["t.py"],
    gpus = 0,
    gpu_kind = "a100",
)
'''

H100 = {"gpus": "2", "gpu-kind": "h100-80gb", "Pool": "gpu-h100", "container-image": "docker://example/trainer:1"}


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Bazel]]:
    base = tmp_path_factory.mktemp("exec_properties")
    root = base / "ws"
    fixture_workspace(root)
    (root / "remote").mkdir()
    (root / "remote" / "BUILD.bazel").write_text(BUILD)
    for name in ("h100_test.py", "cpu_test.py"):
        (root / "remote" / name).write_text("print('ran')\n")
    (root / "bad").mkdir()
    (root / "bad" / "BUILD.bazel").write_text(BAD_BUILD)
    (root / "bad" / "t.py").write_text("")
    bazel = Bazel(root, startup=[f"--output_base={base / 'output_base'}"], python=sys.executable)
    try:
        yield root, bazel
    finally:
        bazel.shutdown()
        remove_tree(base)


def _spawns(path: Path) -> list[dict[str, Any]]:
    """The execution log: concatenated JSON objects, one per spawn."""
    text, decoder, pos, out = path.read_text(), json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)


def _test_spawn(spawns: list[dict[str, Any]], test: str) -> dict[str, Any]:
    """The spawn that runs ``test`` (not its test.xml spawn, also a TestRunner)."""
    found = [s for s in spawns if s.get("mnemonic") == "TestRunner" and s.get("commandArgs", [])[-1:] == [test]
             and s["commandArgs"][0].endswith("test-setup.sh")]
    assert len(found) == 1, [s.get("commandArgs") for s in spawns]
    return found[0]


def _platform(spawn: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in spawn.get("platform", {}).get("properties", [])}


def test_test_action_carries_the_declared_properties(ws: tuple[Path, Bazel]) -> None:
    root, bazel = ws
    log = root.parent / "exec.json"
    res = bazel.test(("//remote:all",), flags=[f"--execution_log_json_file={log}"], bep_path=root.parent / "bep.json")
    assert res.returncode == 0, res.stderr[-3000:]
    outcomes = parse_bep(root.parent / "bep.json").outcomes
    assert set(outcomes) == {"//remote:h100_test", "//remote:cpu_test", "//remote:exec_props_test"}
    assert all(o.passed for o in outcomes.values())
    spawns = _spawns(log)
    assert _platform(_test_spawn(spawns, "remote/h100_test")) == H100
    assert _platform(_test_spawn(spawns, "remote/cpu_test")) == {}


def test_aquery_shows_the_test_action_but_not_its_properties(ws: tuple[Path, Bazel]) -> None:
    root, bazel = ws
    res = bazel.run("aquery", ['mnemonic("TestRunner", //remote:h100_test)', "--output=textproto"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'mnemonic: "TestRunner"' in res.stdout and 'arguments: "remote/h100_test"' in res.stdout
    # A measured 4.2.3 fact (docs/REMOTE.md): aquery omits execution properties. A newer
    # Bazel that prints them must print the declared ones.
    if "gpu-kind" in res.stdout:
        assert all(value in res.stdout for value in H100.values()), res.stdout


def test_declaration_reaches_the_py_test(ws: tuple[Path, Bazel]) -> None:
    _, bazel = ws
    h100 = bazel.query("//remote:h100_test", output="build")
    assert ('exec_properties = {"gpus": "2", "gpu-kind": "h100-80gb", "Pool": "gpu-h100", '
            '"container-image": "docker://example/trainer:1"}') in h100, h100
    cpu = bazel.query("//remote:cpu_test", output="build")
    assert "exec_properties =" not in cpu, cpu


def test_bad_declaration_fails_loading_with_the_attribute_named(ws: tuple[Path, Bazel]) -> None:
    root, bazel = ws
    res = bazel.run("query", ["//bad:all"])
    assert res.returncode != 0
    assert 'gpu_test //bad:kind_without_gpus_test: attribute gpu_kind: "a100" needs gpus > 0' in res.stderr, res.stderr[-2000:]
