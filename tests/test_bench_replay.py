"""The replay benchmark's machinery on a small pytest project (issue 12): a history with
partial re-records, a second edit to an already edited file, a bug and its fix."""

from __future__ import annotations

import os
from pathlib import Path

from bench import replay
from fastci.select.decisions import Decision, DecisionKind, Reason
from selection_support import Repo

ANALYZER = Path(__file__).resolve().parents[1] / "analyzer"

FILES = {
    ".gitignore": "__pycache__/\n.fastci/\n",
    "lib.py": "def u1(x):\n    return x + 1\n\n\ndef u2(x):\n    return x * 2\n",
    "test_a.py": "import lib\n\n\ndef test_a():\n    assert lib.u1(1) == 2\n",
    "test_b.py": "import lib\n\n\ndef test_b():\n    assert lib.u2(2) == 4\n",
    "test_c.py": "def test_c():\n    assert 1 + 1 == 2\n",
}

HISTORY = (
    replay.edit("u1 rewritten", "code", "lib.py", "return x + 1", "return 1 + x"),
    # u2 is in the file u1's change touched; test_a was re-recorded after it.
    replay.edit("u2 rewritten", "code", "lib.py", "return x * 2", "return 2 * x"),
    replay.edit("u2 broken", "bug", "lib.py", "return 2 * x", "return 3 * x"),
    replay.edit("u2 fixed", "fix", "lib.py", "return 3 * x", "return 2 * x"),
    replay.edit("notes", "docs", "NOTES.md", "", "notes\n"),
)


def test_replay_selects_each_change_once_and_misses_nothing(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo")
    repo.commit(FILES)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo.root), str(ANALYZER)]),
               OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    run_all = replay.pytest_run_all(repo.root, ["."], env)
    said: list[str] = []
    rows = replay.replay(repo.root, HISTORY, run_all, tmp_path / "work", echo=said.append)
    assert [(r.step, r.selected, r.total) for r in rows] == [
        ("u1 rewritten", 1, 3), ("u2 rewritten", 1, 3), ("u2 broken", 1, 3),
        ("u2 fixed", 1, 3), ("notes", 0, 3)]
    assert rows[2].failing == ("test_b.py::test_b",) and not rows[3].failing
    assert all(not r.missed and not r.reselected for r in rows), said
    assert "recorded every test at the first commit: 3 tests" in said[0]
    assert replay.summary(rows)[0].endswith("OK")


def _decision(test: str, *reasons: Reason) -> Decision:
    return Decision(test, reasons)


def test_reselection_is_counted_only_for_refreshed_tests_and_old_paths() -> None:
    unit = Reason(DecisionKind.CHANGED_UNIT, "runs lib.py::u1", unit="lib.py::u1")
    read = Reason(DecisionKind.READ_CHANGED_FILE, "read data.txt", path="data.txt")
    failed = Reason(DecisionKind.FAILED_LAST, "failed")
    skip = Reason(DecisionKind.NOT_AFFECTED, "no")
    decisions = [_decision("t_unit", unit), _decision("t_read", read),
                 _decision("t_failed", unit, failed), _decision("t_skip", skip),
                 _decision("t_stale", unit)]
    refreshed = {"t_unit", "t_read", "t_failed", "t_skip"}  # t_stale was not re-recorded
    assert replay.reselected(decisions, refreshed, {"lib.py", "data.txt"}) == []
    assert replay.reselected(decisions, refreshed, {"lib.py"}) == ["t_read"]
    assert replay.reselected(decisions, refreshed, {"data.txt"}) == ["t_unit"]
    assert replay.reselected(decisions, refreshed, {"other.py"}) == ["t_read", "t_unit"]


def test_a_miss_or_a_reselection_fails_the_summary() -> None:
    ok = replay.Row("s", "k", 1, 3, (), (), (), 0.1, "selective")
    missed = replay.Row("s", "k", 1, 3, ("t",), ("t",), (), 0.1, "selective")
    again = replay.Row("s", "k", 1, 3, (), (), ("t",), 0.1, "selective")
    assert replay.summary([ok])[0].endswith("OK")
    assert replay.summary([ok, missed])[0].endswith("FAILED")
    assert replay.summary([again])[0].endswith("FAILED")
    assert "MISS: t" in replay.format_row(1, missed)
