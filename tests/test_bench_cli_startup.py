"""The CLI start-up benchmark's reading of ``python -X importtime`` (bench/cli_startup.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.cli_startup import import_seconds, scratch_repo

_SAMPLE = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |     _io
import time:       300 |        400 |   io
import time:       500 |        900 | encodings
import time:      1000 |       1000 |   fastci.errors
import time:      2000 |       3000 | fastci
import time:        50 |         50 | fastci.cli.app
"""


def test_import_seconds_sums_the_top_level_imports_and_counts_fastci_modules() -> None:
    assert import_seconds(_SAMPLE) == (0.00395, 3)
    assert import_seconds("") == (0.0, 0)


def test_import_seconds_reads_a_real_importtime_profile(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fastci.errors"],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    seconds, ours = import_seconds(res.stderr)
    assert 0 < seconds < 60 and ours == 2  # fastci and fastci.errors


def test_the_scratch_repo_has_two_tests_and_a_change(tmp_path: Path) -> None:
    scratch_repo(tmp_path)
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, text=True,
                             capture_output=True, check=True).stdout.split()
    assert changed == ["M", "pkg/model.py"]
    assert (tmp_path / "tests" / "test_model.py").read_text().count("def test_") == 2
