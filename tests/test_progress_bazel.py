"""Progress of ``record_tests`` with the real Bazel 4.2.3 on tests/bazel_fixture."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from bazel_support import fixture_workspace, remove_tree, require_bazel
from fastci.evidence.fill import record_tests
from fastci.integrations.bazel.runner import Bazel
from fastci.progress import Progress
from test_progress import FINAL

require_bazel()  # skips without bazel; fails under CI


def test_record_with_real_bazel_counts_the_fixtures_tests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fixture_workspace(tmp_path / "ws")
    bazel = Bazel(root, startup=[f"--output_base={tmp_path / 'out'}"], python=sys.executable)
    try:
        # Log mode (stderr is captured: no terminal), a line at most every half second.
        progress = Progress(None, "record", log_every_s=0.5)
        rec = record_tests(root, ["//..."], tmp_path / "e.db", bazel=bazel, progress=progress)
    finally:
        bazel.shutdown()
        remove_tree(tmp_path / "out")
        shutil.rmtree(root, ignore_errors=True)
    err = capsys.readouterr().err
    assert rec.summary.splitlines()[0] == "3 passed, 0 failed"
    lines = [line for line in err.splitlines() if line.startswith("fastci: record:")]
    assert "\r" not in err and lines, err
    # The total is the three gpu_tests Bazel configured (not the py_library beside them).
    assert FINAL.match(lines[-1]) and FINAL.match(lines[-1]).groups() == ("record", "3", "3"), err  # type: ignore[union-attr]
    assert all(re.match(r"fastci: record: \d+(/3)? tests?, \d\d:\d\d elapsed", x) for x in lines[:-1])
    assert (progress.n, progress.total) == (3, 3) and progress.last.endswith(" PASSED")
