"""Tests of the lock-file GPU pool (fastci.run.gpus) with fake device lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastci.run import gpus
from fastci.errors import FastCIError


def test_discover_prefers_fake_list_then_cuda_visible_devices(tmp_path: Path) -> None:
    assert gpus.discover_devices({"FASTCI_FAKE_GPUS": "0, 1,3"}) == gpus.DeviceSource(("0", "1", "3"), "FASTCI_FAKE_GPUS")
    assert gpus.discover_devices({"FASTCI_FAKE_GPUS": "", "CUDA_VISIBLE_DEVICES": "2"}).devices == ()
    assert gpus.discover_devices({"CUDA_VISIBLE_DEVICES": "4,5", "PATH": str(tmp_path)}).devices == ("4", "5")
    assert gpus.discover_devices({"CUDA_VISIBLE_DEVICES": "-1", "PATH": str(tmp_path)}).devices == ()


def test_discover_parses_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-b)'\n"
    )
    smi.chmod(0o755)
    found = gpus.discover_devices({"PATH": str(tmp_path)})
    assert found == gpus.DeviceSource(("0", "1"), "nvidia-smi -L")
    assert gpus.discover_devices({"PATH": str(tmp_path / "nowhere")}).devices == ()


def test_leases_are_disjoint_and_all_or_nothing(tmp_path: Path) -> None:
    first = gpus.try_acquire(1, ["0", "1", "2"], tmp_path)
    second = gpus.try_acquire(1, ["0", "1", "2"], tmp_path)
    assert first is not None and second is not None
    assert first.devices == ("0",) and second.devices == ("1",)
    # Two are needed, one is free: take nothing (and leave "2" free).
    assert gpus.try_acquire(2, ["0", "1", "2"], tmp_path) is None
    third = gpus.try_acquire(1, ["0", "1", "2"], tmp_path)
    assert third is not None and third.devices == ("2",)
    first.release()
    again = gpus.try_acquire(1, ["0", "1", "2"], tmp_path)
    assert again is not None and again.devices == ("0",)
    for lease in (second, third, again):
        lease.release()


def test_acquire_errors_are_one_line_fastci_errors(tmp_path: Path) -> None:
    with pytest.raises(gpus.GpuPoolError, match=r"needs 3 GPU\(s\), this host has 2 \(0, 1\)"):
        gpus.acquire(3, ["0", "1"], tmp_path)
    held = gpus.try_acquire(1, ["0"], tmp_path)
    assert held is not None
    with pytest.raises(FastCIError, match="stayed busy"):
        gpus.acquire(1, ["0"], tmp_path, wait_s=0.2, poll_s=0.05)
    held.release()


def test_cpu_only_host_yields_no_devices_only_with_the_opt_in(tmp_path: Path) -> None:
    env = {"FASTCI_FAKE_GPUS": "", "FASTCI_GPU_LOCK_DIR": str(tmp_path)}
    for value in ("1", "true", "YES"):
        with gpus.gpus_for(2, {**env, "FASTCI_ALLOW_CPU": value}) as devices:
            assert devices == ()
    with gpus.gpus_for(0, {"FASTCI_FAKE_GPUS": "0", "FASTCI_GPU_LOCK_DIR": str(tmp_path)}) as devices:
        assert devices == ()
    with gpus.gpus_for(0, env) as devices:  # a CPU test needs no opt-in
        assert devices == ()


@pytest.mark.parametrize("value", [None, "", "0", "no", "false"])
def test_cpu_only_host_fails_a_gpu_test_without_the_opt_in(tmp_path: Path, value: str | None) -> None:
    # Regression (issue 9 item 14): a GPU test on a host without GPUs used to run on CPU, green.
    env = {"FASTCI_FAKE_GPUS": "", "FASTCI_GPU_LOCK_DIR": str(tmp_path)}
    if value is not None:
        env["FASTCI_ALLOW_CPU"] = value
    with pytest.raises(gpus.GpuPoolError, match=r"test needs 2 GPU\(s\) and this host has none \(FASTCI_FAKE_GPUS\); .*FASTCI_ALLOW_CPU=1"):
        with gpus.gpus_for(2, env):
            pytest.fail("must not yield")
    # The opt-in does not hide a host that has GPUs but too few.
    with pytest.raises(gpus.GpuPoolError, match="this host has 1"):
        with gpus.gpus_for(2, {"FASTCI_FAKE_GPUS": "0", "FASTCI_ALLOW_CPU": "1", "FASTCI_GPU_LOCK_DIR": str(tmp_path)}):
            pass


_HOLDER = """
import json, os, sys, time
from fastci.run import gpus
locks, marks, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
env = {"FASTCI_FAKE_GPUS": "0,1", "FASTCI_GPU_LOCK_DIR": locks}
with gpus.gpus_for(1, env) as devices:
    with open(os.path.join(marks, "held-%d" % os.getpid()), "w") as f:
        json.dump(devices, f)
    deadline = time.time() + hold_s
    while not os.path.exists(os.path.join(marks, "release")) and time.time() < deadline:
        time.sleep(0.02)
