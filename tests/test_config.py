"""Tests of the config loader: precedence, validation, globs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci import config
from fastci.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_without_file(tmp_path: Path) -> None:
    cfg = config.load(tmp_path, env={})
    assert cfg == config.DEFAULTS
    assert cfg.path(tmp_path, "store") == tmp_path / ".fastci/evidence.db"


def test_precedence_defaults_file_env_cli(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("base: origin/main\nstore: from-file.db\nplan: p.json\n")
    cfg = config.load(tmp_path, env={"FASTCI_STORE": "from-env.db", "FASTCI_PLAN": "env.json"},
                      overrides={"store": "from-cli.db", "plan": None})
    assert (cfg.base, cfg.store, cfg.plan) == ("origin/main", "from-cli.db", "env.json")


def test_unknown_key_is_named(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("run_al: []\n")
    with pytest.raises(ConfigError, match="unknown key 'run_al'"):
        config.load(tmp_path, env={})


def test_bad_types_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text("run_all: csrc/**\n")
    with pytest.raises(ConfigError, match="run_all: expected a list"):
        config.load(tmp_path, env={})
    (tmp_path / "fastci.yaml").write_text("path_tests: {'data/**': [1]}\n")
    with pytest.raises(ConfigError, match="path_tests"):
        config.load(tmp_path, env={})
    (tmp_path / "fastci.yaml").write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(tmp_path, env={})


def test_config_file_from_env(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.yaml"
    other.write_text("path_tests:\n  'data/*.json': //x:y_test\n")
    cfg = config.load(tmp_path, env={"FASTCI_CONFIG": str(other)})
    assert cfg.path_tests == (("data/*.json", ("//x:y_test",)),)


@pytest.mark.parametrize("path,pattern,hit", [
    ("csrc/kernels/a.cu", "csrc/**", True),
    ("examples/csrc/a.cu", "csrc/**", False),
    ("examples/microllm/BUILD.bazel", "BUILD.bazel", True),
    ("rules/defs.bzl", "*.bzl", True),
    ("third_party/requirements.txt", "requirements*.txt", True),
    ("docs/x/y.md", "docs/**", True),
    ("a/b/c.py", "a/*.py", False),
    ("a/b/c.py", "a/**/c.py", True),
    ("a/c.py", "a/**/c.py", True),
])
def test_glob_match(path: str, pattern: str, hit: bool) -> None:
    assert config.glob_match(path, pattern) is hit


def test_project_config_loads() -> None:
    cfg = config.load(ROOT, env={})
    assert "csrc/**" in cfg.run_all and ".ci/**" in cfg.run_all


@pytest.mark.parametrize("root", [None, ROOT])
def test_a_conftest_anywhere_runs_everything(tmp_path: Path, root: Path | None) -> None:
    # Collection-time code (fixtures, hooks) is not recorded, so a conftest change must widen.
    cfg = config.load(root or tmp_path, env={})
    assert config.first_match("examples/microllm/tests/conftest.py", cfg.run_all) == "conftest.py"
    assert config.first_match("examples/microllm/tests/harness.py", cfg.run_all) is None
