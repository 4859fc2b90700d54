"""Manifests, repository metadata and package environments in selection (issue 12 items 4, 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pytest

from fastci import config
from fastci.changes.scan import scan
from fastci.config import Config
from fastci.evidence.record import environment
from fastci.evidence.store.db import EvidenceStore
from fastci.integrations.git.repository import Git
from fastci.select.decisions import DecisionKind
from fastci.select.manifest_rules import environment_rules, manifest_rules, package_changes
from selection_support import Repo

PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]

[project]
name = "demo"
version = "0.1.0"
dependencies = ["PyYAML>=6", "protobuf>=5", "torch>=2.3"]

[tool.black]
line-length = 100
'''
PRECOMMIT = "repos:\n  - repo: https://github.com/psf/black\n    rev: 24.1.0\n"


class FakeStore:
    """tests_for_distributions over a fixed table; the commits the evidence was recorded at."""

    def __init__(self, imports: Mapping[str, set[str]], commits: set[str | None]) -> None:
        self.imports, self.commits = imports, commits

    def tests_for_distributions(self, names: Iterable[str]) -> dict[str, set[str]]:
        return {n: set(self.imports.get(n, set())) for n in names}

    def distributions_of_tests(self, tests: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        return {}  # no versions recorded: every importer is selected

    def evidence_commits(self) -> set[str | None]:
        return self.commits


IMPORTS = {"pyyaml": {"t_yaml"}, "protobuf": {"t_proto", "t_yaml"}, "torch": {"t_torch"}}


def changed(tmp_path: Path, edits: Mapping[str, str | None],
            start: Mapping[str, str] | None = None) -> tuple[Any, str]:
    repo = Repo(tmp_path / "repo")
    base = repo.commit(dict(start or {"pyproject.toml": PYPROJECT,
                                      ".pre-commit-config.yaml": PRECOMMIT, "a.py": "x = 1\n"}))
    repo.write(edits)
    return scan(Git(repo.root), base), base


def test_a_pin_bump_and_a_precommit_edit_select_only_the_importers(tmp_path: Path) -> None:
    # The issue's commit: one pin in pyproject.toml and .pre-commit-config.yaml.
    changes, base = changed(tmp_path, {
        "pyproject.toml": PYPROJECT.replace("PyYAML>=6", "PyYAML>=6.0.2")
                                   .replace("line-length = 100", "line-length = 88"),
        ".pre-commit-config.yaml": PRECOMMIT.replace("24.1.0", "24.2.0")})
    got = manifest_rules(changes, FakeStore(IMPORTS, {base}), Config())
    assert set(got.hits) == {"t_yaml"} and got.widen == []
    (reason,) = got.hits["t_yaml"]
    assert "pyyaml" in reason.sentence and reason.path == "pyproject.toml"
    assert got.handled == {"pyproject.toml", ".pre-commit-config.yaml"}
    assert any("metadata_ignore '.pre-commit-config.yaml'" in n for n in got.notes)


@pytest.mark.parametrize("new,why", [
    (PYPROJECT.replace("torch>=2.3", "torch>=2.4"), "torch"),
    (PYPROJECT.replace("setuptools>=61", "setuptools>=70"), "[build-system]"),
    (PYPROJECT.replace('"torch>=2.3"', '"torch>=2.3", "flash-attn"'), "adds flash-attn"),
    (PYPROJECT.replace("[project]", "[project"), "could not be read"),
])
def test_what_runs_everything(tmp_path: Path, new: str, why: str) -> None:
    changes, base = changed(tmp_path, {"pyproject.toml": new})
    got = manifest_rules(changes, FakeStore(IMPORTS, {base}), Config())
    assert [r.kind for r in got.widen] == [DecisionKind.RUN_ALL_PATH]
    assert why in got.widen[0].sentence and got.handled == {"pyproject.toml"}


def test_a_removed_dependency_selects_its_importers(tmp_path: Path) -> None:
    changes, base = changed(tmp_path, {"pyproject.toml": PYPROJECT.replace('"protobuf>=5", ', "")})
    got = manifest_rules(changes, FakeStore(IMPORTS, {base}), Config())
    assert set(got.hits) == {"t_proto", "t_yaml"} and not got.widen


def test_stale_evidence_compares_the_manifest_it_was_recorded_with(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo")
    recorded = repo.commit({"requirements.txt": "PyYAML==6.0.1\nprotobuf==4.0\n"})
    base = repo.commit({"requirements.txt": "PyYAML==6.0.1\nprotobuf==5.0\n"})
    repo.write({"requirements.txt": "PyYAML==6.0.2\nprotobuf==5.0\n"})
    changes = scan(Git(repo.root), base, evidence_commits=[recorded])
    got = manifest_rules(changes, FakeStore(IMPORTS, {recorded}), Config())
    assert set(got.hits) == {"t_yaml", "t_proto"}  # protobuf changed since the recording


def test_configuration_wins(tmp_path: Path) -> None:
    changes, base = changed(tmp_path, {
        "pyproject.toml": PYPROJECT.replace("PyYAML>=6", "PyYAML>=7"),
        ".pre-commit-config.yaml": PRECOMMIT + "# x\n"})
    store = FakeStore(IMPORTS, {base})
    # run_all names the manifest: the path rules widen as configured; nothing read here.
    got = manifest_rules(changes, store, Config(run_all=("pyproject.toml",)))
    assert got.handled == {".pre-commit-config.yaml"} and not got.hits
    # metadata_ignore: [] turns the metadata list off.
    got = manifest_rules(changes, store, Config(metadata_ignore=()))
    assert got.handled == {"pyproject.toml"}


def test_metadata_ignore_is_a_decision_key(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("metadata_ignore: []\n")
    assert config.load(tmp_path, env={}).metadata_ignore == ()
    assert config.load(tmp_path / "none", env={}).metadata_ignore == config.DEFAULT_METADATA_IGNORE
    assert "metadata_ignore" in config.DECISION_KEYS
    assert "pyproject.toml" not in config.DEFAULT_RUN_ALL


# --------------------------------------------------------------------------- environments


@dataclass
class Run:
    env_fingerprint: str
    environment: Mapping[str, Any] = field(default_factory=dict)


def env(fp: str, base: str, listing: Mapping[str, str]) -> dict[str, str]:
    return {"fingerprint": fp, "base_fingerprint": base,
            "packages_list": "\n".join(f"{n}=={v}" for n, v in sorted(listing.items()))}


OLD = {"pyyaml": "6.0.1", "protobuf": "5.0", "torch": "2.3.0", "black": "24.1"}
IMPORTED = {"t_yaml": {"pyyaml": "6.0.1"}, "t_proto": {"protobuf": "5.0"}}


def test_only_tests_that_imported_a_changed_package_rerun() -> None:
    runs = {t: Run("old", env("old", "b1", OLD)) for t in ("t_yaml", "t_proto")}
    now = env("new", "b1", {**OLD, "pyyaml": "6.0.2", "black": "24.2"})
    hits = environment_rules(runs, now, IMPORTED)
    assert set(hits) == {"t_yaml"} and "pyyaml 6.0.1" in hits["t_yaml"][0].sentence


@pytest.mark.parametrize("now,imported", [
    (env("new", "b1", {**OLD, "torch": "2.4.0"}), IMPORTED),  # core
    (env("new", "b1", {**OLD, "nvidia-nccl-cu12": "2.20"}), IMPORTED),  # core, added
    (env("new", "b1", {**OLD, "pytest-randomly": "3.0"}), IMPORTED),  # added: entry points
    (env("new", "b2", OLD), IMPORTED),  # interpreter, GPU, driver ... differ
    (env("new", "", OLD), IMPORTED),  # an environment without a base: not comparable
    (env("new", "b1", {**OLD, "black": "24.2"}), {}),  # imports not recorded (old traces)
])
def test_everything_else_reruns_every_test(now: dict[str, str], imported: Any) -> None:
    runs = {t: Run("old", env("old", "b1", OLD)) for t in ("t_yaml", "t_proto")}
    hits = environment_rules(runs, now, imported)
    assert set(hits) == {"t_yaml", "t_proto"}


def test_same_or_unknown_environment() -> None:
    runs = {"t_yaml": Run("fp", env("fp", "b1", OLD)), "t_old": Run("fp2")}
    assert set(environment_rules(runs, env("fp", "b1", OLD), IMPORTED)) == {"t_old"}
    assert set(environment_rules(runs, None, IMPORTED)) == {"t_yaml", "t_old"}
    assert package_changes(env("a", "b1", OLD), env("b", "b1", {"pyyaml": "7"})) == \
        (["black", "protobuf", "pyyaml", "torch"], [])


def test_environment_lists_packages_outside_the_fingerprint(tmp_path: Path) -> None:
    for entry in ("PyYAML-6.0.1.dist-info", "typing_extensions-4.9.0.dist-info",
                  "legacy-1.2-py3.11.egg-info", "README.txt"):
        (tmp_path / entry).mkdir()
    assert environment.packages_listing([str(tmp_path)]) == (
        "legacy==1.2", "pyyaml==6.0.1", "typing-extensions==4.9.0")
    parts = environment.describe()
    fp = environment.fingerprint_of(*(v for k, v in parts.items() if k != "packages_list"))
    assert environment.current_fingerprint() == fp  # the listing is not fingerprinted
    msg = environment.current()
    assert msg.base_fingerprint == environment.base_fingerprint()
    assert "pyyaml==" in msg.packages_list
    shown = environment.environment_of_interpreter(sys.executable)
    assert shown["fingerprint"] == environment.current_fingerprint()
    assert shown["packages_list"] == parts["packages_list"]
    assert shown["base_fingerprint"] == msg.base_fingerprint


# ------------------------------------------------- "no test opened it" is recorded truthfully

PROJECT = {
    ".pre-commit-config.yaml": PRECOMMIT,
    ".editorconfig": "root = true\n",
    "CODEOWNERS": "* @team\n",
    # Read at collection (module top level) and in a session fixture: both are evidence.
    "test_meta.py": textwrap.dedent('''
        import os
        import pytest

        HERE = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(HERE, ".pre-commit-config.yaml")) as f:
            HOOKS = f.read()

        @pytest.fixture(scope="session")
        def editor():
            with open(os.path.join(HERE, ".editorconfig")) as f:
                return f.read()

        def test_hooks():
            assert "black" in HOOKS

        def test_editor(editor):
            assert editor

        def test_plain():
            assert True
        '''),
}


def test_reads_at_collection_and_in_fixtures_beat_metadata_ignore(tmp_path: Path) -> None:
    from fastci.evidence.store.ingest import find_traces, ingest

    repo = Repo(tmp_path / "repo")
    base = repo.commit(dict(PROJECT))
    traces = tmp_path / "traces"
    env_vars = dict(os.environ, PYTHONPATH=str(repo.root), OMP_NUM_THREADS="1",
                    PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "fastci.pytest.plugin", "--fastci-record",
                          f"--fastci-trace-dir={traces}", "test_meta.py"],
                         cwd=repo.root, env=env_vars, capture_output=True, text=True, timeout=300)
    assert "3 passed" in res.stdout, res.stdout + res.stderr
    with EvidenceStore.open(tmp_path / "e.db", create=True) as store:
        ingest(store, find_traces([traces]), source="pytest", commit=base, root=repo.root)
        every = {f"test_meta.py::{n}" for n in ("test_hooks", "test_editor", "test_plain")}
        reads = store.tests_for_files([".pre-commit-config.yaml", ".editorconfig", "CODEOWNERS"])
        assert reads[".pre-commit-config.yaml"] == every  # collection: every test of the module
        assert reads[".editorconfig"] == {"test_meta.py::test_editor"}
        assert not reads.get("CODEOWNERS")
        # Every test's evidence lists what it imported (pytest at least), with versions.
        dists = store.distributions_of_tests()
        assert set(dists) == every and all(d.get("pytest") for d in dists.values())
        repo.write({".editorconfig": "root = false\n", "CODEOWNERS": "* @other\n"})
        changes = scan(Git(repo.root), base)
        got = manifest_rules(changes, store, Config())
        assert got.handled == {".editorconfig", "CODEOWNERS"} and not got.widen
        # The path rules select readers before anything is ignored: test_editor runs.
        assert store.tests_for_files(changes.paths) == {
            ".editorconfig": {"test_meta.py::test_editor"}, "CODEOWNERS": set()}
