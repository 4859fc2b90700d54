"""Code executed from outside the repository is never evidence, and recording says so.

A framework installed editable from another checkout (here: a directory put on
``sys.path``) runs in the test process but lies outside the repository root, so
the recorder keeps none of its units. The trace counts such modules
(``Trace.modules``) and ``fastci record``/``fastci ingest`` print one line naming
where they came from, before the dirty-tree note; a recording of repo code only
prints no such line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from fastci.evidence.record import trace
from fastci.evidence.fill import ingest_paths, record
from fastci.integrations.bazel.runner import BazelResult
from selection_support import Repo

RUNNER = """\
import sys
from pathlib import Path
outside = sys.argv[3]
if outside:
    sys.path.insert(0, outside)
from fastci.evidence.record.recorder import Recorder
rec = Recorder(sys.argv[2], Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=0)
rec.start()
if outside:
    import fwk.train, fwk.optim.adam
    fwk.train.step()
import pkg.model
pkg.model.scale(2)
rec.stop("passed")
"""
# The framework's modules: fwk, fwk.train, fwk.optim, fwk.optim.adam, fwk.util.
FRAMEWORK = {
    "fwk/__init__.py": "",
    "fwk/train.py": "from fwk import util\n\ndef step():\n    return util.two()\n",
    "fwk/util.py": "def two():\n    return 2\n",
    "fwk/optim/__init__.py": "",
    "fwk/optim/adam.py": "LR = 0.1\n",
}
MODEL = "def scale(x):\n    return x * 2\n"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Repo:
    r = Repo(tmp_path / "repo")
    r.commit({"pkg/__init__.py": "", "pkg/model.py": MODEL, ".gitignore": "__pycache__/\n"})
    (r.root / "runner.py").write_text(RUNNER)  # untracked: the tree stays HEAD's
    (r.root / ".git" / "info" / "exclude").write_text("runner.py\n")
    monkeypatch.chdir(r.root)
    return r


@pytest.fixture
def framework(tmp_path: Path) -> Path:
    """Another checkout's source folder, outside the repository."""
    src = tmp_path / "other_checkout" / "src"
    for rel, text in FRAMEWORK.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


