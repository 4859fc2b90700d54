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


def test_bytes_that_are_not_utf8_are_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_bytes(b"base: caf\xe9\n")
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path, env={})
    assert str(err.value) == f"{tmp_path / 'fastci.yaml'}: not UTF-8 text (byte 9)"


def test_yaml_tags_never_construct_objects(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "fastci.yaml").write_text(
        f"base: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML: could not determine a constructor"):
        config.load(tmp_path, env={})
    assert not marker.exists()


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


def test_runner_python_key_and_env(tmp_path: Path) -> None:
    assert config.load(tmp_path, env={}).runner_python == "auto"
    (tmp_path / "fastci.yaml").write_text("runner_python: tools/py\n")
    assert config.load(tmp_path, env={}).runner_python == "tools/py"
    cfg = config.load(tmp_path, env={"FASTCI_RUNNER_PYTHON": "/opt/py/bin/python3"})
    assert cfg.runner_python == "/opt/py/bin/python3"


def test_load_records_where_the_file_is_and_what_env_and_cli_set(tmp_path: Path) -> None:
    cfg = config.load(tmp_path, env={"FASTCI_TARGETS": "//x/..."},
                      overrides={"store": "s.db", "plan": None})
    assert cfg.origin == str(tmp_path / "fastci.yaml")  # consulted even though it is absent
    assert cfg.overridden == {"targets", "store"}
    assert config.repo_config_path(tmp_path, cfg) == "fastci.yaml"
    inside = tmp_path / "ci" / "fastci.yaml"
    cfg = config.load(tmp_path, env={"FASTCI_CONFIG": str(inside)})
    assert config.repo_config_path(tmp_path, cfg) == "ci/fastci.yaml"
    cfg = config.load(tmp_path / "repo", env={"FASTCI_CONFIG": str(inside)})
    assert config.repo_config_path(tmp_path / "repo", cfg) is None  # outside: the CI's own
    assert config.repo_config_path(tmp_path, config.Config()) == "fastci.yaml"


def test_with_rules_from_takes_decision_keys_and_keeps_env_and_cli(tmp_path: Path) -> None:
    (tmp_path / "fastci.yaml").write_text(
        "run_all: []\nignore: ['**']\ntargets: //head/...\nstore: head.db\nbazel: mybazel\n")
    cfg = config.load(tmp_path, env={"FASTCI_TARGETS": "//env/..."}, overrides={"plan": "p.json"})
    base = "run_all: [BUILD]\npath_tests: {'data/**': ['//t:c']}\nrunner_python: py3\n"
    rules = config.with_rules_from(cfg, base, "fastci.yaml at base")
    assert rules.run_all == ("BUILD",) and rules.ignore == config.DEFAULT_IGNORE
    assert rules.path_tests == (("data/**", ("//t:c",)),) and rules.runner_python == "py3"
    assert rules.targets == "//env/..."  # set by the environment: not the change's to decide
    # Where FastCI reads and writes stays the effective one; the program the planner
    # runs (bazel) is the base's: a change must not choose a script for it to run.
    assert (rules.store, rules.plan, rules.bazel) == ("head.db", "p.json", "bazel")
    assert config.with_rules_from(cfg, None, "none").run_all == config.DEFAULT_RUN_ALL
    with pytest.raises(ConfigError, match="at base: unknown key 'run_al'"):
        config.with_rules_from(cfg, b"run_al: []\n", "fastci.yaml at base")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.with_rules_from(cfg, "a: [\n", "fastci.yaml at base")


def test_every_key_and_variable_is_documented() -> None:
    doc = (ROOT / "docs" / "CONFIG.md").read_text()
    for key in config.DEFAULTS.__dataclass_fields__:
        if key not in ("origin", "overridden"):
            assert f"| `{key}` |" in doc, key
    for var in [*config.ENV_VARS, config.ENV_CONFIG_FILE]:
        assert f"`{var}`" in doc, var
    for key in config.DECISION_KEYS:
        assert f"`{key}`" in doc.split("## Decision keys", 1)[1].split("##", 1)[0], key


def test_prune_key_env_and_values(tmp_path: Path) -> None:
    assert config.load(tmp_path, env={}).prune == config.DEFAULTS.prune
    (tmp_path / "fastci.yaml").write_text("prune: aggressive\n")
    assert config.load(tmp_path, env={}).prune == "aggressive"
    assert config.load(tmp_path, env={"FASTCI_PRUNE": "off"}).prune == "off"
    assert config.load(tmp_path, env={}, overrides={"prune": "safe"}).prune == "safe"
    assert "prune" in config.DECISION_KEYS  # a change cannot loosen its own pruning
    (tmp_path / "fastci.yaml").write_text("prune: always\n")
    with pytest.raises(ConfigError, match="prune: expected one of off, safe, aggressive"):
        config.load(tmp_path, env={})


def test_priority_key_env_and_values(tmp_path: Path) -> None:
    from fastci.select.priority import DEFAULT

    assert config.load(tmp_path, env={}).priority == DEFAULT
    assert config.load(tmp_path, env={"FASTCI_PRIORITY": "risk"}).priority == "risk"
    (tmp_path / "fastci.yaml").write_text("priority: random\n")
    with pytest.raises(ConfigError, match="priority: expected one of reasons, risk, risk_per_cost, rare_inputs, rare_named"):
        config.load(tmp_path, env={})
