"""The Bazel rules obey a plan only on the tree it was made for (issue 9 item 6), real Bazel 4.2.3.

tests/bazel_fixture copied into a temporary git repository, one output base,
three `bazel test --config=fastci` runs through fastci.integrations.bazel.runner (which
passes FASTCI_TREE_DIGEST the way rules/bazelw does):

1. a plan made for the tree on disk is obeyed;
2. a tracked file edited after planning: every gpu_test runs at full workload,
   and the rules say why;
3. a plan made for a dirty tree, then that tree committed (and an empty commit
   on top): same content, same tree, the plan is obeyed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.bep import BuildReport, parse_bep
from fastci.integrations.bazel.runner import Bazel, BazelResult
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.integrations.git.tree import head_tree, worktree_tree
from selection_support import Repo
from bazel_support import remove_tree, require_bazel

REPO = Path(__file__).resolve().parents[1]
A, B, C = "//gputests:a_test", "//gputests:b_test", "//gputests:c_test"

require_bazel()  # skips without bazel; fails under CI


class Ws:
    def __init__(self, base: Path) -> None:
        self.root = base / "ws"
        shutil.copytree(REPO / "tests" / "bazel_fixture", self.root)
        ws = self.root / "WORKSPACE"
        ws.write_text(ws.read_text().replace('path = "../.."', f'path = "{REPO}"'))
        (self.root / ".bazelrc").write_text(
            f"import {REPO}/.bazelrc\nbuild --repo_env=FASTCI_PYTHON={sys.executable}\n")
        (self.root / ".gitignore").write_text("/bazel-*\n/.fastci/plan.json\n/bep.json\n__pycache__/\n")
        (self.root / "README.md").write_text("fixture\n")
        self.repo = Repo(self.root)
        self.repo.commit()
        self.bazel = Bazel(self.root, startup=[f"--output_base={base / 'out'}"], python=sys.executable)
        self.locks = base / "locks"

    def plan(self, tree: str) -> Plan:
        plan = Plan(mode="selective", reason="a and c", tree=tree,
                    tests=(PlannedTest(A, {"train_iters": 2}), PlannedTest(C)),
                    skipped=(SkippedTest(B, "not affected"),))
        dump_plan(plan, self.root / ".fastci/plan.json")
        return plan

    def test(self) -> tuple[BazelResult, BuildReport]:
        bep = self.root / "bep.json"
        res = self.bazel.test(["//gputests:all"], flags=[
            "--config=fastci", "--test_env=FASTCI_FAKE_GPUS=0,1",
            f"--test_env=FASTCI_GPU_LOCK_DIR={self.locks}", "--jobs=4", "--local_test_jobs=3",
        ], bep_path=bep)
        assert res.returncode == 0, res.stderr[-3000:]
        return res, parse_bep(bep)

    def status(self, label: str) -> str:
        data = testlogs.read_output(self.root / "bazel-testlogs", label, "fastci_workload.json")
        assert data is not None, label
        return str(json.loads(data)["plan_status"])


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ws]:
    base = tmp_path_factory.mktemp("stale_plan")
    w = Ws(base)
    try:
        yield w
    finally:
        w.bazel.shutdown()
        remove_tree(base)


def test_rules_obey_a_plan_only_on_its_tree(ws: Ws) -> None:
    clean = worktree_tree(ws.root)
    assert clean == head_tree(ws.root)
    ws.plan(clean)
    res, report = ws.test()
    assert sorted(report.outcomes) == [A, C] and report.skipped == (B,)
    assert ws.status(A) == "ok: selective plan: planned: overrides train_iters=2"
    assert "FastCI plan: WARNING" not in res.stderr

    # Edit a tracked file that no test reads: the plan describes another tree now.
    ws.repo.write({"README.md": "fixture, edited after the plan was made\n"})
    edited = worktree_tree(ws.root)
    res, report = ws.test()
    assert sorted(report.outcomes) == [A, B, C] and report.skipped == ()
    assert (f"FastCI plan: WARNING: plan made for tree {clean}, this tree is {edited}: "
            "every gpu_test runs at full workload") in res.stderr
    for label in (A, B, C):
        assert ws.status(label) == (f"fallback: plan made for tree {clean}, not for this tree; "
                                    "every gpu_test runs at full workload")

    # A plan for the edited (dirty) tree stays valid once that tree is committed, and
    # after an empty commit: the tree is the content, not the commit.
    ws.plan(edited)
    ws.repo.commit(msg="commit the edit")
    ws.repo.commit(msg="nothing")
    assert worktree_tree(ws.root) == head_tree(ws.root) == edited
    res, report = ws.test()
    assert sorted(report.outcomes) == [A, C] and report.skipped == (B,)
    assert "FastCI plan: WARNING" not in res.stderr
    assert ws.status(A) == "ok: selective plan: planned: overrides train_iters=2"


def test_one_plan_path_bazel_obeys_the_plan_fastci_run_runs(ws: Ws) -> None:
    """Issue 34 item 6, both reported cases, with the real Bazel.

    1. A README-style hand-written plan (no `tree`) left in .fastci/plan.json skipped a
       test and reduced another even under `fastci run --plan all.json` ("run
       everything"): the rules always read .fastci/plan.json.
    2. A change that commits its own tree-less .fastci/plan.json and points `plan:`
       elsewhere skipped its own tests under `fastci run` and plain `bazel test`.
    Now `fastci run` hands Bazel the plan it runs, and a plan tied to no tree or
    committed is never obeyed.
    """
    from fastci.config import Config
    from fastci.run.runner import execute

    flags = ("--test_env=FASTCI_FAKE_GPUS=0,1", f"--test_env=FASTCI_GPU_LOCK_DIR={ws.locks}",
             "--jobs=4", "--local_test_jobs=3")
    readme = Plan(mode="selective", reason="try a quickly",
                  tests=(PlannedTest(A, {"train_iters": 2}),),
                  skipped=(SkippedTest(B, "not today"),))
    dump_plan(readme, ws.root / ".fastci/plan.json")
    config = Config(targets="//gputests:all")
    lines: list[str] = []
    everything = ws.root / "all.json"  # `fastci run --plan all.json`
    report = execute(ws.root, Plan.run_all("run everything"), config, bazel=ws.bazel,
                     flags=flags, echo=lines.append, source=everything)
    assert report.report is not None and sorted(report.report.outcomes) == [A, B, C], lines
    assert report.report.skipped == ()
    for label in (A, B, C):
        assert ws.status(label) == "ok: mode all: runs at full workload"

    # Plain `bazel test --config=fastci` reads the hand-written plan itself: tied to no
    # tree, it is not obeyed either, and the rules say why in one line.
    res, report2 = ws.test()
    assert sorted(report2.outcomes) == [A, B, C] and report2.skipped == ()
    assert "FastCI plan: WARNING: the plan names no `tree`, so it is tied to no tree" in res.stderr
    assert ws.status(A) == ("fallback: the plan names no `tree`; every gpu_test runs at "
                            "full workload")

    # 2. The change commits its own tree-less plan and points `plan:` elsewhere.
    ws.repo.write({"fastci.yaml": "plan: .fastci/elsewhere.json\n"})
    ws.repo.git("add", "-f", ".fastci/plan.json")
    ws.repo.commit(msg="a change that chooses its own plan")
    # `fastci run` (the config's plan file does not exist: everything runs; it never
    # falls back to reading .fastci/plan.json) ...
    lines = []
    report = execute(ws.root, Plan.run_all("no plan file"), Config(targets="//gputests:all",
                     plan=".fastci/elsewhere.json"), bazel=ws.bazel, flags=flags,
                     echo=lines.append, source=ws.root / ".fastci/elsewhere.json")
    assert report.report is not None and sorted(report.report.outcomes) == [A, B, C], lines
    assert ws.status(A) == "ok: mode all: runs at full workload"
    # ... and `fastci run --plan .fastci/plan.json`, the committed plan, even tied to
    # this very tree: a committed plan is never obeyed.
    committed = dataclasses.replace(readme, tree=worktree_tree(ws.root))
    lines = []
    report = execute(ws.root, committed, config, bazel=ws.bazel, flags=flags,
                     echo=lines.append, source=ws.root / ".fastci/plan.json")
    assert report.report is not None and sorted(report.report.outcomes) == [A, B, C], lines
    assert report.warning is not None and "is tracked by git: a committed plan is never obeyed" \
        in report.warning
    assert lines[0].startswith("fastci run: WARNING: the plan file plan.json")
    # Plain Bazel on the committed (tree-less) plan: everything, with the reason.
    res, report2 = ws.test()
    assert sorted(report2.outcomes) == [A, B, C] and report2.skipped == ()
    assert "the plan names no `tree`" in res.stderr
