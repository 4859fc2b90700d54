"""What a recorded test runs where the tracer cannot follow (issue 32, items 1 and 4).

* Autograd's device threads: while a process records, autograd multithreading is
  off, so backward bodies run on the calling thread (on CUDA they would otherwise
  run on threads coverage.py never traces); a custom ``autograd.Function``'s
  backward is in the test's evidence and editing it selects the test.
* Python children that leave no trace (a clean environment, ``python -I``) make
  the test's evidence incomplete, with a reason; children that recorded, and
  programs that are not Python, keep it complete.

Each case records with the real recorder, ingests, edits the code and plans.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from fastci.config import Config
from fastci.evidence.record.children import ENV_DIR, ENV_TEST, SITE_DIR_PREFIX, python_start
from fastci.evidence.record.autograd import AutogradSwitch
from fastci.evidence.store.ingest import find_traces, ingest as ingest_traces
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given
from fastci.select import DeclaredTest
from fastci.select.explain import explain
from selection_support import Repo

# Run one check of checks/suite.py, recorded into argv[2]; print its outcome last.
RUNNER = '''import importlib, sys, traceback
from pathlib import Path
from fastci.evidence.record.recorder import Recorder
name = sys.argv[1]
rec = Recorder("//checks:" + name, Path(sys.argv[2]), repo_root=Path.cwd(), workload={}, gpus=1)
rec.start()
outcome = "passed"
try:
    getattr(importlib.import_module("checks.suite"), name)()
except BaseException:
    traceback.print_exc()
    outcome = "failed"
rec.stop(outcome)
print(outcome)
'''


def _record(files: dict[str, str], names: list[str], tmp: Path) -> tuple[Repo, str]:
    """A git repository of ``files`` whose checks ``names`` were recorded and ingested."""
    repo = Repo(tmp / "repo")
    base = repo.commit({**files, "checks/__init__.py": "", "lib/__init__.py": "",
                        "runner.py": RUNNER, ".gitignore": "/.fastci/\n/traces/\n__pycache__/\n"})
    for name in names:
        res = subprocess.run([sys.executable, "runner.py", name, str(repo.root / "traces")],
                             cwd=repo.root, capture_output=True, text=True, timeout=300)
        assert res.stdout.strip().endswith("passed"), res.stdout + res.stderr
    with EvidenceStore.open(repo.root / ".fastci/evidence.db", create=True) as store:
        report = ingest_traces(store, find_traces([repo.root / "traces"]), source="pytest",
                               commit=base)
        assert not report.corrupt
    return repo, base


def _plan(repo: Repo, base: str, names: list[str], edit: tuple[str, str, str]) -> dict[str, str]:
    """Apply ``edit`` (path, old, new) and plan: planned test -> what ``fastci explain`` says."""
    path, old, new = edit
    text = (repo.root / path).read_text()
    assert old in text
    (repo.root / path).write_text(text.replace(old, new, 1))
    declared = {f"//checks:{n}": DeclaredTest(f"//checks:{n}", 1, {}) for n in names}
    with EvidenceStore.open(repo.root / ".fastci/evidence.db") as store:
        a = analyze(repo.root, Config(), base=base, declared=Given(declared), store=store)
        return {t.id: "\n".join(explain(a.selection, t.id, store)) for t in a.plan.tests}


def _latest(repo: Repo) -> dict[str, object]:
    with EvidenceStore.open(repo.root / ".fastci/evidence.db") as store:
        return dict(store.latest_runs())


def _units(repo: Repo, test: str) -> set[str]:
    with EvidenceStore.open(repo.root / ".fastci/evidence.db") as store:
        return set(store.units_of_test(test))


# --------------------------------------------------------------------------- item 1: autograd

SWITCH = '''import sys
from pathlib import Path
import torch
from fastci.evidence.record.recorder import Recorder
before = torch._C._is_multithreading_enabled()
rec = Recorder("t", Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=0)
rec.start()
inside = torch._C._is_multithreading_enabled()
import subprocess
child = subprocess.run([sys.executable, "-c", "import torch; "
                        "print(torch._C._is_multithreading_enabled())"],
                       capture_output=True, text=True, check=True).stdout.strip()
rec.stop("passed")
print(before, inside, child, torch._C._is_multithreading_enabled())
'''
NO_TORCH = '''import sys
from pathlib import Path
from fastci.evidence.record.recorder import Recorder
rec = Recorder("t", Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=0)
rec.start()
x = sum(range(10))
rec.stop("passed")
print("torch" in sys.modules, "torch._C" in sys.modules)
'''


def test_autograd_multithreading_is_off_while_recording_and_restored_after(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "switch.py").write_text(SWITCH)
    res = subprocess.run([sys.executable, "switch.py", str(tmp_path / "traces")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # Before: on; while recording: off, also in a recorded child that imports torch after
    # its recorder started; after stop: on again.
    assert res.stdout.split() == ["True", "False", "False", "True"], res.stdout + res.stderr


def test_a_process_that_never_imports_torch_does_not_load_it(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(NO_TORCH)
    res = subprocess.run([sys.executable, "plain.py", str(tmp_path / "traces")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False"]


def test_the_switch_through_torch_c_and_a_torch_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off at start, back at stop, through ``torch._C``; a torch without the switch that
    used CUDA is named (its backward ran on device threads), one on CPU is not."""
    calls: list[bool] = []
    ext = types.ModuleType("torch._C")
    ext._is_multithreading_enabled = lambda: True  # type: ignore[attr-defined]
    ext._set_multithreading_enabled = calls.append  # type: ignore[attr-defined]
    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: True  # type: ignore[attr-defined]
    fake = types.ModuleType("torch")
    fake.__version__ = "1.13.1"  # type: ignore[attr-defined]
    for name, mod in (("torch", fake), ("torch._C", ext), ("torch.cuda", cuda)):
        monkeypatch.setitem(sys.modules, name, mod)
    switch = AutogradSwitch()
    switch.start()
    assert calls == [False] and switch.unseen() == ""
    switch.restore()
    assert calls == [False, True]
    del ext._set_multithreading_enabled  # type: ignore[attr-defined]
    switch.start()
    assert "torch 1.13.1" in switch.unseen() and "device threads" in switch.unseen()
    cuda.is_initialized = lambda: False  # type: ignore[attr-defined]
    assert switch.unseen() == ""
    switch.restore()


