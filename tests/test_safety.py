"""The safety invariants of selection, each one a test.

Selection never narrows silently: errors, a corrupt store, a missing revision,
an unparsable file, an unknown path or a changed environment widen the plan and
say why; tests without or with incomplete evidence, tests that failed last time
and new or modified tests are selected; and a test that fails under run-all for
a change is always in the plan for that change (checked with real recorded
evidence of a tiny fixture suite, for single and combined buggy edits).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint, Query
from fastci.config import Config
from fastci.evidence.store.ingest import find_traces, ingest as ingest_traces
from fastci.evidence.store.db import EvidenceStore
from fastci.select import DeclaredTest, DecisionKind
from selection_support import MODEL, Repo, World, env_now, ingest, units_of, world  # noqa: F401

# --------------------------------------------------------------------------- widening


def test_corrupt_store_widens(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "A = 1\n"})
    store = tmp_path / ".fastci/evidence.db"
    store.parent.mkdir()
    store.write_bytes(b"this is not sqlite" * 100)
    declared = {"//t:a": DeclaredTest("//t:a")}
    a = analyze(tmp_path, Config(), base=base, declared=Given(declared), environment=KnownFingerprint("e"))
    assert a.plan.mode == "all" and "not a readable evidence store" in a.plan.reason
    assert [t.id for t in a.plan.tests] == ["//t:a"]


def test_missing_store_and_failing_query_widen(tmp_path: Path) -> None:
    repo = Repo(tmp_path)
    base = repo.commit({"a.py": "A = 1\n"})

    def broken_query(root: Path, config: Config) -> dict[str, DeclaredTest]:
        raise RuntimeError("bazel exploded")

    a = analyze(tmp_path, Config(), base=base, declared=Query(broken_query), environment=KnownFingerprint("e"))
    assert a.plan.mode == "all" and "RuntimeError: bazel exploded" in a.plan.reason
    a = analyze(tmp_path, Config(), base=base, declared=Given({}), environment=KnownFingerprint("e"))
    assert a.plan.mode == "all" and "no evidence store" in a.plan.reason


def test_missing_revision_unknown_path_environment(world: World) -> None:
    a = analyze(world.root, Config(), base="gone", declared=Given(world.declared),
                environment=KnownFingerprint(env_now()), store=world.store)
    assert a.plan.mode == "all" and "'gone' does not exist" in a.plan.reason
    world.repo.write({"weird/path.xyz": "?"})
    sel = world.plan()
    assert sel.mode == "all" and "weird/path.xyz" in sel.widen[0].sentence
    world.repo.write({"weird/path.xyz": None})
    assert len(world.plan(env="another-env").selected) == 3


def test_unparsable_file_widens_to_touching_tests(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL + "\ndef broken(:\n"})
    sel = world.plan()
    assert {d.test for d in sel.selected} == {"//t:a"}
    assert sel.selected[0].reasons[0].kind is DecisionKind.UNPARSABLE_FILE


def test_stale_evidence_is_compared_with_recorded_checksums(world: World) -> None:
    # main moved on after recording (evidence commit = world.base); plan from the new main.
    new_main = world.repo.commit({"pkg/model.py": MODEL.replace("x * 2", "x * 5")})
    a = analyze(world.root, Config(), base=new_main, declared=Given(world.declared),
                environment=KnownFingerprint(env_now()), store=world.store)
    assert [t.id for t in a.plan.tests] == ["//t:a"]


# --------------------------------------------------------------------------- always select


def test_no_incomplete_failed_new_modified_are_selected(world: World) -> None:
    units = units_of(world.root, ["pkg/other.py"])
    ingest(world.store, "//t:c", units, commit=world.base, outcome="failed")
    ingest(world.store, "//t:b", {}, commit=world.base, complete=False)
    world.store.record_result("//t:only_result", outcome="passed", duration_s=1.0, commit=None,
                              gpus=1, workload={}, source="bazel")
    declared = dict(world.declared)
    declared["//t:only_result"] = DeclaredTest("//t:only_result")
    declared["//t:new"] = DeclaredTest("//t:new")
    declared["//t:a"] = DeclaredTest("//t:a", gpus=2)
    sel = world.plan(declared=declared)
    kinds = {d.test: {r.kind for r in d.reasons} for d in sel.selected}
    assert DecisionKind.FAILED_LAST in kinds["//t:c"]
    assert DecisionKind.INCOMPLETE_EVIDENCE in kinds["//t:b"]
    assert DecisionKind.INCOMPLETE_EVIDENCE in kinds["//t:only_result"]
    assert DecisionKind.NEW_TEST in kinds["//t:new"]
    assert DecisionKind.MODIFIED_TEST in kinds["//t:a"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.lists(st.sampled_from(["data/cfg.json", "docs/x.md", "csrc/k.cu", "zzz.bin",
                                       "pkg/model.py", "pkg/data.py"]), unique=True))
def test_more_changes_never_select_fewer(world: World, extra: list[str]) -> None:
    """Monotonicity: adding changed paths to a change never removes a selected test."""
    edits = {"data/cfg.json": '{"x": 1}\n', "docs/x.md": "new\n", "csrc/k.cu": "k\n",
             "zzz.bin": "z", "pkg/model.py": MODEL.replace("x * 2", "x * 7"),
             "pkg/data.py": "import json\n\n\ndef load(path):\n    return {}\n"}
    before = {d.test for d in world.plan().selected}
    world.repo.write({p: edits[p] for p in extra})
    try:
        after = {d.test for d in world.plan().selected}
    finally:
        world.repo.git("checkout", "-q", "--", ".")
        world.repo.git("clean", "-qfd", "-e", ".fastci")
    assert before <= after


# --------------------------------------------------------------------------- fails => selected

LIB_OPS = '''"""Tiny library under test."""
SCALE = 2
ACTIVATIONS = {"double": "double", "inc": "inc"}


def double(x):
    return x * SCALE


def inc(x, step=1):
    return x + step


def apply(name, x):
    fn = {"double": double, "inc": inc}[ACTIVATIONS[name]]
    return fn(x)


class Acc:
    start = 0

    def total(self, xs):
        s = self.start
        for x in xs:
            s += x
        return s
'''
LIB_DATA = '''import json


def load(path):
    with open(path) as f:
        return json.load(f)
'''
CHECKS = '''import os
from lib.ops import Acc, apply, double, inc
from lib.data import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_double():
    assert double(3) == 6


def test_inc():
    assert inc(3) == 4


def test_apply():
    assert apply("inc", 3) == 4


def test_acc():
    assert Acc().total([1, 2]) == 3


def test_data():
    assert load(os.path.join(ROOT, "data", "cfg.json"))["n"] == 3
'''
# Run one check, recorded (argv: name trace_dir) or plain (argv: name).
RUNNER = '''import importlib, sys
from pathlib import Path
name = sys.argv[1]
rec = None
if len(sys.argv) > 2:
    from fastci.evidence.record.recorder import Recorder
    rec = Recorder("//checks:" + name, Path(sys.argv[2]), repo_root=Path.cwd(), workload={}, gpus=1)
    rec.start()
outcome = "passed"
try:
    getattr(importlib.import_module("checks.suite"), name)()
except BaseException as exc:
    outcome = "failed"
if rec is not None:
    rec.stop(outcome)
print(outcome)
'''
CHECK_NAMES = ["test_double", "test_inc", "test_apply", "test_acc", "test_data"]
TESTS = [f"//checks:{n}" for n in CHECK_NAMES]

#: Buggy (and one benign) edits: path -> (old, new).
MUTATIONS: dict[str, tuple[str, str, str]] = {
    "constant": ("lib/ops.py", "SCALE = 2", "SCALE = 3"),
    "default": ("lib/ops.py", "step=1", "step=2"),
    "class_attr": ("lib/ops.py", "start = 0", "start = 1"),
    "registry": ("lib/ops.py", '"inc": "inc"}', '"inc": "double"}'),
    "body": ("lib/ops.py", "return x * SCALE", "return x * SCALE + 1"),
    "loop": ("lib/ops.py", "s += x", "s += x * x"),
    "rename": ("lib/ops.py", "def inc(x", "def increment(x"),
    "syntax": ("lib/ops.py", "class Acc:", "class Acc(:"),
    "data": ("data/cfg.json", '"n": 3', '"n": 4'),
    "loader": ("lib/data.py", "json.load(f)", "{'n': 0}"),
    "benign": ("lib/ops.py", "return fn(x)", "return fn(x)  # same"),
}


def _run(root: Path, name: str, *extra: str) -> str:
    res = subprocess.run([sys.executable, "runner.py", name, *extra], cwd=root,
                         capture_output=True, text=True, timeout=120)
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else "failed"


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Repo, str]]:
    root = tmp_path_factory.mktemp("suite")
    repo = Repo(root)
    base = repo.commit({"lib/__init__.py": "", "lib/ops.py": LIB_OPS, "lib/data.py": LIB_DATA,
                        "checks/__init__.py": "", "checks/suite.py": CHECKS,
                        "data/cfg.json": json.dumps({"n": 3}) + "\n", "runner.py": RUNNER,
                        ".gitignore": "/.fastci/\n/traces/\n__pycache__/\n"})
    for name in CHECK_NAMES:
        assert _run(root, name, str(root / "traces")) == "passed"
    with EvidenceStore.open(root / ".fastci/evidence.db", create=True) as store:
        report = ingest_traces(store, find_traces([root / "traces"]), source="pytest", commit=base)
        assert not report.corrupt and len(store.test_ids()) == 5
    yield repo, base


def _check(repo: Repo, base: str, names: list[str]) -> tuple[set[str], set[str]]:
    """Apply mutations, return (tests failing under run-all, tests in the plan)."""
    root = repo.root
    for n in names:
        path, old, new = MUTATIONS[n]
        text = (root / path).read_text()
        assert old in text, (n, path)
        (root / path).write_text(text.replace(old, new, 1))
    try:
        failing = {f"//checks:{c}" for c in CHECK_NAMES if _run(root, c) != "passed"}
        declared = {t: DeclaredTest(t, 1, {}) for t in TESTS}
        with EvidenceStore.open(root / ".fastci/evidence.db") as store:
            a = analyze(root, Config(), base=base, declared=Given(declared), store=store)
        planned = {t.id for t in a.plan.tests}
    finally:
        repo.git("checkout", "-q", "--", ".")
    return failing, planned


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_failing_under_run_all_is_always_planned(suite: tuple[Repo, str], mutation: str) -> None:
    repo, base = suite
    failing, planned = _check(repo, base, [mutation])
    if mutation == "benign":
        assert failing == set() and planned == set()
    else:
        assert failing, f"{mutation} should break a check"
    assert failing <= planned, f"{mutation}: plan misses {sorted(failing - planned)}"


def test_precision_on_the_fixture(suite: tuple[Repo, str]) -> None:
    """Not a safety property, but the point: a body change does not select everything."""
    repo, base = suite
    failing, planned = _check(repo, base, ["loop"])
    assert failing == planned == {"//checks:test_acc"}


@settings(max_examples=6, deadline=None)
@given(names=st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=2, max_size=4, unique=True))
def test_combined_mutations_failures_are_planned(suite: tuple[Repo, str], names: list[str]) -> None:
    repo, base = suite
    if sum(MUTATIONS[n][0] == "lib/ops.py" and MUTATIONS[n][1] in ("return x * SCALE", "SCALE = 2")
           for n in names) > 1:
        names = names[:1]  # overlapping edits of one line
    failing, planned = _check(repo, base, names)
    assert failing <= planned