"""


def _holder(locks: Path, marks: Path, hold_s: float = 60) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(locks), str(marks), str(hold_s)])


def _held(marks: Path, count: int, timeout: float = 30) -> list[list[str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(marks.glob("held-*"))
        if len(files) >= count:
            time.sleep(0.05)  # let the writer finish
            return [json.loads(f.read_text()) for f in files]
        time.sleep(0.02)
    raise AssertionError(f"fewer than {count} holders got a device")


def test_concurrent_processes_get_different_devices_and_wait_when_full(tmp_path: Path) -> None:
    locks, marks = tmp_path / "locks", tmp_path / "marks"
    marks.mkdir()
    first = [_holder(locks, marks), _holder(locks, marks)]
    held = _held(marks, 2)  # both hold a device at the same time
    assert sorted(held) == [["0"], ["1"]]
    third = _holder(locks, marks)
    time.sleep(0.7)
    assert len(list(marks.glob("held-*"))) == 2, "a third test got a device while both were held"
    (marks / "release").touch()
    for proc in [*first, third]:
        assert proc.wait(timeout=60) == 0
    assert len(list(marks.glob("held-*"))) == 3  # the third ran once one was free
    assert sorted(os.listdir(locks)) == ["gpu-0.lock", "gpu-1.lock"]


def test_lock_is_released_when_the_holder_dies(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = _holder(tmp_path / "locks", marks)
    _held(marks, 1)
    assert gpus.try_acquire(2, ["0", "1"], tmp_path / "locks") is None
    proc.kill()
    proc.wait()
    lease = gpus.try_acquire(2, ["0", "1"], tmp_path / "locks")
    assert lease is not None and lease.devices == ("0", "1")
    lease.release()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_bad_wait_variable_is_one_line_naming_it(tmp_path: Path, value: str) -> None:
    env = {"FASTCI_FAKE_GPUS": "0", "FASTCI_GPU_LOCK_DIR": str(tmp_path), "FASTCI_GPU_WAIT_S": value}
    with pytest.raises(gpus.GpuPoolError) as err:
        with gpus.gpus_for(1, env):
            pytest.fail("must not yield")
    assert str(err.value) == f"FASTCI_GPU_WAIT_S={value!r}: expected a number of seconds (0 or more)"
    assert gpus.wait_seconds({"FASTCI_GPU_WAIT_S": " 2.5 "}) == 2.5
    assert gpus.wait_seconds({}) == gpus.DEFAULT_WAIT_S


def test_a_lock_directory_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "locks"
    blocker.write_text("not a directory")
    with pytest.raises(gpus.GpuPoolError, match=f"the GPU lock directory {blocker} is not a directory"):
        gpus.try_acquire(1, ["0"], blocker)
    with pytest.raises(gpus.GpuPoolError, match="cannot make the GPU lock directory"):
        gpus.try_acquire(1, ["0"], blocker / "sub")
    assert blocker.read_text() == "not a directory"


def test_a_busy_device_names_its_holders_pid(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = _holder(tmp_path / "locks", marks)
    try:
        _held(marks, 1)
        assert gpus.holder(tmp_path / "locks" / "gpu-0.lock") == proc.pid
        with pytest.raises(gpus.GpuPoolError) as err:
            gpus.acquire(2, ["0", "1"], tmp_path / "locks", wait_s=0.2, poll_s=0.05)
        assert str(err.value) == (f"2 of GPUs 0, 1 stayed busy for 0s ({tmp_path / 'locks'}; "
                                  f"held: 0 (pid {proc.pid}))")
    finally:
        proc.kill()
        proc.wait()


_LAUNCH = "import sys; from fastci.run.launch import main; sys.exit(main(sys.argv))"


@pytest.mark.parametrize("case", ["wait", "lock dir"])
def test_the_launcher_reports_pool_errors_in_one_line(tmp_path: Path, case: str) -> None:
    (tmp_path / "t.py").write_text("print('ran')\n")
    env = {"PATH": os.environ["PATH"], "FASTCI_GPUS": "1", "FASTCI_TEST_MAIN": "t.py",
           "FASTCI_FAKE_GPUS": "0", "FASTCI_GPU_LOCK_DIR": str(tmp_path / "locks"),
           "PYTHONPATH": str(Path(gpus.__file__).parents[2])}
    if case == "wait":
        env["FASTCI_GPU_WAIT_S"] = "abc"
    else:
        (tmp_path / "locks").write_text("")
    res = subprocess.run([sys.executable, "-c", _LAUNCH], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "ran" not in res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastci: "), res.stderr
    assert ("FASTCI_GPU_WAIT_S='abc'" if case == "wait" else "is not a directory") in lines[0]
