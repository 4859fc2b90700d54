"""The runner is detected (issue 12 item 9): a pytest-only repository needs no ``--no-bazel``.

``runner: auto`` is Bazel when a Bazel workspace file is at the root and the Bazel
executable is found, else pytest; ``fastci.yaml``, ``$FASTCI_RUNNER`` and
``--bazel`` / ``--no-bazel`` override it. End-to-end through ``cli.main`` on a
temporary git repository with a real evidence store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from fastci import cli
from fastci.config import Config, load
from fastci.errors import ConfigError
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.inputs import choose_runner
from selection_support import MODEL, OTHER, Repo, ingest, units_of

SCALE = "tests/test_model.py::test_scale"
SHIFT = "tests/test_model.py::test_shift"
OTHER_TEST = "tests/test_other.py::test_other"


def _fake_bazel(tmp_path: Path, script: str = "echo 'fake bazel: no' >&2; exit 2") -> Path:
    exe = tmp_path / "bin" / "bazel"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)
    return exe


# --- choose_runner ---------------------------------------------------------------


def test_no_workspace_is_pytest(tmp_path: Path) -> None:
    runner, why = choose_runner(tmp_path, Config(bazel=str(_fake_bazel(tmp_path))))
    assert runner == "pytest"
    assert why == "no Bazel workspace (no WORKSPACE, WORKSPACE.bazel, MODULE.bazel at the repository root)"


@pytest.mark.parametrize("marker", ["WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel"])
def test_workspace_with_bazel_is_bazel(tmp_path: Path, marker: str) -> None:
    (tmp_path / marker).write_text("")
    exe = _fake_bazel(tmp_path)
    runner, why = choose_runner(tmp_path, Config(bazel=str(exe)))
    assert (runner, why) == ("bazel", f"{marker} is at the repository root and {str(exe)!r} is found")


def test_workspace_without_bazel_is_pytest_and_says_why(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "WORKSPACE").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    runner, why = choose_runner(tmp_path, Config())  # `bazel`, looked up on PATH
    assert runner == "pytest" and "Bazel executable 'bazel' is not found" in why
    assert "set `runner: bazel` to insist" in why
    monkeypatch.setenv("PATH", str(_fake_bazel(tmp_path).parent))
    assert choose_runner(tmp_path, Config())[0] == "bazel"
    # A relative path is taken from the root, as Bazel is run there.
    assert choose_runner(tmp_path, Config(bazel="bin/bazel"))[0] == "bazel"
    assert choose_runner(tmp_path, Config(bazel="bin/nope"))[0] == "pytest"


def test_config_environment_and_command_line_choose(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("runner: pytest\n")
    (tmp_path / "WORKSPACE").write_text("")
    exe = str(_fake_bazel(tmp_path))
    env = {"FASTCI_BAZEL": exe}
    assert choose_runner(tmp_path, load(tmp_path, env=env)) == ("pytest", "set by config `runner`")
    assert choose_runner(tmp_path, load(tmp_path, env={**env, "FASTCI_RUNNER": "bazel"})) == \
        ("bazel", "set by the command line or $FASTCI_RUNNER")
    assert choose_runner(tmp_path, load(tmp_path, env=env, overrides={"runner": "bazel"}))[0] == "bazel"
    (tmp_path / "fastci.yaml").write_text("runner: auto\n")
    assert choose_runner(tmp_path, load(tmp_path, env=env))[0] == "bazel"
    (tmp_path / "fastci.yaml").write_text("runner: make\n")
    with pytest.raises(ConfigError, match="runner: expected one of auto, bazel, pytest, got 'make'"):
        load(tmp_path, env=env)


# --- end to end: a pytest-only repository -------------------------------------------


class PytestRepo:
    """A git repo of pytest tests (no Bazel workspace), recorded in ``.fastci/evidence.db``."""

    def __init__(self, root: Path, extra: dict[str, str | None] | None = None) -> None:
        self.root = root
        self.repo = Repo(root)
        self.base = self.repo.commit({"pkg/model.py": MODEL, "pkg/other.py": OTHER,
                                      ".gitignore": "/.fastci/\n", **(extra or {})})
        units = units_of(root, ["pkg/model.py", "pkg/other.py"])
        pick = lambda *ids: {u: units[u] for u in ids}  # noqa: E731
        with EvidenceStore.open(root / ".fastci/evidence.db", create=True) as store:
            ingest(store, SCALE, pick("pkg/model.py::<module>", "pkg/model.py::scale"),
                   commit=self.base, gpus=0, duration_s=1.5)
            ingest(store, SHIFT, pick("pkg/model.py::<module>", "pkg/model.py::shift"),
                   commit=self.base, gpus=0, duration_s=2.5)
            ingest(store, OTHER_TEST, pick("pkg/other.py::<module>", "pkg/other.py::other"),
                   commit=self.base, gpus=0, duration_s=4.0)

    def cli(self, *args: str) -> list[str]:
        return ["--root", str(self.root), "--base", self.base, *args]


@pytest.fixture
def pyrepo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PytestRepo]:
    for var in ("FASTCI_STORE", "FASTCI_PLAN", "FASTCI_RUNNER", "FASTCI_CONFIG", "FASTCI_BAZEL"):
        monkeypatch.delenv(var, raising=False)
    r = PytestRepo(tmp_path / "repo")
    r.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})  # test_scale's unit
    yield r


def test_plan_in_a_pytest_repository_needs_no_flag(pyrepo: PytestRepo,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", *pyrepo.cli()]) == 0
    out = capsys.readouterr().out
    assert "fastci plan: selective: 1 of 3 tests selected, 2 skipped" in out, out
    assert ("  runner: pytest (no Bazel workspace (no WORKSPACE, WORKSPACE.bazel, MODULE.bazel "
            "at the repository root))") in out
    assert "  estimated test time: 1.5 s of 8.0 s (CPU)" in out
    assert "GPU-seconds" not in out
    plan = (pyrepo.root / ".fastci/plan.json").read_text()
    assert f'"{SCALE}"' in plan


def test_explain_finds_a_recorded_pytest_test_without_flags(
        pyrepo: PytestRepo, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", SCALE, *pyrepo.cli()]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{SCALE}: RUNS"), out
    assert "pkg/model.py::scale" in out
    assert cli.main(["explain", OTHER_TEST, *pyrepo.cli()]) == 0
    assert capsys.readouterr().out.startswith(f"{OTHER_TEST}: SKIPPED")


def test_a_failing_bazel_widens_to_every_recorded_test(
        pyrepo: PytestRepo, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # --bazel where no workspace is: `bazel query` fails. The plan runs everything the
    # store knows (3), not "0 known".
    monkeypatch.setenv("FASTCI_BAZEL", str(_fake_bazel(tmp_path)))
    assert cli.main(["plan", *pyrepo.cli("--bazel")]) == 0
    out = capsys.readouterr().out
    assert "fastci plan: all: every test runs at full workload (3 known)" in out, out
    assert "runner: bazel (set by the command line or $FASTCI_RUNNER)" in out
    assert "change analysis failed" in out
    # Explain still finds the recorded test in the widened plan.
    assert cli.main(["explain", SCALE, *pyrepo.cli("--bazel")]) == 0
    assert capsys.readouterr().out.startswith(f"{SCALE}: RUNS")


def test_a_workspace_with_bazel_asks_bazel_and_no_bazel_overrides(
        pyrepo: PytestRepo, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "bazel-was-run"
    exe = _fake_bazel(tmp_path, f"echo \"$@\" >> {marker}; exit 2")
    monkeypatch.setenv("FASTCI_BAZEL", str(exe))
    pyrepo = PytestRepo(tmp_path / "ws", {"WORKSPACE": ""})  # a Bazel workspace
    pyrepo.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    assert cli.main(["plan", *pyrepo.cli()]) == 0
    out = capsys.readouterr().out
    assert f"runner: bazel (WORKSPACE is at the repository root and {str(exe)!r} is found)" in out
    assert marker.is_file() and "query" in marker.read_text()
    assert "(3 known)" in out  # the query failed: everything recorded runs
    os.unlink(marker)
    assert cli.main(["plan", *pyrepo.cli("--no-bazel")]) == 0
    out = capsys.readouterr().out
    assert "runner: pytest (set by the command line or $FASTCI_RUNNER)" in out
    assert "selective: 1 of 3 tests selected" in out and not marker.exists()
