"""Nothing FastCI writes at run time is tracked: ``git status`` stays clean.

A tracked run-time file (the unit cache was one) leaves every recording's tree
dirty, so the next plan sees a change; and a file a change can commit is one a
change can craft. One end-to-end test runs ``fastci record``, ``ingest``,
``plan`` and ``run`` through the CLI with the real Bazel on a git copy of
tests/selection_fixture that carries this repository's own ``.gitignore``, with
a pickle payload planted as the unit cache before each command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from bazel_support import remove_tree, require_bazel
from fastci import cli
from fastci.integrations.git.repository import cache_dir
from test_run import Ws
from test_units import write_pickle_payload

require_bazel()  # skips without bazel; fails under CI

REPO = Path(__file__).resolve().parents[1]

#: What FastCI writes under ``.fastci/`` while it runs (the defaults of config `store`/`plan`).
RUNTIME_FILES = (".fastci/units.cache", ".fastci/units.cache.1234.tmp", ".fastci/plan.json",
                 ".fastci/evidence.db", ".fastci/evidence.db-wal", ".fastci/runs/bep.json")


def _git(root: Path, *args: str) -> list[str]:
    """The lines ``git`` prints (``check-ignore`` exits 1 when it ignores none: not an error)."""
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                          text=True).stdout.splitlines()


def test_fastci_runtime_files_are_ignored_and_untracked() -> None:
    """In this repository: no run-time file is tracked, and git ignores each of them."""
    assert _git(REPO, "ls-files", "--", ".fastci") == [".fastci/BUILD.bazel"]
    assert _git(REPO, "check-ignore", "--no-index", *RUNTIME_FILES) == list(RUNTIME_FILES)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ws]:
    base = tmp_path_factory.mktemp("clean_tree")
    w = Ws(base)  # the git copy of selection_fixture and its Bazel server (tests/test_run.py)
    try:
        # The CLI builds its own Bazel client: the rc file points it at the same server.
        bazelrc = (w.root / ".bazelrc").read_text() + f"startup --output_base={base / 'out'}\n"
        for rel in _git(REPO, "ls-files", "--", ".fastci"):  # .fastci/ as this repository tracks it
            shutil.copyfile(REPO / rel, w.root / rel)
        w.base = w.repo.commit({".gitignore": (REPO / ".gitignore").read_text(),
                                ".bazelrc": bazelrc, "fastci.yaml": "targets: //pkg/...\n"})
        yield w
    finally:
        w.bazel.shutdown()
        remove_tree(base)


def test_record_ingest_plan_run_leave_the_tree_clean(
        ws: Ws, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ws.root)
    marker = ws.root.parent / "payload-ran"
    planted = ws.root / ".fastci" / "units.cache"  # where a change could put one
    cache = cache_dir(ws.root) / "units.cache"  # where FastCI keeps it: inside .git
    assert ws.repo.git("status", "--porcelain", "--untracked-files=all") == ""
    # Three Bazel builds in all: record's and run's `bazel test`, plan's `bazel query` (and two
    # `bazel info`), on one server.
    for argv in (["record", "//pkg/..."], ["ingest"], ["plan"], ["run"]):
        write_pickle_payload(planted, marker)  # a crafted cache in the tree: never read
        write_pickle_payload(cache, marker)  # even in FastCI's own place: never unpickled
        assert cli.main(argv) == 0, (argv, capsys.readouterr())
        assert ws.repo.git("status", "--porcelain", "--untracked-files=all") == "", argv
        assert not marker.exists(), argv
        if argv[0] == "record":  # it read the cache: the payload was a miss, replaced by JSON
            assert json.loads(cache.read_bytes())["format"] == "fastci-units-cache"
    plan = json.loads((ws.root / ".fastci" / "plan.json").read_text())
    # The recording left nothing for the next plan to see as a change.
    assert plan["mode"] == "selective" and plan["tests"] == [], plan
    assert ws.repo.git("ls-files", ".fastci") == ".fastci/BUILD.bazel"
