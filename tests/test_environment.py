"""The environment fingerprint: what it covers, and that plans compare the test runner's.

The runner's fingerprint is computed by running an interpreter, so these tests
use real processes: a fake ``nvidia-smi`` on the ``PATH`` that interpreter sees,
and a second virtual environment as a runner the planner does not run in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci.plan.planner import analyze
from fastci.plan.inputs import runner_python
from fastci.plan.inputs import Given
from fastci.config import Config
from fastci.errors import FastCIError
from fastci.evidence.record import environment
from fastci.evidence.record.environment import environment_of_interpreter
from fastci.select import DecisionKind
from selection_support import World, ingest, units_of

SMI = '#!/bin/sh\nprintf "%s\\n" "Fake GPU 80GB, {driver}" "Fake GPU 80GB, {driver}"\n'


def fake_smi(directory: Path, driver: str) -> Path:
    """A directory holding an ``nvidia-smi`` that reports two GPUs with ``driver``."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text(SMI.format(driver=driver))
    smi.chmod(0o755)
    return directory


def test_parse_gpus() -> None:
    assert environment.parse_gpus("NVIDIA H200, 550.54.15\nNVIDIA H200, 550.54.15\n") == (
        "NVIDIA H200", "550.54.15")
    assert environment.parse_gpus("") == ("", "")


def test_parse_ldcache_resolves_the_versioned_files(tmp_path: Path) -> None:
    real = tmp_path / "libcudart.so.12.4.127"
    real.write_text("")
    (tmp_path / "libcudart.so.12").symlink_to(real.name)
    listing = (f"3 libs found in cache `/etc/ld.so.cache'\n"
               f"\tlibcudart.so.12 (libc6,x86-64) => {tmp_path}/libcudart.so.12\n"
               f"\tlibcudart.so (libc6,x86-64) => {tmp_path}/libcudart.so\n"  # dev link: skipped
               f"\tlibstdc++.so.6 (libc6,x86-64) => /usr/lib/libstdc++.so.6\n"
               f"\tlibcudnn_ops.so.9 (libc6,x86-64) => /usr/lib/libcudnn_ops.so.9\n"
               f"\tlibz.so.1 (libc6,x86-64) => /lib/libz.so.1\n")
    assert environment.parse_ldcache(listing) == (
        f"libcudart.so.12 (libc6,x86-64) => {real}",
        f"libstdc++.so.6 (libc6,x86-64) => {os.path.realpath('/usr/lib/libstdc++.so.6')}")


def test_describe_covers_driver_toolkit_and_system_libraries() -> None:
    parts = environment.describe()
    assert {"python", "platform", "packages", "gpu_model", "driver", "cuda_toolkit", "libc",
            "libraries"} <= set(parts)
    if sys.platform.startswith("linux"):
        assert parts["libc"].startswith("glibc") and "libstdc++.so.6" in parts["libraries"]
    assert environment.current().fingerprint == environment.current_fingerprint()


def test_the_driver_version_changes_the_fingerprint(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.environ.get("PATH", "")
    prints = {}
    for driver in ("999.01", "999.02"):
        monkeypatch.setenv("PATH", f"{fake_smi(tmp_path / driver, driver)}{os.pathsep}{path}")
        prints[driver] = fingerprint_of_interpreter(sys.executable)
        # Which GPUs CUDA may use is not part of the machine's environment.
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert fingerprint_of_interpreter(sys.executable) == prints[driver]
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        shown = subprocess.run([sys.executable, "-m", "fastci.evidence.record.environment", "--json"],
                               capture_output=True, text=True, check=True).stdout
        assert f'"driver": "{driver}"' in shown and '"gpu_model": "Fake GPU 80GB"' in shown
    monkeypatch.setenv("PATH", path)
    assert len({*prints.values(), fingerprint_of_interpreter(sys.executable)}) == 3


def test_the_same_interpreter_computes_the_same_fingerprint_in_and_out_of_process() -> None:
    assert fingerprint_of_interpreter(sys.executable) == environment.current_fingerprint()


def test_an_interpreter_that_cannot_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FastCIError, match="cannot read the environment of"):
        fingerprint_of_interpreter(str(tmp_path / "no-python"))
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho not a fingerprint\n")
    broken.chmod(0o755)
    with pytest.raises(FastCIError, match="cannot read the environment of .*python"):
        fingerprint_of_interpreter(str(broken))
    broken.write_text('#!/bin/sh\necho \'{"fingerprint": "no"}\'\n')
    with pytest.raises(FastCIError, match="could not describe its environment"):
        fingerprint_of_interpreter(str(broken))