def run_test(repo: Repo, out: Path, outside: Path | None, test: str = "//t:a") -> None:
    """Run ``test`` under the recorder (importing the framework when ``outside`` is set)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "runner.py", str(out), test, str(outside or "")],
                   cwd=repo.root, env=env, check=True, capture_output=True, timeout=120)


def test_trace_counts_modules_from_outside_the_repo(repo: Repo, framework: Path,
                                                    tmp_path: Path) -> None:
    run_test(repo, tmp_path / "traces", framework)
    (t,) = [trace.read(p) for p in (tmp_path / "traces").glob("*.trace")]
    # The five fwk modules, from the sys.path entry they were imported from; the
    # interpreter's, site-packages' and FastCI's own modules are not counted.
    assert t.modules.outside_modules == 5
    assert t.modules.outside_example == os.path.realpath(framework)
    assert t.modules.repo_modules == 3  # runner.py (__main__), pkg, pkg.model
    assert not any(f.path.startswith("fwk") or "other_checkout" in f.path for f in t.files)


def test_ingest_names_the_outside_folder(repo: Repo, framework: Path, tmp_path: Path) -> None:
    run_test(repo, tmp_path / "traces", framework)
    notes: list[str] = []
    ingest_paths(tmp_path / "e.db", [tmp_path / "traces"], source_root=repo.root, notes=notes)
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"5 module(s) executed from {os.path.realpath(framework)} "
                               "outside the repository are not evidence (1 of 1 trace(s))")
    assert "docs/EVIDENCE.md" in notes[0]


def test_repo_only_recording_has_no_outside_line(repo: Repo, tmp_path: Path) -> None:
    run_test(repo, tmp_path / "traces", None)
    (t,) = [trace.read(p) for p in (tmp_path / "traces").glob("*.trace")]
    assert (t.modules.outside_modules, t.modules.outside_example) == (0, "")
    assert t.modules.repo_modules == 3
    notes: list[str] = []
    ingest_paths(tmp_path / "e.db", [tmp_path / "traces"], source_root=repo.root, notes=notes)
    assert notes == []


CHILD_RUNNER = """\
import subprocess, sys
from pathlib import Path
from fastci.evidence.record.recorder import Recorder
rec = Recorder(sys.argv[2], Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=0)
rec.start()
subprocess.run([sys.executable, "-c", "import pkg.model; pkg.model.scale(3)"], check=True)
rec.stop("passed")
"""


def test_a_child_process_s_own_sitecustomize_is_not_outside_code(repo: Repo,
                                                                   tmp_path: Path) -> None:
    # A recorded test's child imports FastCI's sitecustomize.py from a temporary folder:
    # that is the recorder's own code, not an outside checkout (the ingest note was
    # printed for every test that started a child).
    (repo.root / "child_runner.py").write_text(CHILD_RUNNER)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "child_runner.py", str(tmp_path / "traces"), "//t:c"],
                   cwd=repo.root, env=env, check=True, capture_output=True, timeout=120)
    traces = [trace.read(p) for p in (tmp_path / "traces").rglob("*.trace")]
    assert sorted(t.role for t in traces) == ["child", "main"]
    child = next(t for t in traces if t.role == "child")
    assert any(f.path == "pkg/model.py" for f in child.files)
    assert [(t.role, t.modules.outside_modules) for t in traces if t.modules.outside_modules] == []
    notes: list[str] = []
    ingest_paths(tmp_path / "e.db", [tmp_path / "traces"], source_root=repo.root, notes=notes)
    assert notes == []


class FakeBazel:
    """Stands in for ``bazel test --config=fastci_record``: runs the test, writes the BEP."""

    def __init__(self, repo: Repo, testlogs: Path, outside: Path | None) -> None:
        self.repo, self.testlogs, self.outside = repo, testlogs, outside

    def test(self, targets: Sequence[str], *, flags: Sequence[str] = (),
             bep_path: Path | None = None, **_: Any) -> BazelResult:
        assert bep_path is not None
        run_test(self.repo, self.testlogs / "t" / "a" / "test.outputs" / "fastci_traces",
                 self.outside)
        bep_path.write_text(json.dumps({
            "id": {"testSummary": {"label": "//t:a"}},
            "testSummary": {"overallStatus": "PASSED", "totalRunDurationMillis": "1000"}}) + "\n")
        return BazelResult(("bazel", "test"), 0, "", "", bep_path)

    def info(self, key: str) -> str:
        return str(self.testlogs)


@pytest.mark.parametrize("outside", [True, False])
def test_record_prints_the_line_before_the_dirty_note(repo: Repo, framework: Path,
                                                      tmp_path: Path, outside: bool) -> None:
    repo.write({"pkg/model.py": MODEL + "\nX = 1\n"})  # a modified tree: the note comes last
    bazel = FakeBazel(repo, tmp_path / "testlogs", framework if outside else None)
    lines = record(repo.root, ["//t:a"], tmp_path / "e.db",
                   bazel=bazel).splitlines()  # type: ignore[arg-type]
    assert lines[-1].startswith("recorded from a modified tree")
    hits = [n for n, line in enumerate(lines) if "outside the repository" in line]
    if outside:
        assert hits == [len(lines) - 2], lines
        assert str(os.path.realpath(framework)) in lines[-2]
    else:
        assert hits == [], lines


def test_the_ingest_command_prints_the_outside_line(
        repo: Repo, framework: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli

    run_test(repo, tmp_path / "traces", framework)
    monkeypatch.chdir(repo.root)
    assert cli.main(["ingest", str(tmp_path / "traces"), "--store", str(tmp_path / "e.db")]) == 0
    out = capsys.readouterr().out
    assert f"5 module(s) executed from {os.path.realpath(framework)} outside the repository" in out
