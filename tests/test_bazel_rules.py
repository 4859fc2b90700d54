"""End-to-end tests of //rules with the real Bazel 4.2.3 on tests/bazel_fixture.

One workspace copy and one Bazel server (output base) for the whole module;
every test writes the plan state it needs, and runs go through
fastci.integrations.bazel.runner (so the plan digest knob and venv digest are passed the
way fastci passes them). The order of the tests matters only for speed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastci import cli
from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.bep import BuildReport, parse_bep
from fastci.integrations.bazel.runner import Bazel, BazelResult
from bazel_support import remove_tree, require_bazel
from fastci.integrations.git.tree import worktree_tree
from selection_support import Repo

require_bazel()  # skips without bazel; fails under CI

REPO = Path(__file__).resolve().parents[1]
TESTS = ("//gputests:a_test", "//gputests:b_test", "//gputests:c_test")
FULL = {
    "//gputests:a_test": {"train_iters": 100, "num_layers": 4, "lr": 0.5, "dtype": "bf16", "resume": False},
    "//gputests:b_test": {"train_iters": 50},
    "//gputests:c_test": {"steps": 10},
}

@dataclass
class Workspace:
    root: Path
    bazel: Bazel
    locks: Path
    timings: dict[str, float]

    def write_plan(self, plan: dict[str, Any] | str | None) -> None:
        """Write ``plan``; a selective one is tied to the tree on disk, as `fastci plan` does
        (a plan tied to no tree is not obeyed: issue 34 item 6)."""
        path = self.root / ".fastci" / "plan.json"
        if plan is None:
            path.unlink(missing_ok=True)
            return
        if isinstance(plan, dict) and plan.get("mode") != "all" and "tree" not in plan:
            plan = dict(plan, tree=worktree_tree(self.root))
        path.write_text(plan if isinstance(plan, str) else json.dumps(plan))

    def test(self, *flags: str, targets: tuple[str, ...] = ("//gputests:all",)) -> tuple[BazelResult, BuildReport]:
        bep = self.root / "bep.json"
        start = time.monotonic()
        res = self.bazel.test(
            targets,
            flags=[
                "--test_env=FASTCI_FAKE_GPUS=0,1",
                f"--test_env=FASTCI_GPU_LOCK_DIR={self.locks}",
                "--test_env=FIXTURE_SLEEP_S=1.5",
                "--jobs=4",
                "--local_test_jobs=3",
                "--local_cpu_resources=4",  # start all three at once (2-core CI)
                *flags,
            ],
            bep_path=bep,
        )
        self.timings[f"{len(self.timings)}: test {' '.join(flags) or 'plain'}"] = time.monotonic() - start
        return res, parse_bep(bep)

    def record(self, label: str) -> dict[str, Any]:
        data = testlogs.read_output(self.root / "bazel-testlogs", label, "fastci_workload.json")
        assert data is not None, f"no fastci_workload.json for {label}"
        return json.loads(data)

    def fixture_run(self, label: str) -> dict[str, Any]:
        data = testlogs.read_output(self.root / "bazel-testlogs", label, "fixture_run.json")
        assert data is not None
        return json.loads(data)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    base = tmp_path_factory.mktemp("bazel_rules")
    root = base / "ws"
    shutil.copytree(REPO / "tests" / "bazel_fixture", root)
    (root / "WORKSPACE").write_text((root / "WORKSPACE").read_text().replace('path = "../.."', f'path = "{REPO}"'))
    (root / ".bazelrc").write_text(
        f"import {REPO}/.bazelrc\n"
        f"build --repo_env=FASTCI_PYTHON={sys.executable}\n"
    )
    (root / ".gitignore").write_text("/bazel-*\n/bep.json\n/.fastci/plan.json\n__pycache__/\n")
    Repo(root).commit()  # plans are obeyed only on the tree they name
    bazel = Bazel(root, startup=[f"--output_base={base / 'output_base'}"], python=sys.executable)
    workspace = Workspace(root, bazel, base / "locks", {})
    try:
        yield workspace
    finally:
        bazel.shutdown()
        print("\nbazel e2e timings (s):", json.dumps({k: round(v, 1) for k, v in workspace.timings.items()}))
        remove_tree(base)


def _plan(tests: list[dict[str, Any]], skipped: list[dict[str, Any]], mode: str = "selective") -> dict[str, Any]:
    return {"version": 1, "mode": mode, "reason": "test plan", "tests": tests, "skipped": skipped}


PLAN_A = _plan(
    [{"id": "//gputests:a_test", "overrides": {"train_iters": 2, "num_layers": 2}}, {"id": "//gputests:c_test"}],
    [{"id": "//gputests:b_test", "why": "pruned: same contexts as //gputests:a_test"}],
)
PLAN_B = _plan(
    [{"id": "//gputests:a_test"}, {"id": "//gputests:b_test", "overrides": {"train_iters": 5}}],
    [{"id": "//gputests:c_test", "why": "not affected"}],
)


def test_targets_lists_every_gpu_test_via_bazel_query(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    ws.write_plan(PLAN_A)
    start = time.monotonic()
    try:
        assert cli.main(["targets", "--workspace", str(ws.root), "--json"]) == 0
    finally:
        # The CLI uses the workspace's default output base: stop that server too.
        Bazel(ws.root, python=sys.executable).shutdown()
    ws.timings["cold query"] = time.monotonic() - start
    decls = {d["id"]: d for d in json.loads(capsys.readouterr().out)}
    assert sorted(decls) == list(TESTS)
    a = decls["//gputests:a_test"]
    assert a["workload"] == FULL["//gputests:a_test"]
    assert a["floors"] == {"train_iters": 2, "num_layers": 1}
    assert (a["gpus"], a["scope"], a["constraints"]) == (1, ["convergence"], ["num_layers % 2 == 0"])
    assert a["srcs"] == ["//gputests:a_test.py"] and a["main"] == "a_test.py"
    assert decls["//gputests:c_test"]["gpus"] == 0


def test_plain_run_is_full_workload_on_disjoint_gpus(ws: Workspace) -> None:
    # The plan on disk (PLAN_A) must not matter without --config=fastci.
    res, report = ws.test(targets=("//gputests:all", "@fastci//rules/tests:all"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert report.summary_line() == "7 passed, 0 failed"
    assert set(report.outcomes) == set(TESTS) | {
        "@fastci//rules/tests:validate_test", "@fastci//rules/tests:plan_model_test", "@fastci//rules/tests:constraints_test",
        "@fastci//rules/tests:plan_corpus_test",
    }
    for label in TESTS:
        record = ws.record(label)
        assert (record["mode"], record["workload"], record["plan_status"]) == ("full", FULL[label], "")
        outcome = report.outcomes[label]
        assert outcome.passed and not outcome.cached and outcome.attempts == 1 and outcome.duration_s >= 1.5
    assert ws.fixture_run("//gputests:c_test")["argv"] == ["--extra=yes", "--steps=10"]
    # Two 1-GPU tests ran at the same time on different fake devices.
    a, b = ws.fixture_run("//gputests:a_test"), ws.fixture_run("//gputests:b_test")
    assert a["start"] < b["end"] and b["start"] < a["end"], "a_test and b_test did not overlap"
    assert {a["cuda"], b["cuda"]} == {"0", "1"}
    assert ws.record("//gputests:c_test")["devices"] == []


def test_plan_runs_exactly_planned_tests_with_overrides(ws: Workspace) -> None:
    ws.write_plan(PLAN_A)
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(report.outcomes) == ["//gputests:a_test", "//gputests:c_test"]
    assert report.skipped == ("//gputests:b_test",)
    assert re.search(r"//gputests:b_test +SKIPPED", res.stdout), res.stdout
    a = ws.record("//gputests:a_test")
    assert a["mode"] == "fastci"
    assert a["workload"] == dict(FULL["//gputests:a_test"], train_iters=2, num_layers=2)
    # Only this test's facts (issue 11 item 15): the plan's counts and reason are printed once.
    assert a["plan_status"] == "ok: selective plan: planned: overrides num_layers=2, train_iters=2"
    assert "--train_iters=2" in ws.fixture_run("//gputests:a_test")["argv"]
    assert ws.record("//gputests:c_test")["workload"] == FULL["//gputests:c_test"]


def test_edited_plan_is_picked_up_and_reduced_then_full_reruns(ws: Workspace) -> None:
    ws.write_plan(PLAN_B)
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(report.outcomes) == ["//gputests:a_test", "//gputests:b_test"]
    assert report.skipped == ("//gputests:c_test",)
    # a_test ran reduced before; now it must really run at full workload.
    assert not report.outcomes["//gputests:a_test"].cached
    assert ws.record("//gputests:a_test")["workload"] == FULL["//gputests:a_test"]
    assert ws.record("//gputests:b_test")["workload"] == {"train_iters": 5}


def test_plain_run_after_reduced_runs_reports_full_workload(ws: Workspace) -> None:
    res, report = ws.test()
    assert res.returncode == 0
    assert report.summary_line() == "3 passed, 0 failed"
    for label in TESTS:
        record = ws.record(label)
        assert (record["mode"], record["workload"]) == ("full", FULL[label])


def _test_action_keys(ws: Workspace) -> dict[str, str]:
    res = ws.bazel.run("aquery", ['mnemonic("TestRunner", //gputests:all)', "--output=jsonproto"])
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    labels = {t["id"]: t["label"] for t in data["targets"]}
    return {labels[a["targetId"]]: a["actionKey"] for a in data["actions"]}


def test_skip_toggles_do_not_touch_plain_cache_keys(ws: Workspace) -> None:
    # Which tests the plan skips must not change the cache keys of a plain run
    # (the plan only acts under --config=fastci). aquery's action key includes
    # tags, args and env (a tag toggle changes it: measured).
    ws.write_plan(PLAN_B)
    before = _test_action_keys(ws)
    ws.write_plan(PLAN_A)
    after = _test_action_keys(ws)
    assert sorted(before) == list(TESTS)
    assert after == before


BAD_BUILDS = {
    "bad_gpus": ('gpu_test(name = "t", srcs = ["t.py"], gpus = -1)', "attribute gpus: expected an int >= 0, got -1"),
    "bad_floor": (
        'gpu_test(name = "t", srcs = ["t.py"], workload = {"steps": 4}, floors = {"steps": 8})',
        "attribute floors: steps: floor 8 is above the full value 4",
    ),
    "bad_dim": (
        'gpu_test(name = "t", srcs = ["t.py"], workload = {"steps": 4}, floors = {"layers": 1})',
        'attribute floors: dimension "layers" is not in workload (steps)',
    ),
    "bad_scope": ('gpu_test(name = "t", srcs = ["t.py"], scope = "smoke")', "attribute scope: expected a list of strings"),
}


def test_gpu_test_argument_errors_fail_at_load_time_naming_the_attribute(ws: Workspace) -> None:
    for pkg, (call, _) in BAD_BUILDS.items():
        (ws.root / pkg).mkdir()
        (ws.root / pkg / "BUILD.bazel").write_text(f'load("@fastci//rules:defs.bzl", "gpu_test")\n\n{call}\n')
    try:
        res = ws.bazel.run("query", ["--keep_going", " + ".join(f"//{pkg}:all" for pkg in BAD_BUILDS)])
    finally:
        for pkg in BAD_BUILDS:
            shutil.rmtree(ws.root / pkg)
    assert res.returncode != 0
    for pkg, (_, message) in BAD_BUILDS.items():
        assert f"gpu_test //{pkg}:t: {message}" in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize(
    ("plan", "warning"),
    [
        ('{"version": 1, "mode": ', "plan.json: not valid JSON"),
        (json.dumps(dict(PLAN_A, version=2)), "plan.json: unknown version 2 (this FastCI reads version 1)"),
        (None, "no plan file"),
    ],
    ids=["malformed", "unknown-version", "missing"],
)
def test_bad_or_missing_plan_runs_everything_at_full_workload_loudly(
    ws: Workspace, plan: str | None, warning: str
) -> None:
    ws.write_plan(plan)
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"FastCI plan: fallback: {warning}" in res.stderr
    assert report.summary_line() == "3 passed, 0 failed"
    for label in TESTS:
        record = ws.record(label)
        assert record["workload"] == FULL[label]
        assert record["plan_status"].startswith("fallback: " + warning)
        assert record["plan_status"].endswith("every gpu_test runs at full workload")


def test_empty_selection_succeeds_with_every_test_skipped(ws: Workspace) -> None:
    ws.write_plan(_plan([], [{"id": t, "why": "not affected"} for t in TESTS]))
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert report.outcomes == {} and report.skipped == TESTS
    assert report.summary_line() == "0 passed, 0 failed"
    # No test target at all (e.g. a pattern without tests) is exit 4: also not an error.
    res, report = ws.test("--config=fastci", targets=("//:all",))
    assert res.returncode == 4 and res.no_tests



def _fastci_action_keys(ws: Workspace) -> dict[str, str]:
    res = ws.bazel.run("aquery", ['mnemonic("TestRunner", //gputests:all)', "--output=jsonproto", "--config=fastci"])
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    labels = {t["id"]: t["label"] for t in data["targets"]}
    return {labels[a["targetId"]]: a["actionKey"] for a in data["actions"]}


def test_a_new_plan_keeps_the_cache_key_of_a_test_it_runs_alike(ws: Workspace) -> None:
    # Issue 11 item 15: plan-wide facts (counts, reason, other tests' entries) are not
    # in a test's environment, so two plans that run a_test with the same overrides
    # give it one action key under --config=fastci, and the second reuses its result.
    a = {"id": "//gputests:a_test", "overrides": {"train_iters": 2, "num_layers": 2}}
    one = dict(_plan([dict(a, why="first change")], [{"id": "//gputests:b_test", "why": "not affected"},
                                                     {"id": "//gputests:c_test", "why": "not affected"}]),
               reason="the first change")
    two = dict(_plan([dict(a, why="second change"), {"id": "//gputests:b_test"}],
                     [{"id": "//gputests:c_test", "why": "pruned"}]), reason="the second change, other counts")
    ws.write_plan(one)
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(report.outcomes) == ["//gputests:a_test"]
    first = _fastci_action_keys(ws)
    ws.write_plan(two)
    second = _fastci_action_keys(ws)
    assert second["//gputests:a_test"] == first["//gputests:a_test"]
    assert second["//gputests:b_test"] != first["//gputests:b_test"]  # b's own entry changed
    res, report = ws.test("--config=fastci")
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(report.outcomes) == ["//gputests:a_test", "//gputests:b_test"]
    assert report.outcomes["//gputests:a_test"].cached
    assert not report.outcomes["//gputests:b_test"].cached
    # The plan-wide status is printed once, by the repository rule, not carried by each test.
    assert "FastCI plan: ok: selective plan, 2 tests, 1 skipped (the second change, other counts)" in res.stderr
    assert ws.record("//gputests:b_test")["plan_status"] == "ok: selective plan: planned: runs at full workload (no overrides)"


DECL_BUILD = '''load("@fastci//rules:defs.bzl", "gpu_test")

gpu_test(
    name = "declared_test",
    srcs = ["declared_test.py"],
    workload = {"steps": 10, "tp": 2, "dtype": "bf16"},
    floors = {"steps": 2},
    frozen = ["tp", "dtype"],
    check = "tolerance",
    reference = "relational",
)

gpu_test(
    name = "legacy_test",
    srcs = ["legacy_test.py"],
    workload = {"steps": 10, "tp": 2},
    floors = {"steps": 2},
)
'''
BAD_DECLS = {
    "bad_frozen": ('workload = {"steps": 4, "tp": 2}, floors = {"steps": 1}, frozen = []',
                   "attribute frozen: tp has no floor and is not frozen: give it a floor or list it in frozen"),
    "bad_check": ('check = "bitwise"',
                  'attribute check: expected one of exact, tolerance, threshold, completes, performance, got "bitwise"'),
    "bad_perf": ('workload = {"steps": 4}, floors = {"steps": 1}, check = "performance"',
                 "attribute check: a performance check is never reduced: it takes no floors (got steps)"),
    "bad_reference": ('reference = "golden"', 'attribute reference: expected one of relational, absolute, got "golden"'),
}


def test_reduction_declarations_reach_bazel_query_and_are_validated_at_load_time(ws: Workspace) -> None:
    """Issue 13 item 0: frozen/check/reference in the real fastci_meta, defaults resolved; errors at load time."""
    from fastci.integrations.bazel.query import list_gpu_tests
    from fastci.plan.workload import reducible_dims, reduction_problems

    (ws.root / "decl").mkdir()
    (ws.root / "decl" / "BUILD.bazel").write_text(DECL_BUILD)
    for pkg, (attrs, _) in BAD_DECLS.items():
        (ws.root / pkg).mkdir()
        (ws.root / pkg / "BUILD.bazel").write_text(
            f'load("@fastci//rules:defs.bzl", "gpu_test")\n\ngpu_test(name = "t", srcs = ["t.py"], {attrs})\n')
    try:
        decls = {d.id: d for d in list_gpu_tests(ws.bazel, "//decl/...")}
        res = ws.bazel.run("query", ["--keep_going", " + ".join(f"//{pkg}:all" for pkg in BAD_DECLS)])
    finally:
        for pkg in ["decl", *BAD_DECLS]:
            shutil.rmtree(ws.root / pkg)
    declared, legacy = decls["//decl:declared_test"], decls["//decl:legacy_test"]
    assert (declared.frozen, declared.check, declared.reference, declared.defaulted) == (
        ("dtype", "tp"), "tolerance", "relational", ())
    assert (legacy.frozen, legacy.check, legacy.reference, legacy.defaulted) == (
        ("tp",), "completes", "absolute", ("check", "frozen", "reference"))
    for decl in (declared, legacy):
        assert reduction_problems(decl) == [] and reducible_dims(decl) == {"steps": (2, 10)}
    assert res.returncode != 0
    for pkg, (_, message) in BAD_DECLS.items():
        assert f"gpu_test //{pkg}:t: {message}" in res.stderr, res.stderr[-3000:]
