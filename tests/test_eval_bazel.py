"""``fastci eval`` through the real Bazel 4.2.3, on a git copy of tests/bazel_fixture.

Two commits after the base: one breaks ``b_test`` in its own main file (the plan
must select exactly it), one only adds a comment to ``c_test`` (nothing to run).
Every gpu_test really runs in the scratch worktree with the repository's
interpreter, recorded in line mode.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from bazel_support import fixture_workspace, remove_tree, require_bazel
from fastci import cli
from fastci.eval.results import read_results

require_bazel()  # skips without bazel; fails under CI

B = "//gputests:b_test"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, int]]:
    base = tmp_path_factory.mktemp("evalbazel")
    ws = fixture_workspace(base / "ws")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.email", "t@example.com")
    _git(ws, "config", "user.name", "t")
    (ws / ".gitignore").write_text("/bazel-*\n/.fastci/*\n!/.fastci/BUILD*\n__pycache__/\n")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "base")
    main = ws / "gputests" / "b_test.py"
    main.write_text(main.read_text() + "\nraise SystemExit('b is broken')\n")
    _git(ws, "commit", "-q", "-am", "break b")
    main = ws / "gputests" / "c_test.py"
    main.write_text("# a comment only\n" + main.read_text())
    _git(ws, "commit", "-q", "-am", "comment in c")
    out, work = base / "out", base / "work"
    os.environ["FASTCI_PROGRESS"] = "0"
    try:
        rc = cli.main(["eval", "HEAD~2..HEAD", "--bazel", "--root", str(ws), "--out", str(out),
                       "--workdir", str(work), "--gpu-slots", "1"])
    finally:
        os.environ.pop("FASTCI_PROGRESS", None)
    yield ws, out, rc
    subprocess.run(["bazel", "shutdown"], cwd=work / "tree", capture_output=True, check=False)
    remove_tree(base)


def test_the_broken_test_is_planned_and_caught(evaluated: tuple[Path, Path, int]) -> None:
    _ws, out, rc = evaluated
    assert rc == 0
    broken, comment = read_results(out / "results.jsonl")
    assert broken.title == "break b" and broken.settings["runner"] == "bazel"
    assert broken.run_all.tests == 3 and broken.run_all.failing == (B,)
    assert [t.id for t in broken.tests if t.planned] == [B]
    assert broken.detected and not broken.missed
    assert broken.fastci.gpu_s < broken.run_all.gpu_s
    outcomes = {t.id: t.all_outcome for t in broken.tests}
    assert outcomes == {"//gputests:a_test": "passed", B: "failed", "//gputests:c_test": "passed"}
    # The raise is the changed line; b_test's main ran it under run-all and in the plan.
    assert broken.changed_lines == 1 and broken.retained_lines == 1


def test_evidence_is_refreshed_between_commits(evaluated: tuple[Path, Path, int]) -> None:
    _broken, comment = read_results(evaluated[1] / "results.jsonl")
    # The comment changes nothing a test runs; b_test still fails (broken by the parent),
    # and the plan knows it from the parent's run-all, ingested as evidence: it runs
    # exactly b_test again, and nothing is missed.
    assert comment.plan_mode == "selective"
    assert [t.id for t in comment.tests if t.planned] == [B]
    assert "failed" in next(t.why for t in comment.tests if t.id == B)
    assert comment.run_all.failing == (B,) and comment.fastci.failing == (B,)
    assert not comment.missed and comment.changed_lines == 0


def test_the_executor_hands_the_planner_what_bazel_query_declares(
        evaluated: tuple[Path, Path, int]) -> None:
    """The plan of an evaluated change reuses the executor's `bazel query` (one query per
    change, not two): it must be exactly what the planner's own query declares."""
    from fastci.config import load
    from fastci.eval.execute import BazelExecutor
    from fastci.plan.inputs import bazel_declared

    ws = evaluated[0]
    config = load(ws)
    executor = BazelExecutor(ws, config)
    try:
        assert executor.declared() is None  # nothing read yet: the planner asks itself
        assert set(executor.universe()) == {"//gputests:a_test", B, "//gputests:c_test"}
        declared = executor.declared()
        assert declared is not None and declared == bazel_declared(ws, config, bazel=executor.bazel)
        assert all(d.srcs for d in declared.values())
    finally:
        executor.close()
