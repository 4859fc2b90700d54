"""``fastci eval`` end to end on a small pytest repository: real runs, real plans.

The repository has three library functions and a test each, plus a test that uses
two of them. Its history: a base commit, a harmless commit (a docstring), a commit
that breaks ``mul``. The evaluation must run everything and the plan for real,
find the broken commit detected by the plan and by run-all, keep the user's
checkout, store and plan untouched, cache run-all per tree, and write results that
read back and merge.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastci import cli
from fastci.eval.results import read_results

LIB = '''
def add(a, b):
    return a + b


def mul(a, b):
    return a * b


def neg(a):
    return -a
'''

TESTS = '''
import lib


def test_add():
    assert lib.add(2, 3) == 5


def test_mul():
    assert lib.mul(2, 3) == 6


def test_neg():
    assert lib.neg(4) == -4


def test_both():
    assert lib.add(lib.mul(2, 2), 1) == 5
'''


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("evalrepo")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    (root / "lib.py").write_text(textwrap.dedent(LIB))
    (root / "test_lib.py").write_text(textwrap.dedent(TESTS))
    (root / ".gitignore").write_text(".fastci/\n__pycache__/\n")
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    (root / "lib.py").write_text(textwrap.dedent(LIB).replace(
        "def neg(a):\n", 'def neg(a):\n    """Negate."""\n'))
    _git(root, "commit", "-q", "-am", "docs: neg")
    (root / "lib.py").write_text(textwrap.dedent(LIB).replace(
        "def neg(a):\n", 'def neg(a):\n    """Negate."""\n').replace("a * b", "a * b + 1"))
    _git(root, "commit", "-q", "-am", "mul: off by one")
    return root


@pytest.fixture(scope="module")
def evaluated(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int, str]:
    out = tmp_path_factory.mktemp("evalout")
    work = tmp_path_factory.mktemp("evalwork") / "w"
    head = _git(repo, "rev-parse", "HEAD")
    env = {"OMP_NUM_THREADS": "1", "FASTCI_PROGRESS": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        rc = cli.main(["eval", "HEAD~2..HEAD", "--root", str(repo), "--out", str(out),
                       "--workdir", str(work), "--gpu-slots", "2"])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out, work, rc, head


def test_every_commit_has_a_result(evaluated: tuple[Path, Path, int, str], repo: Path) -> None:
    out, _work, rc, head = evaluated
    results = read_results(out / "results.jsonl")
    assert [r.kind for r in results] == ["commit", "commit"]
    docs, bug = results
    assert bug.change == f"commit:{head[:12]}" and bug.title == "mul: off by one"
    assert rc == 0  # nothing missed
    # run-all really ran the four tests each time
    assert docs.run_all.tests == 4 and bug.run_all.tests == 4
    assert all(t.all_outcome == "passed" for t in docs.tests)
    assert sorted(bug.run_all.failing) == ["test_lib.py::test_both", "test_lib.py::test_mul"]


def test_the_plan_is_selective_and_catches_the_bug(evaluated: tuple[Path, Path, int, str]) -> None:
    out = evaluated[0]
    docs, bug = read_results(out / "results.jsonl")
    # A docstring changes nothing a test can see: nothing runs.
    assert docs.plan_mode == "selective" and docs.fastci.tests == 0
    assert docs.fastci.gpu_s == 0 and docs.run_all.gpu_s > 0
    # The broken mul: exactly the tests that ran mul, and both fail in the plan too.
    planned = sorted(t.id for t in bug.tests if t.planned)
    assert planned == ["test_lib.py::test_both", "test_lib.py::test_mul"]
    assert bug.detected and not bug.missed
    assert sorted(bug.fastci.failing) == planned
    assert bug.fastci.gpu_s < bug.run_all.gpu_s
    # Retention: the changed line ran in run-all and in the plan's runs.
    assert bug.changed_lines == 1 and bug.retained_lines == 1
    assert bug.fastci.ttff_s is not None and bug.fastci.apfdc is not None
    assert bug.settings["gpu_slots"] == 2 and bug.settings["runner"] == "pytest"
    # Every strategy's order of the planned tests, scored on run-all's runs; both
    # planned tests fail, so any order finds the change with its first test (at least
    # half of the cost is still ahead); each test a fault, the second one counts too.
    from fastci.select.priority import STRATEGIES

    assert set(bug.strategies) == set(STRATEGIES)
    for measures in bug.strategies.values():
        assert 0.0 < measures["tests"] <= measures["change"] <= 1.0
        assert measures["change"] >= 0.5
    assert docs.strategies == {}  # nothing failed: nothing to score


def test_strategy_apfdc_scores_each_order_on_the_same_runs() -> None:
    from fastci.eval.harness import strategy_apfdc
    from fastci.eval.metrics import Job

    jobs = [Job("a", 1, 10.0, False), Job("b", 2, 5.0, True), Job("c", 0, 30.0, True)]
    got = strategy_apfdc({"first": ["b", "a", "c"], "last": ["a", "c", "b"], "none": ["a"]},
                         jobs, ["b", "c"])
    # Slot costs: a 10, b 10 (5 s x 2 GPUs), c 30; total 50.
    assert got["first"] == {"change": pytest.approx(1 - 5 / 50),
                            "tests": pytest.approx((45 + 15) / 100)}
    assert got["last"]["change"] == pytest.approx((40 - 15) / 50)
    assert "none" not in got  # its order holds no failing test


def test_reports_are_written(evaluated: tuple[Path, Path, int, str]) -> None:
    out = evaluated[0]
    assert (out / "report.html").read_text().count("<svg") >= 3
    summary = (out / "summary.md").read_text()
    assert "mul: off by one" in summary


def test_user_checkout_is_untouched(evaluated: tuple[Path, Path, int, str], repo: Path) -> None:
    assert _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "rev-parse", "HEAD") == evaluated[3]
    assert not (repo / ".fastci").exists()  # no store, no plan written in the checkout


def test_run_all_is_cached_per_tree(evaluated: tuple[Path, Path, int, str], repo: Path) -> None:
    out, work, _rc, _head = evaluated
    rc = cli.main(["eval", "HEAD", "--root", str(repo), "--out", str(out), "--workdir",
                   str(work), "--gpu-slots", "2"])
    assert rc == 0
    results = read_results(out / "results.jsonl")
    assert len(results) == 2  # the same change under the same settings: one line, the newer
    assert results[-1].run_all_cached and results[-1].timing["cached"] > 0


def test_merge_of_two_result_files(evaluated: tuple[Path, Path, int, str], tmp_path: Path) -> None:
    out = evaluated[0]
    lines = (out / "results.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text(lines[0] + "\n")
    (tmp_path / "b.jsonl").write_text(lines[1] + "\n")
    merged = tmp_path / "merged"
    rc = cli.main(["eval", "--from", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                   "--out", str(merged)])
    assert rc == 0
    assert [r.change for r in read_results(merged / "results.jsonl")] == \
        [json.loads(line)["change"] for line in lines]
    assert (merged / "report.html").is_file()


def test_faults_are_seeded_and_evaluated(repo: Path, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    rc = cli.main(["eval", "HEAD", "--faults", "1", "--root", str(repo), "--out", str(out),
                   "--workdir", str(work)])
    results = read_results(out / "results.jsonl")
    faults = [r for r in results if r.kind == "fault"]
    assert len(faults) == 1  # one changed unit (mul), one fault per unit
    fault = faults[0]
    assert fault.parent == results[0].change and fault.fault["unit"] == "lib.py::mul"
    assert rc == (1 if fault.missed else 0)
    assert not fault.missed, fault.missed


def test_a_corrupt_results_file_is_kept_and_named(repo: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("{not json\n")
    rc = cli.main(["eval", "HEAD", "--root", str(repo), "--out", str(out), "--workdir",
                   str(tmp_path / "w")])
    assert rc != 0
    assert "results.jsonl:1: not JSON" in capsys.readouterr().err
    assert (out / "results.jsonl").read_text() == "{not json\n"


def _eval_head_with_broken(name: str, error: Exception, repo: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> tuple[int, Any]:
    """``fastci eval HEAD`` with ``fastci.eval.harness.<name>`` raising ``error``: its exit
    code and the change's one result."""
    from fastci.eval import harness

    def broken(*args: object, **kwargs: object) -> object:
        raise error

    monkeypatch.setattr(harness, name, broken)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("FASTCI_PROGRESS", "0")
    out = tmp_path / "out"
    rc = cli.main(["eval", "HEAD", "--root", str(repo), "--out", str(out),
                   "--workdir", str(tmp_path / "work")])
    (result,) = read_results(out / "results.jsonl")
    return rc, result


