"""The ``fastci`` command line as a whole: entry points, ``--help``, and its shape.

Each command has its own tests (``test_plan.py``, ``test_ingest.py``...); these check
what holds for all of them: every command's ``--help`` works in a fresh process and imports
no stage (a command imports its stage when it runs), the
documented entry points (the console script, ``python -m fastci``, the pytest plugin
under both names) still load, the ``on_error`` hook of :mod:`fastci.cli.app`, and that
no command module imports another (shared pieces live in the stages).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Sequence

import pytest

from fastci.cli import app
from fastci.cli.command import COMMAND_MODULES, COMMANDS, Command
from fastci.errors import FastCIError

REPO = Path(__file__).resolve().parents[1]
CLI_DIR = REPO / "analyzer" / "fastci" / "cli"
COMMAND_NAMES = [importlib.import_module(m).COMMAND.name for m in COMMAND_MODULES]
_SELECTIVE = {"version": 1, "mode": "selective", "reason": "r",
              "tests": [{"id": "//a:t"}], "skipped": [{"id": "//b:t", "why": "not affected"}]}


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)  # the pytest11 entry point must load
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120, check=False)


# --- --help in a fresh process -----------------------------------------------------------------


def test_the_command_table_names_each_module_s_command() -> None:
    assert list(COMMANDS) == COMMAND_NAMES


def test_a_command_imports_only_its_own_module(tmp_path: Path) -> None:
    """``fastci NAME`` loads NAME's module alone; ``fastci --help`` and an unknown name
    load every command (the help and the error list them all)."""
    probe = ("import sys\nfrom fastci.cli import app\ntry:\n    app.main(sys.argv[1:])\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules "
             "if m in {mods!r}))").format(mods=set(COMMAND_MODULES))

    def loaded(*argv: str) -> tuple[list[str], str]:
        res = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                             text=True, cwd=tmp_path, env=_env(), check=False)
        return eval_list(res.stdout.strip().splitlines()[-1]), res.stdout + res.stderr

    got, _ = loaded("-v", "validate-plan", "--help")
    assert got == ["fastci.cli.validate_plan"]
    got, out = loaded("--help")
    assert got == sorted(COMMAND_MODULES) and all(name in out for name in COMMANDS)
    got, out = loaded("no-such-command")
    assert got == sorted(COMMAND_MODULES) and "invalid choice" in out


#: What printing help may import of FastCI: the CLI's own modules and the shared leaves. A
#: command imports its stage when it runs: ``fastci --help`` (every command's parser) took
#: 1.3-2.1 s importing 86 modules and numpy before (issue 36).
HELP_MAY_IMPORT = {"fastci", "fastci.errors", "fastci.types", "fastci.config", "fastci.gcpause"}
#: Libraries no parser needs (each costs tens to hundreds of milliseconds).
HEAVY = ("numpy", "torch", "libcst", "yaml", "coverage", "tqdm", "google", "pytest")


def help_imports(cwd: Path, first: str = "") -> list[str]:
    """``sys.modules`` after building the whole parser, ``fastci --help``, every ``fastci NAME
    --help`` and the evidence actions' help, in one fresh process (``first``: Python run before)."""
    helps = [["--help"], *([name, "--help"] for name in COMMANDS),
             *(["evidence", action, "--help"] for action in ("show", "export", "import"))]
    probe = textwrap.dedent(f"""
        import contextlib, io, sys
        {first}
        from fastci.cli import app

        app.build_parser(app._load_commands()).format_help()
        for argv in {helps!r}:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                try:
                    app.main(argv)
                except SystemExit as exc:
                    assert exc.code == 0, (argv, exc.code)
            assert out.getvalue().startswith("usage: fastci"), argv
        print(" ".join(sorted(sys.modules)))
        """)
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=cwd, env=_env(), check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def beyond_help(loaded: Sequence[str]) -> list[str]:
    """The modules among ``loaded`` that printing help must not import."""
    cli = {"fastci.cli", "fastci.cli.app", "fastci.cli.command", "fastci.cli.options",
           *COMMAND_MODULES}
    return sorted(m for m in loaded if m.split(".")[0] in HEAVY or (
        (m == "fastci" or m.startswith("fastci.")) and m not in HELP_MAY_IMPORT | cli))


