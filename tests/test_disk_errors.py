"""A full disk or a read-only ``.fastci`` is one line, and a healthy store is not blamed.

Reported: both ended in tracebacks, with advice to move aside a store that was fine.
The cases use a real small tmpfs mounted over the repository's ``.fastci`` (CI runs as
root; where mounting is not allowed they are skipped, saying so).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from fastci.errors import StoreError
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, dump_plan, load_plan
from test_evidence_exchange import run_of

ROOT = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "lib.py").write_text("def f():\n    return 1\n")
    (root / "test_lib.py").write_text("import lib\n\n\ndef test_f():\n    assert lib.f() == 1\n")
    (root / ".gitignore").write_text(".fastci/\n__pycache__/\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    fastci = root / ".fastci"
    fastci.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(fastci)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(fastci)], capture_output=True)


def _healthy_store(repo: Path) -> bytes:
    with EvidenceStore.open(repo / ".fastci" / "evidence.db", create=True) as s:
        s.ingest(run_of(0, "test_lib.py::test_f", 1.0, ["lib.py::f"]))
    return (repo / ".fastci" / "evidence.db").read_bytes()


def _fastci(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastci", *args, "--root", str(repo)],
                          cwd=repo, capture_output=True, text=True, timeout=120)


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    assert "move it aside" not in res.stderr, res.stderr
    lines = [l for l in res.stderr.splitlines() if l.startswith("fastci: ")]
    assert lines, res.stderr
    return lines[-1]


def test_plan_on_a_read_only_fastci_folder(repo: Path) -> None:
    before = _healthy_store(repo)
    dump_plan(Plan.run_all("an old plan"), repo / ".fastci" / "plan.json")
    subprocess.run(["mount", "-o", "remount,ro", str(repo / ".fastci")], check=True)
    res = _fastci(repo, "plan", "--no-bazel")
    assert res.returncode != 0
    line = _one_line(res)
    assert "Read-only file system" in line, res.stderr
    assert (repo / ".fastci" / "evidence.db").read_bytes() == before


def test_plan_and_ingest_on_a_full_disk(repo: Path) -> None:
    _healthy_store(repo)
    filler = repo / ".fastci" / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    res = _fastci(repo, "plan", "--no-bazel")
    assert res.returncode != 0
    assert "disk is full" in _one_line(res) or "No space left" in _one_line(res)
    with pytest.raises(StoreError) as err:
        with EvidenceStore.open(repo / ".fastci" / "evidence.db") as s:
            for i in range(1, 200):  # enough rows to need a new page
                s.ingest(run_of(i, f"test_lib.py::test_{i}", float(i), ["lib.py::f"]))
    assert "cannot write the evidence store" in str(err.value)
    assert "move it aside" not in str(err.value)
    filler.unlink()
    with EvidenceStore.open(repo / ".fastci" / "evidence.db") as s:
        assert s.test_ids() == ["test_lib.py::test_f"]  # the healthy store is intact


def test_plan_piped_into_a_reader_that_stops_keeps_the_plan(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "lib.py").write_text("def f():\n    return 1\n")
    (root / ".gitignore").write_text(".fastci/\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    proc = subprocess.Popen([sys.executable, "-m", "fastci", "plan", "--no-bazel", "--root",
                             str(root)], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = proc.stderr.read() if proc.stderr else ""
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode in (0, 141), err
    plan = load_plan(root / ".fastci" / "plan.json")  # the plan written in full stays
    assert "fastci plan failed" not in plan.reason and plan.tree, plan
