"""Install artifacts and test-runner caches are never inputs (issue 38 item 7).

A real pytest run, recorded, of a suite whose tests read what ``pip install -e`` wrote
(``<pkg>.egg-info/entry_points.txt``), what pytest's cache provider keeps
(``.pytest_cache``) and bytecode (``__pycache__``), in a repository that ignores none of
them. A clone installed another way, or after another local run, must not select them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastci.config import Config
from fastci.evidence.record.environment import current_fingerprint
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.types import is_tool_artifact
from selection_support import Repo

ANALYZER = Path(__file__).resolve().parents[1] / "analyzer"

SUITE = '''from pathlib import Path

import pkg


def _read_all(*names):
    for name in names:
        p = Path(__file__).parent / name
        if p.exists():
            p.read_bytes()


def test_entry_points():
    _read_all("pkg.egg-info/entry_points.txt", ".pytest_cache/v/cache/lastfailed",
              "pkg/__pycache__/mod.cpython-311.pyc", ".hypothesis/examples/x",
              ".coverage", "build.egg-info/PKG-INFO")
    assert pkg.VALUE == 1


def test_data():
    assert (Path(__file__).parent / "data.txt").read_text() == "a\\n"
'''


@pytest.mark.parametrize("path, artifact", [
    ("pkg.egg-info/entry_points.txt", True), ("src/pkg.egg-info/SOURCES.txt", True),
    ("vendor/torch-2.4.0.dist-info/METADATA", True), ("pkg/__pycache__/m.cpython-311.pyc", True),
    ("m.pyc", True), (".pytest_cache/v/cache/lastfailed", True), (".mypy_cache/3.11/x.json", True),
    (".hypothesis/examples/ab/cd", True), (".ruff_cache/CACHEDIR.TAG", True), (".coverage", True),
    (".coverage.host.12.345", True), (".tox/py311/bin/python", True),
    (".coveragerc", False), ("pkg/egg_info.py", False), ("data/cache/x.bin", False),
    ("pkg/build/x.py", False), ("hypothesis/strategies.py", False), ("pkg/m.py", False)])
def test_which_paths_are_artifacts(path: str, artifact: bool) -> None:
    assert is_tool_artifact(path) is artifact


def _record(repo: Repo, traces: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(repo.root), str(ANALYZER)]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                          "fastci.pytest.plugin", "--fastci-record",
                          f"--fastci-trace-dir={traces}", "test_suite.py"],
                         cwd=repo.root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_install_artifacts_and_runner_caches_are_not_inputs(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo")
    # Only FastCI's folder is ignored: nothing else the installer or pytest writes.
    base = repo.commit({".gitignore": ".fastci/\ntraces/\n", "pkg/__init__.py": "VALUE = 1\n",
                        "pkg/mod.py": "X = 1\n", "data.txt": "a\n", "test_suite.py": SUITE})
    artifacts = {"pkg.egg-info/entry_points.txt": "[console_scripts]\npkg = pkg:main\n",
                 ".pytest_cache/v/cache/lastfailed": "{}\n",
                 "pkg/__pycache__/mod.cpython-311.pyc": "bytecode",
                 ".hypothesis/examples/x": "ex", ".coverage": "cov",
                 "build.egg-info/PKG-INFO": "Name: pkg\n"}
    repo.write(artifacts)  # what `pip install -e .` and an earlier local run left
    _record(repo, tmp_path / "traces")
    store = EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True)
    ingest(store, find_traces([tmp_path / "traces"]), source="pytest", commit=base,
           root=repo.root)
    reads = {(path, test.rpartition("::")[2]) for path, test, _ in store.file_digests()}
    assert ("data.txt", "test_data") in reads  # real data reads are still inputs
    assert not {p for p, _ in reads if p in artifacts}, reads
    # Another clone: installed without -e (no egg-info), another last-failed list, new
    # bytecode; untracked, since nothing ignores them.
    repo.write({"pkg.egg-info/entry_points.txt": None, "build.egg-info/PKG-INFO": None,
                ".pytest_cache/v/cache/lastfailed": '{"test_suite.py::test_data": true}\n',
                "pkg/__pycache__/mod.cpython-311.pyc": "other bytecode",
                "pkg/__pycache__/new.cpython-311.pyc": "new", ".coverage": "other"})
    sel = analyze(repo.root, Config(), base=base, declared=Given(None),
                  environment=KnownFingerprint(current_fingerprint()), store=store).selection
    assert sel.mode == "selective"
    assert not sel.selected, [(d.test, [r.sentence for r in d.reasons]) for d in sel.selected]
    # A real input still counts.
    repo.write({"data.txt": "b\n"})
    sel = analyze(repo.root, Config(), base=base, declared=Given(None),
                  environment=KnownFingerprint(current_fingerprint()), store=store).selection
    assert [d.test.rpartition("::")[2] for d in sel.selected] == ["test_data"]
    store.close()


def test_artifacts_recorded_by_an_older_recorder_are_not_compared(tmp_path: Path) -> None:
    """A store filled before this rule holds such reads: the plan leaves them out."""
    from selection_support import env_now, ingest as put, units_of

    repo = Repo(tmp_path / "repo")
    base = repo.commit({".gitignore": ".fastci/\npkg.egg-info/\n", "pkg/m.py": "X = 1\n"})
    repo.write({"pkg.egg-info/entry_points.txt": "[x]\n"})
    store = EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True)
    put(store, "t", units_of(repo.root, ["pkg/m.py"]), commit=base,
        files={"pkg.egg-info/entry_points.txt": "0" * 64})
    repo.write({"pkg.egg-info/entry_points.txt": None})
    sel = analyze(repo.root, Config(), base=base, declared=Given(None), environment=KnownFingerprint(env_now()),
                  store=store).selection
    assert not sel.selected
    store.close()


def test_a_cache_folder_of_any_name_is_not_an_input(tmp_path: Path) -> None:
    # Issue 36: pytest's cache lives wherever ``cache_dir`` says (here ``build/pytest``,
    # no name FastCI knows), and its collection-time read of the last-failed list was
    # recorded as every test's input: after any local failure every test was selected.
    # pytest tags the folder as a cache (CACHEDIR.TAG, the Cache Directory Tagging spec),
    # as cargo, ruff and others do: such a folder is never read as input.
    repo = Repo(tmp_path / "repo")
    suite = ("from pathlib import Path\n\n\ndef test_reads():\n"
             "    p = Path(__file__).parent / 'build/pytest/v/cache/lastfailed'\n"
             "    p.read_text() if p.exists() else None\n"
             "    assert (Path(__file__).parent / 'data.txt').read_text() == 'a\\n'\n")
    base = repo.commit({".gitignore": ".fastci/\ntraces/\n", "data.txt": "a\n",
                        "pytest.ini": "[pytest]\ncache_dir = build/pytest\n",
                        "test_suite.py": suite})
    # What an earlier local run left (pytest writes the tag and a .gitignore with it).
    repo.write({"build/pytest/v/cache/lastfailed": '{"test_suite.py::test_x": true}\n',
                "build/pytest/CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55\n",
                "build/pytest/.gitignore": "*\n"})
    _record(repo, tmp_path / "traces")
    store = EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True)
    ingest(store, find_traces([tmp_path / "traces"]), source="pytest", commit=base,
           root=repo.root)
    reads = {path for path, _, _ in store.file_digests()}
    assert "data.txt" in reads
    assert not {p for p in reads if p.startswith("build/")}, reads
    repo.write({"build/pytest/v/cache/lastfailed": '{"test_suite.py::test_reads": true}\n'})
    sel = analyze(repo.root, Config(), base=base, declared=Given(None),
                  environment=KnownFingerprint(current_fingerprint()), store=store).selection
    assert sel.mode == "selective" and not sel.selected, \
        [(d.test, [r.sentence for r in d.reasons]) for d in sel.selected]
    store.close()