def test_help_and_every_parser_import_no_stage(tmp_path: Path) -> None:
    """Checked on ``sys.modules``, not by timing (``make bench`` times it: bench/cli_startup.py)."""
    loaded = help_imports(tmp_path)
    assert set(COMMAND_MODULES) <= set(loaded)
    assert beyond_help(loaded) == []


def test_the_help_import_check_sees_a_stage(tmp_path: Path) -> None:
    """The same probe sees what an import at a command module's top level would load."""
    assert "fastci.units.lines" in beyond_help(help_imports(tmp_path, "import fastci.units.lines"))
    assert "yaml" in beyond_help(help_imports(tmp_path, "import yaml"))


def test_validate_plan_help_names_the_plan_model_s_default_path() -> None:
    from fastci.cli.validate_plan import DEFAULT_PLAN
    from fastci.plan.model import DEFAULT_PATH

    assert DEFAULT_PLAN == DEFAULT_PATH


def eval_list(text: str) -> list[str]:
    """A printed list of module names (``['a', 'b']``), read without ``eval``."""
    return json.loads(text.replace("'", '"'))


def test_evidence_show_prints_a_test_and_its_last_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fastci.evidence.store.db import EvidenceStore, RunEvidence

    db = tmp_path / "e.db"
    with EvidenceStore.open(db, create=True) as store:
        store.ingest(RunEvidence(test="//t:a", run_key="k1", outcome="failed", complete=True,
                                 duration_s=2.5, gpus=2, workload={"steps": 4}, recorded_at=1.0,
                                 overrides={"steps": 1}, units={"m.py::f": ("c1", frozenset({"tp=2"}))}))
    monkeypatch.chdir(tmp_path)
    assert app.main(["evidence", "show", "//t:a", "--store", str(db), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["units"] == {"m.py::f": ["tp=2"]}
    assert {k: got["last_run"][k] for k in ("test", "outcome", "workload", "overrides", "gpus",
                                            "complete", "last_full")} == {
        "test": "//t:a", "outcome": "failed", "workload": {"steps": 4}, "overrides": {"steps": 1},
        "gpus": 2, "complete": True, "last_full": None}
    assert app.main(["evidence", "show", "//t:a", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "last run: failed, 2.5s, 2 GPU(s), complete evidence" in out and "m.py::f" in out


def test_every_registered_command_is_listed_once() -> None:
    assert len(COMMAND_NAMES) == len(set(COMMAND_NAMES)) >= 8
    assert {"record", "ingest", "evidence", "plan", "explain", "run", "validate-plan",
            "targets"} <= set(COMMAND_NAMES)


def test_python_m_fastci_help_lists_every_command(tmp_path: Path) -> None:
    res = _run(["-m", "fastci", "--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: fastci")
    listed = {line.split()[0] for line in res.stdout.splitlines() if line.startswith("    ")}
    assert set(COMMAND_NAMES) <= listed, listed


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_python_m_fastci_command_help_exits_0(name: str, tmp_path: Path) -> None:
    res = _run(["-m", "fastci", name, "--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: fastci {name}") and res.stderr == ""


def test_plan_help_leaves_the_plan_alone(tmp_path: Path) -> None:
    """``--help`` is no failure: the plan's ``on_error`` must not withdraw the plan."""
    plan = tmp_path / ".fastci" / "plan.json"
    plan.parent.mkdir()
    plan.write_text(json.dumps(_SELECTIVE))
    before = plan.read_text()
    res = _run(["-m", "fastci", "plan", "--root", str(tmp_path), "--help"], tmp_path)
    assert res.returncode == 0 and plan.read_text() == before
    res = _run(["-m", "fastci", "plan", "--root", str(tmp_path), "--bogus"], tmp_path)
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr
    assert json.loads(plan.read_text())["mode"] == "all"


# --- Entry points ------------------------------------------------------------------------------


def _validate_plan_argv(tmp_path: Path) -> list[str]:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_SELECTIVE))
    return ["validate-plan", str(plan), "--workspace", str(tmp_path)]


def test_console_script_targets_load_and_run(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``pyproject.toml``'s script, the installed one, and ``fastci.cli:main`` all run the CLI."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    targets = {scripts["fastci"], "fastci.cli:main"}
    installed = entry_points(group="console_scripts", name="fastci")
    targets |= {ep.value for ep in installed}
    argv = _validate_plan_argv(tmp_path)
    for target in sorted(targets):
        module, _, attr = target.partition(":")
        main = getattr(importlib.import_module(module), attr)
        assert main(argv) == 0, target
        assert ": ok: version 1, mode selective, 1 tests, 1 skipped" in capsys.readouterr().out


def test_installed_fastci_script_runs(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "fastci"
    if not entry_points(group="console_scripts", name="fastci"):
        pytest.fail("the fastci package is not installed in this environment (make setup)")
    assert script.exists(), script
    res = subprocess.run([str(script), *_validate_plan_argv(tmp_path)], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and ": ok: version 1" in res.stdout, res.stderr


def test_pytest11_entry_point_is_the_documented_plugin_module() -> None:
    (ep,) = entry_points(group="pytest11", name="fastci")
    assert ep.value == "fastci.pytest_plugin"
    plugin = importlib.import_module("fastci.pytest.plugin")
    assert ep.load() is plugin
    import fastci.pytest_plugin as shim  # the documented path is the same module object

    assert shim is plugin and hasattr(shim, "pytest_addoption")


def _plugin_registrations(tmp_path: Path, *p_args: str) -> tuple[int, str]:
    res = _run(["-m", "pytest", *p_args, "-p", "no:cacheprovider", "--trace-config",
                "--collect-only", "-q"], tmp_path)
    registered = [line for line in res.stdout.splitlines()
                  if line.startswith("PLUGIN registered: <module 'fastci.")]
    assert res.returncode in (0, 5), res.stdout[-2000:] + res.stderr[-2000:]  # 5: no tests
    return len(registered), res.stdout


@pytest.mark.parametrize("p_args", [(), ("-p", "fastci.pytest_plugin"),
                                    ("-p", "fastci.pytest.plugin")])
def test_pytest_plugin_loads_once_under_any_name(p_args: tuple[str, ...], tmp_path: Path) -> None:
    """The entry point plus ``-p`` (either name) registers the plugin once, not twice."""
    help_out = _run(["-m", "pytest", *p_args, "-p", "no:cacheprovider", "--help"], tmp_path)
    assert help_out.returncode == 0, help_out.stderr
    assert "--fastci-plan" in help_out.stdout and "--fastci-record" in help_out.stdout
    count, out = _plugin_registrations(tmp_path, *p_args)
    assert count == 1, out


# --- The on_error hook of fastci.cli.app -------------------------------------------------------


class _Fake:
    """A command whose run does what the test says, and which records its on_error calls."""

    def __init__(self, outcome: BaseException | None = None) -> None:
        self.outcome = outcome
        self.errors: list[tuple[str, tuple[str, ...]]] = []

    def command(self) -> Command:
        return Command("fake", "a fake command", self.add_arguments, self.run, on_error=self.on_error)

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--n", type=int, default=0)

    def run(self, args: argparse.Namespace) -> int:
        if self.outcome is not None:
            raise self.outcome
        return 0

    def on_error(self, why: str, argv: Sequence[str]) -> None:
        self.errors.append((why, tuple(argv)))


@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch) -> _Fake:
    fake = _Fake()
    monkeypatch.setattr(app, "_load_commands", lambda name=None: [fake.command()])
    return fake


def test_on_error_hears_of_unusable_arguments(fake_cli: _Fake,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["fake", "--n", "x"], "argument --n: invalid int value: 'x'"),
                          (["fake", "--bogus", "1"], "unrecognized arguments: --bogus 1")):
        fake_cli.errors.clear()
        with pytest.raises(SystemExit) as exited:
            app.main(argv)
        assert exited.value.code == 2
        assert fake_cli.errors == [(f"bad arguments: {message}", tuple(argv))]
        err = capsys.readouterr().err
        assert err.startswith("usage: fastci fake") and message in err


def test_on_error_hears_of_a_failed_run_before_it_is_reported(
        fake_cli: _Fake, capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["fake"]) == 0 and fake_cli.errors == []
    fake_cli.outcome = FastCIError("the store is locked")
    assert app.main(["fake", "--n", "2"]) == FastCIError.exit_code
    assert fake_cli.errors == [("the store is locked", ("fake", "--n", "2"))]
    assert capsys.readouterr().err == "fastci: the store is locked\n"
    fake_cli.errors.clear()
    fake_cli.outcome = ZeroDivisionError("division by zero\nsecond line")
    with pytest.raises(ZeroDivisionError):
        app.main(["fake"])
    assert fake_cli.errors == [("ZeroDivisionError: division by zero", ("fake",))]
    fake_cli.errors.clear()
    fake_cli.outcome = KeyboardInterrupt()
    assert app.main(["fake"]) == 130 and fake_cli.errors == [("interrupted", ("fake",))]


def test_help_and_version_are_no_error(fake_cli: _Fake) -> None:
    for argv in (["fake", "--help"], ["--help"], ["--version"]):
        with pytest.raises(SystemExit) as exited:
            app.main(argv)
        assert exited.value.code == 0
    assert fake_cli.errors == []


# --- Commands do not import each other ---------------------------------------------------------


def command_imports(source: str, module: str, commands: Sequence[str], *,
                    is_package: bool = False) -> set[str]:
    """The command modules among ``commands`` that ``module`` (source ``source``) imports."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        found |= {n for n in names if n in commands and n != module}
    return found


def test_the_import_scan_finds_an_import_of_a_command() -> None:
    cmds = ("fastci.cli.plan", "fastci.cli.record")
    for src in ("from fastci.cli.plan import x\n", "from fastci.cli import plan\n",
                "from . import plan\n", "from .plan import x\n", "import fastci.cli.plan\n",
                "def f():\n    from fastci.cli.plan import x\n"):
        assert command_imports(src, "fastci.cli.explain", cmds) == {"fastci.cli.plan"}, src
    assert command_imports("from fastci.cli.options import x\nfrom fastci.plan.planner import y\n",
                           "fastci.cli.explain", cmds) == set()
    assert command_imports("from fastci.cli.plan import x\n", "fastci.cli.plan", cmds) == set()


def test_no_cli_module_imports_a_command_module() -> None:
    assert set(COMMAND_MODULES) <= {f"fastci.cli.{p.stem}" for p in CLI_DIR.glob("*.py")}
    bad = {}
    for path in sorted(CLI_DIR.glob("*.py")):
        is_package = path.stem == "__init__"
        module = "fastci.cli" if is_package else f"fastci.cli.{path.stem}"
        found = command_imports(path.read_text(encoding="utf-8"), module, COMMAND_MODULES,
                                is_package=is_package)
        if found:
            bad[path.name] = sorted(found)
    assert not bad, f"command modules import each other: {bad}"


def test_the_demo_imports_no_command() -> None:
    tree = ast.parse((REPO / "bench" / "demo.py").read_text(encoding="utf-8"))
    cli_imports = [ast.unparse(n) for n in ast.walk(tree)
                   if isinstance(n, (ast.Import, ast.ImportFrom)) and any(
                       name.startswith("fastci.cli") for name in (
                           [a.name for a in n.names] if isinstance(n, ast.Import)
                           else [n.module or ""]))]
    assert cli_imports == []