def fingerprint_of_interpreter(python: str) -> str:
    """The fingerprint the planner takes of a test runner's interpreter."""
    return environment_of_interpreter(python)["fingerprint"]


@pytest.fixture(scope="module")
def other_venv(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A second virtual environment: another package set than the planner's."""
    venv = tmp_path_factory.mktemp("runner") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True, capture_output=True)
    return str(venv / "bin" / "python")


@pytest.fixture
def runner_world(tmp_path: Path, other_venv: str) -> Iterator[World]:
    """The three-test world, recorded again by test processes that ran in ``other_venv``."""
    w = World(tmp_path / "repo")
    fp = fingerprint_of_interpreter(other_venv)
    assert fp != environment.current_fingerprint()  # the planner's process differs
    units = units_of(w.root, ["pkg/model.py", "pkg/data.py", "pkg/other.py"])
    for test, mod in (("//t:a", "model"), ("//t:b", "data"), ("//t:c", "other")):
        ingest(w.store, test, {u: c for u, c in units.items() if u.startswith(f"pkg/{mod}")},
               commit=w.base, env=fp, files={"data/cfg.json": "d1"} if mod == "data" else None)
    assert {r.env_fingerprint for r in w.store.latest_runs().values()} == {fp}
    yield w
    w.store.close()


def test_the_plan_compares_the_runners_fingerprint(runner_world: World, other_venv: str) -> None:
    w = runner_world
    a = analyze(w.root, Config(runner_python=other_venv), base=w.base, declared=Given(w.declared),
                store=w.store)
    assert a.plan.mode == "selective" and a.plan.tests == (), a.plan.reason
    # The planner's own interpreter is not where these tests ran: every test re-runs.
    a = analyze(w.root, Config(runner_python=sys.executable), base=w.base, declared=Given(w.declared),
                store=w.store)
    assert len(a.plan.tests) == 3
    assert all(DecisionKind.ENVIRONMENT_CHANGED in {r.kind for r in d.reasons}
               for d in a.selection.selected)


def test_an_unknown_runner_environment_reruns_every_test(runner_world: World,
                                                         tmp_path: Path) -> None:
    w = runner_world
    a = analyze(w.root, Config(runner_python=str(tmp_path / "gone/bin/python")), base=w.base,
                declared=Given(w.declared), store=w.store)
    assert len(a.plan.tests) == 3 and all("now unknown" in t.why for t in a.plan.tests)


def test_runner_python_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FASTCI_PYTHON", "VIRTUAL_ENV"):
        monkeypatch.delenv(var, raising=False)
    assert runner_python(tmp_path, Config()) == sys.executable
    venv = tmp_path / ".venv/bin/python3"
    venv.parent.mkdir(parents=True)
    venv.write_text("")
    assert runner_python(tmp_path, Config()) == str(venv)
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/venv")
    assert runner_python(tmp_path, Config()) == "/opt/venv/bin/python3"
    monkeypatch.setenv("FASTCI_PYTHON", "/opt/py/bin/python3")
    assert runner_python(tmp_path, Config()) == "/opt/py/bin/python3"
    assert runner_python(tmp_path, Config(runner_python="tools/py")) == str(tmp_path / "tools/py")
    assert runner_python(tmp_path, Config(runner_python="sh")).endswith("/sh")
    with pytest.raises(FastCIError, match="not on PATH"):
        runner_python(tmp_path, Config(runner_python="no-such-python-here"))