TP = '''import torch


class CopyToTP(torch.autograd.Function):
    """Identity forward; the backward scales the gradient (a stand-in for an all-reduce)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 2
'''
TP_CHECKS = '''import torch
from lib.tp import CopyToTP

DEVICE = "{device}"


def test_grad():
    x = torch.ones(3, requires_grad=True, device=DEVICE)
    CopyToTP.apply(x).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))


def test_forward_only():
    with torch.no_grad():
        assert torch.equal(CopyToTP.apply(torch.ones(2, device=DEVICE)).cpu(), torch.ones(2))
'''


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_editing_a_custom_backward_selects_the_test_that_ran_it(tmp_path: Path,
                                                                device: str) -> None:
    """On CPU autograd runs backward on the calling thread anyway; on CUDA (a GPU host:
    ``make gpu-check``) only the switch keeps it off the device threads."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device on this host")
    names = ["test_grad", "test_forward_only"]
    repo, base = _record({"lib/tp.py": TP, "checks/suite.py": TP_CHECKS.format(device=device)},
                         names, tmp_path)
    assert "lib/tp.py::CopyToTP.backward" in _units(repo, "//checks:test_grad")
    assert "lib/tp.py::CopyToTP.backward" not in _units(repo, "//checks:test_forward_only")
    planned = _plan(repo, base, names, ("lib/tp.py", "return grad * 2", "return grad * 3"))
    assert set(planned) == {"//checks:test_grad"}
    assert "CopyToTP.backward" in planned["//checks:test_grad"]


# --------------------------------------------------------------------------- item 4: children

HELPER = '''def work():
    return 6
'''
CHILD_MAIN = '''import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lib.helper import work
assert work() == 6
'''
CHILD_CHECKS = '''import os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "checks", "child_main.py")


def test_clean_env():
    # A launcher that builds each rank's environment from scratch.
    env = {"PATH": os.environ.get("PATH", ""), "RANK": "0"}
    subprocess.run([sys.executable, CHILD], env=env, check=True)


def test_isolated():
    subprocess.run([sys.executable, "-I", CHILD], check=True)


def test_inherited():
    subprocess.run([sys.executable, CHILD], check=True)
    subprocess.run(["git", "--version"], check=True, capture_output=True)
'''
BREAK_HELPER = ("lib/helper.py", "return 6", "return 7")


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> tuple[Repo, str]:
    return _record({"lib/helper.py": HELPER, "checks/child_main.py": CHILD_MAIN,
                    "checks/suite.py": CHILD_CHECKS},
                   ["test_clean_env", "test_isolated", "test_inherited"],
                   tmp_path_factory.mktemp("children"))


@pytest.mark.parametrize("name", ["test_clean_env", "test_isolated"])
def test_a_python_child_that_left_no_trace_selects_its_test(children: tuple[Repo, str],
                                                             name: str) -> None:
    repo, base = children
    test = f"//checks:{name}"
    run = _latest(repo)[test]
    assert not run.complete  # type: ignore[attr-defined]
    assert "child_main.py" in run.incomplete_reason  # type: ignore[attr-defined]
    try:
        planned = _plan(repo, base, ["test_clean_env", "test_isolated", "test_inherited"],
                        BREAK_HELPER)
    finally:
        repo.git("checkout", "-q", "--", ".")
    assert test in planned
    assert "started a Python child" in planned[test] and "left no trace" in planned[test]


def test_a_child_that_recorded_keeps_the_evidence_complete(children: tuple[Repo, str]) -> None:
    repo, base = children
    run = _latest(repo)["//checks:test_inherited"]
    assert run.complete and not run.incomplete_reason  # type: ignore[attr-defined]
    assert "lib/helper.py::work" in _units(repo, "//checks:test_inherited")
    try:
        planned = _plan(repo, base, ["test_inherited"], BREAK_HELPER)
    finally:
        repo.git("checkout", "-q", "--", ".")
    assert "lib/helper.py::work" in planned["//checks:test_inherited"]


def test_which_python_children_cannot_record(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """A Python child records only through FastCI's variables and sitecustomize on its
    PYTHONPATH, with site on: each way of losing them is named when the child starts."""
    site = tmp_path / f"{SITE_DIR_PREFIX}x"
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_TEST, "t")
    monkeypatch.setenv("PYTHONPATH", str(site))

    def why(argv: list[str], env: dict[str, str] | None = None) -> str:
        got = python_start("subprocess.Popen", (argv[0], argv, None, env))
        assert got is not None
        return got.untraced

    assert why([sys.executable, "x.py"]) == ""
    assert why([sys.executable, "-u", "-X", "dev", "-m", "pkg.mod", "-I"]) == ""
    assert "-I" in why([sys.executable, "-I", "x.py"])
    assert "-E" in why([sys.executable, "-bE", "x.py"])
    assert "-S" in why([sys.executable, "-S", "-c", "print(1)"])
    assert "FASTCI_RECORD" in why([sys.executable, "x.py"], env={"PATH": "/bin"})
    assert "sitecustomize" in why([sys.executable, "x.py"],
                                  env={ENV_DIR: "d", ENV_TEST: "t", "PATH": "/bin"})
    assert "FASTCI_RECORD" in why(["env", "-i", "PATH=/bin", "python3", "x.py"])
    assert why(["env", "RANK=0", "python3", "x.py"]) == ""
    assert "env -i" in why(["/bin/sh", "-c", "env -i python3 x.py"])
    assert "-E" in why(["/bin/sh", "-c", "cd /tmp && python -E x.py"])


COUNTED = '''import sys
from pathlib import Path
from fastci.evidence.record.children import PythonStart
from fastci.evidence.record.recorder import Recorder
from fastci.evidence.record import trace
rec = Recorder("t", Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=0)
rec.start()
# A start that should have recorded (its environment was FastCI's) but left no trace.
rec._python_started("subprocess.Popen", PythonStart("python worker.py"))
# A forked child records (its trace names this process as parent) but was never audited as
# a start: it must not stand in for the missing one.
import multiprocessing
p = multiprocessing.get_context("fork").Process(target=sum, args=([1, 2],))
p.start(); p.join()
print(list(trace.read(rec.stop("passed")).incomplete_reasons))
'''


def test_a_child_expected_to_record_that_left_no_trace_is_counted(tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(COUNTED)
    res = subprocess.run([sys.executable, "counted.py", str(tmp_path / "traces")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "it started a Python child (python worker.py) that left no trace" in res.stdout


def test_which_started_programs_are_python(tmp_path: Path) -> None:
    script = tmp_path / "torchrun"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/sh\necho hi\n")
    shell.chmod(shell.stat().st_mode | stat.S_IXUSR)
    popen = "subprocess.Popen"

    def started(argv: list[str], event: str = popen) -> bool:
        args: tuple[object, ...] = (argv[0], argv, None, None) if event == popen else \
            (argv[0], argv, None)
        return python_start(event, args) is not None

    assert started([sys.executable, "-I", "x.py"])
    assert started(["python3.11", "-m", "torch.distributed.run", "x.py"])
    assert started([str(script), "--nproc-per-node=2", "x.py"])
    assert started(["/usr/bin/env", "-i", "PATH=/bin", "python3", "x.py"])
    assert started(["timeout", "60", sys.executable, "x.py"])
    assert started(["/bin/sh", "-c", "cd /tmp && python -E x.py"])
    assert started([sys.executable, "x.py"], event="os.posix_spawn")
    assert python_start("os.system", ("python3 -S x.py",)) is not None
    assert python_start("os.spawn", (os.P_WAIT, sys.executable, [sys.executable, "x.py"],
                                     None)) is not None
    assert not started(["git", "--version"])
    assert not started(["nvidia-smi", "-L"])
    assert not started([str(shell)])
    assert not started(["/bin/sh", "-c", "echo hi"])
    assert not started([sys.executable, "--version"])  # runs no code, leaves no trace
    assert python_start("os.exec", ()) is None  # malformed: no answer, no exception


def test_a_shell_started_child_that_recorded_counts(tmp_path: Path) -> None:
    """A Python child started through ``sh -c`` (its parent is the shell, which left no
    trace) is this process's child: the evidence stays complete."""
    repo, base = _record({"lib/helper.py": HELPER, "checks/child_main.py": CHILD_MAIN,
                          "checks/suite.py": textwrap.dedent('''
                              import os, subprocess, sys
                              def test_shell():
                                  child = os.path.join(os.path.dirname(__file__), "child_main.py")
                                  subprocess.run(f"cd / && {sys.executable} {child}; true",
                                                 shell=True, check=True)
                              ''')}, ["test_shell"], tmp_path)
    run = _latest(repo)["//checks:test_shell"]
    assert run.complete, run.incomplete_reason  # type: ignore[attr-defined]
    assert "lib/helper.py::work" in _units(repo, "//checks:test_shell")