def test_a_failed_analysis_is_evaluated_as_running_everything(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When FastCI's analysis fails, the evaluation scores the run-all plan that
    `fastci plan` leaves behind (the safe side), names the error, and misses nothing."""
    from fastci.errors import StoreError

    rc, bug = _eval_head_with_broken("analyze", StoreError("evidence.db: not a FastCI store"),
                                     repo, tmp_path, monkeypatch)
    assert bug.plan_mode == "all" and "not a FastCI store" in bug.plan_reason
    assert sorted(t.id for t in bug.tests if t.planned) == sorted(t.id for t in bug.tests)
    assert bug.fastci.tests == bug.run_all.tests == 4
    assert bug.detected and not bug.missed and rc == 0
    assert sorted(bug.fastci.failing) == ["test_lib.py::test_both", "test_lib.py::test_mul"]


def test_strategies_that_cannot_be_ordered_leave_the_plan_alone(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The strategies' orders are the comparison's, not the plan's: when they fail, the
    change is evaluated with FastCI's plan as usual and compares no strategy."""
    rc, bug = _eval_head_with_broken("strategy_orders", RuntimeError("contexts unreadable"),
                                     repo, tmp_path, monkeypatch)
    assert bug.plan_mode == "selective" and bug.detected and not bug.missed and rc == 0
    assert bug.strategies == {}
    assert "contexts unreadable" in caplog.text
