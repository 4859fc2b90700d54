"""``fastci eval`` with a calibration: the plan's reduced test really runs reduced.

A pytest project whose ``test_train`` declares ``steps`` 8 with a floor of 2 is
calibrated (``fastci calibrate --no-bazel``); the change edits ``prepare``, which
every rung executes in the same context, so the plan runs ``test_train`` at its
floor. The evaluation must run it reduced (not reuse run-all's full run), measure
it cheaper, keep the changed line covered, and see the same outcome.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from calibrate_support import TRAIN_TESTS, work_source
from fastci import cli
from fastci.eval.results import read_results
from selection_support import Repo

WORK = work_source(0.05)
TEST = TRAIN_TESTS
ID = "tests/test_w.py::test_train"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    root = tmp_path_factory.mktemp("evalreduce") / "repo"
    repo = Repo(root)
    repo.commit({"pkg/__init__.py": "", "pkg/work.py": WORK, "tests/__init__.py": "",
                 "tests/test_w.py": TEST, ".gitignore": "__pycache__/\n.fastci/\n"})
    os.environ["FASTCI_PROGRESS"] = "0"
    try:
        assert cli.main(["calibrate", "--no-bazel", "--root", str(root), ID]) == 0
        repo.commit({"pkg/work.py": WORK.replace("base = seed * 3", "base = seed * 4")})
        out = tmp_path_factory.mktemp("out")
        rc = cli.main(["eval", "HEAD", "--root", str(root), "--out", str(out), "--workdir",
                       str(tmp_path_factory.mktemp("work") / "w")])
    finally:
        os.environ.pop("FASTCI_PROGRESS", None)
    return root, out, rc


def test_the_reduced_test_runs_reduced(evaluated: tuple[Path, Path, int]) -> None:
    _root, out, rc = evaluated
    assert rc == 0
    (result,) = read_results(out / "results.jsonl")
    assert result.settings["reduce"] is True
    rows = {t.id: t for t in result.tests}
    train = rows[ID]
    assert train.planned and train.overrides == {"steps": 2} and not train.reused
    assert train.all_outcome == "passed" and train.plan_outcome == "passed"
    # Really run at 2 steps: the sleep is 0.05 s per step, 0.4 s at full workload.
    assert train.plan_s < train.all_s - 0.15
    assert result.fastci.gpu_s < result.run_all.gpu_s
    # The changed line (prepare's body) ran in the reduced run too.
    assert result.changed_lines == 1 and result.retained_lines == 1
    assert result.timing["runs"] > 0


def test_the_users_calibration_is_left_as_it_was(evaluated: tuple[Path, Path, int]) -> None:
    root = evaluated[0]
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""
    assert (root / ".fastci" / "calibration.db").is_file()
    assert not (root / ".fastci" / "evidence.db").exists()
