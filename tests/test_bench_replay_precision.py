"""The precision replay's history and verdict (issue 38), without replaying it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench import replay_precision as rp
from bench.replay import commit

ANALYZER = Path(__file__).resolve().parents[1] / "analyzer"


def test_every_step_applies_and_the_package_suite_passes_at_the_start(tmp_path: Path) -> None:
    root = rp.scratch(tmp_path / "repo")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(ANALYZER)]),
               PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "38 passed, 2 xfailed" in res.stdout, res.stdout
    kinds = set()
    for step in rp.HISTORY:
        step.apply(root)  # raises when a step's text is not where it expects
        commit(root, step.name)
        kinds.add(step.kind)
    assert len(rp.HISTORY) >= 30
    assert {"re-export", "new file", "pin bump", "xfail test", "ordinary edit",
            "fix (strict xpass)"} <= kinds
    assert sum(k.startswith("bug") for k in kinds) >= 4


def _row(fastci: int, peer: int, total: int = 40, missed: tuple[str, ...] = ()) -> rp.Row:
    return rp.Row("s", "k", total, fastci, peer, missed, missed, (), "selective", "", 0.1)


def test_the_verdict_needs_half_the_peer_no_miss_and_no_whole_suite() -> None:
    assert rp.summary([_row(2, 10), _row(3, 10)])[-1] == "  target: met"
    assert "0.25x" in rp.summary([_row(2, 10), _row(3, 10)])[0]
    assert rp.summary([_row(6, 10)])[-1] == "  target: NOT met"  # more than half
    assert rp.summary([_row(1, 10, missed=("t",))])[-1] == "  target: NOT met"
    whole = rp.summary([_row(40, 400), _row(0, 10)])
    assert whole[-1] == "  target: NOT met" and "ran the whole suite: 1 (s)" in whole[1]
