"""End to end with the real Bazel: record tests/evidence_fixture and ingest its traces.

One workspace copy and one Bazel server (output base) for the module; the
server is shut down at the end.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci import cli
from fastci.integrations.bazel.runner import Bazel
from fastci.evidence.fill import record
from fastci.evidence.store.db import EvidenceStore
from fastci.units.index import FileUnits, index_source
from bazel_support import remove_tree, require_bazel

REPO = Path(__file__).resolve().parents[1]

require_bazel()  # skips without bazel; fails under CI


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    base = tmp_path_factory.mktemp("evidence_bazel")
    root = base / "ws"
    shutil.copytree(REPO / "tests" / "evidence_fixture", root)
    ws = root / "WORKSPACE"
    ws.write_text(ws.read_text().replace('path = "../.."', f'path = "{REPO}"'))
    (root / ".bazelrc").write_text(f"import {REPO}/.bazelrc\n"
                                   f"build --repo_env=FASTCI_PYTHON={sys.executable}\n")
    bazel = Bazel(root, startup=[f"--output_base={base / 'output_base'}"], python=sys.executable)
    store = root / ".fastci" / "evidence.db"
    try:
        summary = record(root, ["//..."], store, bazel=bazel)
        yield root, store, summary
    finally:
        bazel.shutdown()
        remove_tree(base)


def test_record_summary(recorded: tuple[Path, Path, str]) -> None:
    _, _, summary = recorded
    lines = summary.splitlines()
    assert lines[0] == "2 passed, 1 failed"
    assert "3 test(s), 1 with incomplete evidence" in lines[1]
    assert lines[2].startswith("store ") and " 3 tests, " in lines[2]


def test_units_contexts_files_and_children(recorded: tuple[Path, Path, str]) -> None:
    _, store_path, _ = recorded
    with EvidenceStore.open(store_path) as store:
        units = store.units_of_test("//suite:train_test")
        # Runfiles paths were mapped back to repo paths; nothing from @fastci or the venv.
        assert all(u.startswith(("lib/", "suite/")) for u in units), sorted(units)
        assert {"lib/model.py::train", "lib/model.py::step", "lib/model.py::run_child",
                "suite/train_main.py::<module>"} <= set(units)
        assert "lib/model.py::in_child" in units  # ran in a subprocess of the test
        assert "lib/model.py::evaluate" not in units
        assert any("Config(tp=2,dtype='bf16')" in s for s in units["lib/model.py::train"])
        eval_units = store.units_of_test("//suite:eval_test")
        assert any("tp=1" in s for s in eval_units["lib/model.py::step"])
        assert store.files_of_test("//suite:train_test") == ["data/golden.txt"]
        assert store.tests_for_units(["lib/model.py::step"]) == {
            "lib/model.py::step": {"//suite:train_test", "//suite:eval_test"}}
        # Checksums were computed at ingest from the (unchanged) recorded sources.
        model = index_source("lib/model.py", (REPO / "tests/evidence_fixture/lib/model.py").read_bytes())
        assert isinstance(model, FileUnits)
        held = {u: c for _, u, c in store.recorded_units(tests=["//suite:train_test"])}
        assert held["lib/model.py::step"] == model.by_qualname()["step"].checksum
        runs = store.latest_runs()
        train = runs["//suite:train_test"]
        assert (train.outcome, train.complete, dict(train.workload)) == (
            "passed", True, {"steps": 3, "tp": 2})
        assert train.duration_s > 0 and train.env_fingerprint
        crash = runs["//suite:crash_test"]
        assert (crash.outcome, crash.complete) == ("failed", False)  # SIGKILLed mid-recording


def test_ingest_again_changes_nothing(recorded: tuple[Path, Path, str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    root, store_path, _ = recorded
    with EvidenceStore.open(store_path) as store:
        before = store.stats()
    testlogs = root / "bazel-testlogs"
    assert cli.main(["ingest", str(testlogs), "--store", str(store_path)]) == 0
    assert "0 run(s) added, 3 already known" in capsys.readouterr().out
    with EvidenceStore.open(store_path) as store:
        assert store.stats() == before
