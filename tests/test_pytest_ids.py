"""Test ids of both kinds meet (issue 11 items 4, 7, 12): labels <-> node ids, `fastci run`
on a pytest repository, a plan that matches nothing, a plan that skips everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastci import cli
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.bazel.mains import conventional_main, labels_by_main, main_path, same_test
from fastci.integrations.bazel import query
from fastci.integrations.git.tree import plan_tree
from plan_support import tie
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.run.runner import execute
from fastci.select import Decision, Selection
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.explain import explain

MAIN = '''
def test_one():
    print("RAN one")

def test_two():
    print("RAN two")
'''

OTHER = '''
def test_other():
    print("RAN other")
'''


def _decl(label: str, main: str = "") -> query.TestDecl:
    return query.TestDecl(label, 0, {}, {}, (), (), (), main)


# --------------------------------------------------------------------- the mapping


def test_main_path_of_declarations() -> None:
    assert main_path(_decl("//pkg/tests:foo_test")) == "pkg/tests/foo_test.py"
    assert main_path(_decl("//pkg/tests:foo_test", "sub/run.py")) == "pkg/tests/sub/run.py"
    assert main_path(_decl("//pkg/tests:foo_test", ":run.py")) == "pkg/tests/run.py"
    assert main_path(_decl("//pkg/tests:foo_test", "//pkg/tests:run.py")) == "pkg/tests/run.py"
    assert main_path(_decl("//:top_test")) == "top_test.py"
    assert main_path(_decl("@other//p:t")) is None
    assert conventional_main("examples/x.py::test_y") is None


def test_same_test_both_ways() -> None:
    ids = ["//examples/microllm/tests:tp_parity_test", "//examples/microllm/tests:moe_test",
           "examples/microllm/tests/tp_parity_test.py::test_tp_parity",
           "examples/microllm/tests/tp_parity_test.py::test_other"]
    node = "examples/microllm/tests/tp_parity_test.py::test_tp_parity"
    assert same_test(node, ids) == ["//examples/microllm/tests:tp_parity_test"]
    assert same_test("@//examples/microllm/tests:tp_parity_test", ids) == ids[2:]
    # A declared main that is not <name>.py: only the declaration knows.
    known = {"//p:run_test": "p/driver.py"}
    assert same_test("p/driver.py::test_x", ["//p:run_test"]) == []
    assert same_test("p/driver.py::test_x", ["//p:run_test"], known) == ["//p:run_test"]
    # Two labels claiming one main file: neither is a guess worth making.
    assert labels_by_main(["//p:a", "//p:b"], {"//p:a": "p/m.py", "//p:b": "p/m.py"}) == {}


def test_explain_node_id_of_a_label_recorded_test() -> None:
    label = "//examples/microllm/tests:tp_parity_test"
    sel = Selection((Decision(label, (Reason(DecisionKind.NEW_TEST, "is a new test"),)),))
    lines = explain(sel, "examples/microllm/tests/tp_parity_test.py::test_tp_parity")
    assert lines[0] == f"{label}: RUNS (as examples/microllm/tests/tp_parity_test.py::test_tp_parity)", lines
    node = "pkg/foo_test.py::test_a"
    sel = Selection((Decision(node, (Reason(DecisionKind.NOT_AFFECTED, "not affected"),)),))
    assert explain(sel, "//pkg:foo_test")[0] == f"{node}: SKIPPED (as //pkg:foo_test)"
    assert "not a known test" in explain(sel, "//pkg:bar_test")[0]


# --------------------------------------------------------------------- the plugin


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "pkg" / "tests" / "foo_test.py").write_text(MAIN)
    (root / "pkg" / "tests" / "bar_test.py").write_text(OTHER)
    (root / "pytest.ini").write_text("[pytest]\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / ".gitignore").write_text("__pycache__/\n")
    return root


def _pytest(root: Path, plan: Plan, *extra: str) -> subprocess.CompletedProcess[str]:
    dump_plan(tie(plan, root, root / "plan.json"), root / "plan.json")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "fastci.pytest_plugin", "--fastci-plan", "plan.json", "-s", "-v",
                           "-rw", *extra], cwd=root, capture_output=True, text=True, timeout=120)


def test_plan_of_labels_deselects_the_items_of_their_main_files(tmp_path: Path) -> None:
    root = _project(tmp_path)
    plan = Plan(mode="selective", tests=(PlannedTest("//pkg/tests:bar_test"),),
                skipped=(SkippedTest("//pkg/tests:foo_test", "not affected by the change"),))
    res = _pytest(root, plan)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "RAN other" in out and "RAN one" not in out and "RAN two" not in out
    assert "2 deselected" in out
    # One summary line by default; each deselected test with its reason on request.
    assert "fastci: deselected 2 of 3 tests" in out and "not affected by the change" not in out
    listed = _pytest(root, plan, "--fastci-list-deselected").stdout
    assert "pkg/tests/foo_test.py::test_one (//pkg/tests:foo_test): not affected by the change" in listed


def test_plan_matching_no_collected_test_warns_loudly(tmp_path: Path) -> None:
    root = _project(tmp_path)
    plan = Plan(mode="selective", tests=(PlannedTest("//elsewhere:x_test"),),
                skipped=(SkippedTest("//elsewhere:y_test", "not affected"),
                         SkippedTest("other/test_z.py::test_z", "not affected")))
    res = _pytest(root, plan)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "RAN one" in out and "RAN other" in out  # nothing deselected: the safe side
    assert "WARNING: the plan matched no collected test" in out
    assert "none of the plan's 3 test id(s) matched any of the 3 collected test(s)" in out
    assert "PytestWarning" in out  # in the warnings summary too


def test_plan_skipping_every_collected_test_exits_0(tmp_path: Path) -> None:
    root = _project(tmp_path)
    plan = Plan(mode="selective", reason="nothing affected",
                skipped=(SkippedTest("//pkg/tests:foo_test", "not affected"),
                         SkippedTest("pkg/tests/bar_test.py::test_other", "not affected")))
    res = _pytest(root, plan)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "RAN" not in out and "3 deselected" in out
    assert "the plan skips all 3 collected test(s)" in out and "exit status 0, not 5" in out


def test_nothing_collected_without_a_plan_decision_still_exits_5(tmp_path: Path) -> None:
    root = _project(tmp_path)
    for f in (root / "pkg" / "tests").iterdir():
        f.unlink()
    res = _pytest(root, Plan(mode="selective", skipped=(SkippedTest("//pkg/tests:foo_test", "x"),)))
    assert res.returncode == 5, res.stdout


# --------------------------------------------------------------------- fastci run


FAILING = '''
def test_good():
    print("RAN good")

def test_bad():
    print("RAN bad")
    assert 1 == 2

def test_skipped_by_plan():
    print("RAN skipped_by_plan")
'''


def _commit(root: Path) -> None:
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   cwd=root, check=True)


def test_fastci_run_on_a_pytest_repository_runs_pytest(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = _project(tmp_path)
    (root / "pkg" / "tests" / "bar_test.py").write_text(FAILING)
    (root / ".gitignore").write_text("__pycache__/\n/.fastci/\n")
    _commit(root)
    plan = Plan(mode="selective", tests=(
        PlannedTest("pkg/tests/bar_test.py::test_good"), PlannedTest("pkg/tests/bar_test.py::test_bad")),
        skipped=(SkippedTest("pkg/tests/bar_test.py::test_skipped_by_plan", "not affected"),
                 SkippedTest("//pkg/tests:foo_test", "not affected")),
        tree=plan_tree(root))
    dump_plan(plan, root / ".fastci" / "plan.json")
    rc = cli.main(["run", "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert out.rstrip().endswith("1 passed, 1 failed"), out
    assert "is not a Bazel target" not in out
    assert "PASSED     pkg/tests/bar_test.py::test_good" in out
    assert "FAILED     pkg/tests/bar_test.py::test_bad" in out
    assert "2 skipped by the plan" in out  # counted, one line ...
    assert "PASSED     pkg/tests/foo_test.py" not in out  # ... and not run
    assert "PASSED     pkg/tests/bar_test.py::test_skipped_by_plan" not in out
    with EvidenceStore.open(root / ".fastci" / "evidence.db") as store:
        runs = store.latest_runs()
    assert runs["pkg/tests/bar_test.py::test_good"].outcome == "passed"
    assert runs["pkg/tests/bar_test.py::test_bad"].outcome == "failed"
    assert "pkg/tests/bar_test.py::test_skipped_by_plan" not in runs


def test_fastci_run_pytest_planned_test_missing_fails(tmp_path: Path) -> None:
    root = _project(tmp_path)
    _commit(root)
    plan = Plan(mode="selective", tests=(PlannedTest("pkg/tests/gone_test.py::test_gone"),),
                skipped=(SkippedTest("//pkg/tests:foo_test", "x"),
                         SkippedTest("pkg/tests/bar_test.py::test_other", "x")))
    plan = tie(plan, root)
    lines: list[str] = []
    report = execute(root, plan, Config(), echo=lines.append)
    text = "\n".join(lines)
    assert report.failed == 1 and report.passed == 0, text
    assert "NOT RUN    pkg/tests/gone_test.py::test_gone" in text
    assert text.rstrip().endswith("0 passed, 1 failed")
