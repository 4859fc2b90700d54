"""Tests of the gpu_test launcher (fastci.run.launch), run as Bazel would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from fastci.run import launch
from fastci.errors import FastCIError

_MAIN = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cuda": os.environ["CUDA_VISIBLE_DEVICES"],
                  "name": __name__, "path0": sys.path[0]}))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "t.py").write_text(_MAIN)
    outputs = tmp_path / "outputs"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(Path(launch.__file__).parents[2]),
        "FASTCI_WORKLOAD": json.dumps({"train_iters": 2, "dtype": "bf16"}),
        "FASTCI_MODE": "fastci",
        "FASTCI_TEST_ID": "//pkg:t",
        "FASTCI_GPUS": "1",
        "FASTCI_TEST_MAIN": "pkg/t.py",
        "FASTCI_PLAN_STATUS": "ok: selective plan, 1 tests, 0 skipped",
        "FASTCI_FAKE_GPUS": "0,1",
        "FASTCI_GPU_LOCK_DIR": str(tmp_path / "locks"),
        "TEST_UNDECLARED_OUTPUTS_DIR": str(outputs),
    }
    env.update(extra)
    return env


def _launch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from fastci.run.launch import main; sys.exit(main(sys.argv))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )


def test_launcher_runs_main_with_args_devices_and_writes_workload_record(tmp_path: Path) -> None:
    res = _launch(tmp_path, _env(tmp_path, EXIT_WITH="3"), "--extra")
    assert res.returncode == 3, res.stderr
    seen = json.loads(res.stdout)
    # Bazel's args first, then the workload flags the launcher builds (sorted).
    assert seen["argv"] == ["--extra", "--dtype=bf16", "--train_iters=2"]
    assert seen["cuda"] == "0"
    assert seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path / "pkg")
    record = json.loads((tmp_path / "outputs" / launch.WORKLOAD_FILE).read_text())
    assert record == {
        "test": "//pkg:t",
        "mode": "fastci",
        "workload": {"train_iters": 2, "dtype": "bf16"},
        "declared": None,
        "overrides": None,
        "gpus": 1,
        "devices": ["0"],
        "plan_status": "ok: selective plan, 1 tests, 0 skipped",
        "scale": "declared",
        "cpu_scale": {},
    }
    assert "fastci: //pkg:t mode=fastci gpus=1 devices=[0]" in res.stderr


def test_workload_record_keeps_declared_workload_and_overrides_apart(tmp_path: Path) -> None:
    env = _env(tmp_path, FASTCI_DECLARED_WORKLOAD=json.dumps({"train_iters": 20, "dtype": "bf16"}))
    res = _launch(tmp_path, env)
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "outputs" / launch.WORKLOAD_FILE).read_text())
    assert record["workload"] == {"train_iters": 2, "dtype": "bf16"}
    assert record["declared"] == {"train_iters": 20, "dtype": "bf16"}
    assert record["overrides"] == {"train_iters": 2}
    bad = _launch(tmp_path, _env(tmp_path, FASTCI_DECLARED_WORKLOAD="[1]"))
    assert bad.returncode == 2 and "FASTCI_DECLARED_WORKLOAD" in bad.stderr


def test_cpu_only_host_runs_on_cpu_only_with_the_opt_in(tmp_path: Path) -> None:
    res = _launch(tmp_path, _env(tmp_path, FASTCI_FAKE_GPUS="", FASTCI_ALLOW_CPU="1"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["cuda"] == ""
    assert json.loads((tmp_path / "outputs" / launch.WORKLOAD_FILE).read_text())["devices"] == []
    assert "fastci: WARNING: //pkg:t needs 1 GPU(s) and runs on CPU (FASTCI_ALLOW_CPU=1)" in res.stderr


def test_cpu_only_host_fails_a_gpu_test_without_the_opt_in(tmp_path: Path) -> None:
    # Regression (issue 9 item 14): this used to run on CPU and pass green.
    for allow in (None, "0", ""):
        env = _env(tmp_path, FASTCI_FAKE_GPUS="")
        if allow is not None:
            env["FASTCI_ALLOW_CPU"] = allow
        res = _launch(tmp_path, env)
        assert res.returncode == 2, res.stdout
        assert res.stdout == ""  # the test's main never ran
        assert res.stderr.strip().splitlines() == [
            "fastci: test needs 1 GPU(s) and this host has none (FASTCI_FAKE_GPUS); to run it on CPU anyway, "
            "opt in with FASTCI_ALLOW_CPU=1 (bazel test --test_env=FASTCI_ALLOW_CPU=1)"
        ]


def test_cpu_test_needs_no_opt_in(tmp_path: Path) -> None:
    res = _launch(tmp_path, _env(tmp_path, FASTCI_FAKE_GPUS="", FASTCI_GPUS="0"))
    assert res.returncode == 0, res.stderr
    assert "WARNING" not in res.stderr


NASTY = ["a b", "it's", 'say "hi"', "$(echo hi)", "$HOME", "`id`", "line1\nline2", "x;y|z&", "--flag=v", "", " lead", "\\"]


def test_workload_values_reach_main_verbatim_one_argv_element_each(tmp_path: Path) -> None:
    # Issue 9 item 15: flags come from FASTCI_WORKLOAD, never through a shell or Bazel's args.
    workload = {f"s{i}": v for i, v in enumerate(NASTY)} | {"n": 3, "f": 0.25, "b": True, "off": False}
    res = _launch(tmp_path, _env(tmp_path, FASTCI_WORKLOAD=json.dumps(workload)), "--own arg")
    assert res.returncode == 0, res.stderr
    want = [f"--{d}={launch.render_value(workload[d])}" for d in sorted(workload)]
    assert json.loads(res.stdout)["argv"] == ["--own arg", *want]
    assert "--b=true" in want and "--off=false" in want and "--f=0.25" in want and "--s3=$(echo hi)" in want


def test_workload_flags_render_and_reject_bad_entries() -> None:
    assert launch.workload_flags({"b": True, "a": 2, "c": "bf16", "d": 0.5}) == ["--a=2", "--b=true", "--c=bf16", "--d=0.5"]
    with pytest.raises(launch.LaunchError, match="not a dimension name"):
        launch.workload_flags({"a b": 1})
    with pytest.raises(launch.LaunchError, match="x: expected int, float, string or bool, got list"):
        launch.workload_flags({"x": [1]})


def test_too_few_gpus_is_a_one_line_error(tmp_path: Path) -> None:
    res = _launch(tmp_path, _env(tmp_path, FASTCI_GPUS="4"))
    assert res.returncode == 2
    assert res.stderr.strip() == "fastci: test needs 4 GPU(s), this host has 2 (0, 1)"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"FASTCI_WORKLOAD": "{bad"}, "FASTCI_WORKLOAD is not JSON"),
        ({"FASTCI_WORKLOAD": "[1]"}, "FASTCI_WORKLOAD: expected a JSON object, got list"),
        ({"FASTCI_GPUS": "two"}, "FASTCI_GPUS: expected an int, got 'two'"),
        ({"FASTCI_TEST_MAIN": ""}, "FASTCI_TEST_MAIN is not set"),
    ],
)
def test_bad_environment_is_rejected(changes: dict[str, str], message: str) -> None:
    env = {"FASTCI_WORKLOAD": "{}", "FASTCI_GPUS": "1", "FASTCI_TEST_MAIN": "t.py"}
    env.update(changes)
    with pytest.raises(launch.LaunchError, match=message):
        launch.LaunchConfig.from_env(env)


def test_missing_main_names_the_paths(tmp_path: Path) -> None:
    with pytest.raises(FastCIError, match="test main 'nope.py' not found"):
        launch.resolve_main("nope.py", {}, tmp_path)


class _FakeRecorder:
    calls: list[tuple[str, Any]] = []

    def __init__(self, test_id: str, out_dir: Path, *, repo_root: Path, workload: Any, gpus: int) -> None:
        self.calls.append(("init", (test_id, out_dir, repo_root, dict(workload), gpus)))

    def start(self) -> None:
        self.calls.append(("start", None))

    def stop(self, outcome: str) -> Path:
        self.calls.append(("stop", outcome))
        return Path("trace")


def _record_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "t.py").write_text("import sys\nsys.exit(1)\n")
    return {
        "FASTCI_WORKLOAD": '{"steps": 1}',
        "FASTCI_GPUS": "0",
        "FASTCI_TEST_ID": "//:t",
        "FASTCI_TEST_MAIN": "t.py",
        "FASTCI_RECORD": "1",
        "TEST_UNDECLARED_OUTPUTS_DIR": str(tmp_path / "out"),
    }


def test_recording_wraps_the_run_in_the_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("fastci.evidence.record.recorder")
    module.Recorder = _FakeRecorder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fastci.evidence.record.recorder", module)
    monkeypatch.chdir(tmp_path)
    _FakeRecorder.calls = []
    assert launch.launch([], _record_env(tmp_path)) == 1
    assert _FakeRecorder.calls == [
        ("init", ("//:t", tmp_path / "out" / "fastci_traces", tmp_path, {"steps": 1}, 0)),
        ("start", None),
        ("stop", "failed"),
    ]


def test_recording_without_recorder_module_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastci.evidence.record.recorder", None)  # import fails
    monkeypatch.chdir(tmp_path)
    with pytest.raises(launch.LaunchError, match="FASTCI_RECORD=1 but fastci.evidence.record.recorder cannot be imported"):
        launch.launch([], _record_env(tmp_path))


_DECLARED = {"train_iters": 40, "num_layers": 8, "dtype": "bf16"}
_CPU_SCALE = {"train_iters": 10, "num_layers": 2}


def _scale_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    given = {"FASTCI_WORKLOAD": json.dumps(_DECLARED), "FASTCI_MODE": "full",
             "FASTCI_DECLARED_WORKLOAD": json.dumps(_DECLARED),
             "FASTCI_CPU_WORKLOAD": json.dumps(_CPU_SCALE)}
    return _env(tmp_path, **{**given, **extra})


def _record(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "outputs" / launch.WORKLOAD_FILE).read_text()))


def test_on_a_gpu_host_the_declared_workload_runs_never_the_cpu_scale(tmp_path: Path) -> None:
    res = _launch(tmp_path, _scale_env(tmp_path))  # FASTCI_FAKE_GPUS=0,1: a GPU host
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["argv"] == ["--dtype=bf16", "--num_layers=8", "--train_iters=40"]
    record = _record(tmp_path)
    assert (record["scale"], record["cpu_scale"], record["overrides"]) == ("declared", {}, {})
    assert "CPU scale" not in res.stderr


def test_a_cpu_only_test_on_a_gpu_host_keeps_its_declared_workload(tmp_path: Path) -> None:
    res = _launch(tmp_path, _scale_env(tmp_path, FASTCI_GPUS="0", FASTCI_FAKE_GPUS="0"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["argv"] == ["--dtype=bf16", "--num_layers=8", "--train_iters=40"]
    assert _record(tmp_path)["scale"] == "declared"


def test_without_any_gpu_the_cpu_scale_runs_and_is_recorded_as_overrides(tmp_path: Path) -> None:
    res = _launch(tmp_path, _scale_env(tmp_path, FASTCI_FAKE_GPUS="", FASTCI_ALLOW_CPU="1"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["argv"] == ["--dtype=bf16", "--num_layers=2", "--train_iters=10"]
    record = _record(tmp_path)
    assert record["scale"] == "cpu"
    assert record["cpu_scale"] == _CPU_SCALE
    assert record["overrides"] == _CPU_SCALE  # evidence and calibration see a reduced run
    assert record["declared"] == _DECLARED
    assert "no GPU on this host: running its declared CPU scale" in res.stderr


def test_the_cpu_scale_never_raises_what_a_plan_reduced(tmp_path: Path) -> None:
    env = _scale_env(tmp_path, FASTCI_FAKE_GPUS="", FASTCI_ALLOW_CPU="1",
                     FASTCI_WORKLOAD=json.dumps({**_DECLARED, "train_iters": 4}))
    res = _launch(tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["argv"] == ["--dtype=bf16", "--num_layers=2", "--train_iters=4"]
    assert _record(tmp_path)["cpu_scale"] == {"num_layers": 2}


@pytest.mark.parametrize("raw, message", [
    ("[1]", "expected a JSON object"),
    ('{"layers": 2}', "'layers' is not a declared dimension"),
    ('{"train_iters": 2.5}', "expected a number typed like the declared 40"),
])
def test_a_malformed_cpu_scale_is_one_line_and_runs_nothing(tmp_path: Path, raw: str, message: str) -> None:
    res = _launch(tmp_path, _scale_env(tmp_path, FASTCI_CPU_WORKLOAD=raw))
    assert res.returncode != 0
    assert res.stdout == ""  # the test's main never ran
    assert message in res.stderr and "Traceback" not in res.stderr
