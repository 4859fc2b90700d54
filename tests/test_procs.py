"""Children end with FastCI: a cancelled ``fastci run`` leaves no pytest behind.

Reported: SIGTERM or SIGINT sent to the ``fastci run`` process alone (what most CI
cancel buttons do) left its pytest child running, re-parented to PID 1, holding
GPUs and locks. Each case starts the real command in its own process, waits until
the test is running (it writes its pid and its child's), signals FastCI only, and
checks that pytest and the test's own child are gone and FastCI said why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastci.integrations import procs
from fastci.plan.model import Plan, PlannedTest, dump_plan
from plan_support import tie
from test_pytest_ids import _commit, _project

HANGS = '''
import os, subprocess, sys, time

def test_hangs():
    here = os.path.dirname(__file__)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.path.join(here, "pids.txt"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}\\n")
    time.sleep(300)
'''


def _wait_for(path: Path, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().endswith("\n"):
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_cancelled_run_stops_pytest_and_the_tests_children(tmp_path: Path, sig: int) -> None:
    root = _project(tmp_path)
    (root / "pkg/tests/foo_test.py").unlink()
    (root / "pkg/tests/bar_test.py").write_text(HANGS)
    (root / ".gitignore").write_text("__pycache__/\n/.fastci/\npids.txt\n")
    _commit(root)
    dump_plan(tie(Plan("selective", tests=(PlannedTest("pkg/tests/bar_test.py::test_hangs"),)),
                  root), root / ".fastci/plan.json")
    fastci = subprocess.Popen([sys.executable, "-m", "fastci", "run", "--root", str(root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pytest_pid, grandchild = _wait_for(root / "pkg/tests/pids.txt")
        fastci.send_signal(sig)
        out, err = fastci.communicate(timeout=60)
    finally:
        if fastci.poll() is None:
            fastci.kill()
    assert fastci.returncode == 128 + sig, out + err
    assert f"cancelled by {signal.Signals(sig).name}" in err
    assert procs.wait_gone(pytest_pid, 15), "pytest outlived fastci run"
    assert procs.wait_gone(grandchild, 15), "the test's child outlived fastci run"


def test_a_child_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the parent-death signal still ends the child."""
    pidfile = tmp_path / "pid"
    script = (f"from fastci.integrations import procs\n"
              f"p = procs.start(['sleep', '300'])\n"
              f"open({str(pidfile)!r}, 'w').write(f'{{p.pid}}\\n')\n"
              f"p.wait()\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        (child,) = _wait_for(pidfile)
        parent.kill()
        parent.wait(timeout=30)
        assert procs.wait_gone(child, 15)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_run_with_a_timeout_stops_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = (f"import subprocess, time\n"
            f"c = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(pidfile)!r}, 'w').write(f'{{c.pid}}\\n')\n"
            f"time.sleep(300)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run([sys.executable, "-c", code], timeout=3)
    (grandchild,) = _wait_for(pidfile, 5)
    assert procs.wait_gone(grandchild, 15)
    assert procs.stop_all() == 0


def test_control_characters_in_test_ids_are_printed_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reported: test ids with control characters (``\\x1b[...``, newlines) were printed
    raw: a plan (or store) could clear the terminal or forge a PASSED line."""
    from fastci import cli

    root = _project(tmp_path)
    (root / ".gitignore").write_text("__pycache__/\n/.fastci/\n")
    _commit(root)
    forged = "pkg/tests/bar_test.py::test_x\x1b[2J\n  PASSED     everything"
    dump_plan(tie(Plan("selective", tests=(PlannedTest(forged),)), root),
              root / ".fastci/plan.json")
    cli.main(["run", "--root", str(root)])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\n  PASSED     everything" not in out, out
    assert "test_x\\x1b[2J\\x0a  PASSED     everything" in out, out


CALIBRATED_HANG = '''
import os, time

import pytest


@pytest.mark.fastci_workload(workload={"steps": 8}, floors={"steps": 2})
def test_train():
    with open(os.path.join(os.path.dirname(__file__), "pids.txt"), "w") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(300)
'''


def test_a_cancelled_calibration_stops_its_rung_and_removes_its_scratch_folder(
        tmp_path: Path) -> None:
    from selection_support import Repo

    root = tmp_path / "repo"
    Repo(root).commit({"tests/__init__.py": "", "tests/test_t.py": CALIBRATED_HANG,
                       ".gitignore": "__pycache__/\n.fastci/\npids.txt\n"})
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "FASTCI_PROGRESS": "0"}
    fastci = subprocess.Popen([sys.executable, "-m", "fastci", "calibrate", "--no-bazel",
                               "--root", str(root)], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        (rung,) = _wait_for(root / "tests" / "pids.txt")
        assert any(p.name.startswith("fastci-calibrate-") for p in scratch.iterdir())
        fastci.send_signal(signal.SIGTERM)
        out, err = fastci.communicate(timeout=60)
    finally:
        if fastci.poll() is None:
            fastci.kill()
    assert fastci.returncode == 128 + signal.SIGTERM, out + err
    assert procs.wait_gone(rung, 15), "the rung's pytest outlived fastci calibrate"
    assert not [p for p in scratch.iterdir() if p.name.startswith("fastci-calibrate-")]
