"""Bad input, end to end: one line on stderr, a named exit code, and the safe side.

Each case runs the real ``fastci`` in a fresh process (so a traceback would show on
stderr) against a throwaway git repository and checks three things: stderr is the
one line ``fastci: <message>`` (or nothing, where the plan absorbs the problem),
the exit code, and the outcome (the plan runs everything and names the cause; the
store is left as it was; nothing is lost).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastci.evidence.record import trace
from fastci.evidence.store.schema import SCHEMA_VERSION
from fastci.evidence.store.db import EvidenceStore
from selection_support import Repo
from test_ingest import make, put


def fastci(cwd: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "fastci", *args], cwd=cwd, env=full,
                          capture_output=True, encoding="utf-8", errors="backslashreplace",
                          timeout=timeout, check=False)


def one_line(res: subprocess.CompletedProcess[str]) -> str:
    """The single ``fastci: ...`` line on stderr (fails on a traceback or several lines)."""
    lines = res.stderr.splitlines()
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and lines[0].startswith("fastci: "), res.stderr
    return lines[0]


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The closing ``fastci: ...`` line of a failed ``fastci plan``.

    Before it, the command's on_error hook says which plan it withdrew (one
    ``fastci plan: failed; ...`` line); anything else (a traceback) fails.
    """
    lines = res.stderr.splitlines()
    assert "Traceback" not in res.stderr, res.stderr
    assert lines and all(line.startswith("fastci") for line in lines), res.stderr
    assert len(lines) <= 2 and lines[-1].startswith("fastci: "), res.stderr
    return lines[-1]


def plan_of(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / ".fastci" / "plan.json").read_text())
    return data


@pytest.fixture()
def repo(tmp_path: Path) -> Repo:
    r = Repo(tmp_path / "repo")
    r.write({".gitignore": ".fastci/\n"})
    r.commit({"m.py": "def f():\n    return 1\n"})
    return r


def recorded_store(root: Path) -> Path:
    """A store holding one test's evidence (so "0 of 0" can never pass for a result)."""
    db = root / ".fastci" / "evidence.db"
    with EvidenceStore.open(db, create=True) as store:
        store.record_result("//t:a", outcome="passed", duration_s=1.0, commit=None, gpus=1,
                            workload={}, source="bazel")
    return db


# --------------------------------------------------------------------------- fastci.yaml


def test_non_utf8_config_is_one_line_and_the_plan_runs_everything(repo: Repo) -> None:
    recorded_store(repo.root)
    assert fastci(repo.root, "plan", "--no-bazel").returncode == 0
    assert plan_of(repo.root)["mode"] == "selective"  # the plan a failed run must withdraw
    (repo.root / "fastci.yaml").write_bytes(b"base: caf\xe9\n")
    res = fastci(repo.root, "plan", "--no-bazel")
    assert res.returncode == 2
    assert error_line(res) == f"fastci: {repo.root / 'fastci.yaml'}: not UTF-8 text (byte 9)"
    plan = plan_of(repo.root)
    assert plan["mode"] == "all" and "fastci.yaml: not UTF-8 text" in plan["reason"]


def test_yaml_tags_that_construct_objects_are_refused(repo: Repo) -> None:
    marker = repo.root / "pwned"
    recorded_store(repo.root)
    assert fastci(repo.root, "plan", "--no-bazel").returncode == 0
    (repo.root / "fastci.yaml").write_text(
        f"base: !!python/object/apply:os.system ['touch {marker}']\n")
    res = fastci(repo.root, "plan", "--no-bazel")
    assert res.returncode == 2
    assert "not valid YAML" in error_line(res) and "python/object/apply" in res.stderr
    assert not marker.exists()
    assert plan_of(repo.root)["mode"] == "all"


# --------------------------------------------------------------------------- git


def test_untracked_file_with_a_non_utf8_name_widens_without_a_traceback(repo: Repo) -> None:
    recorded_store(repo.root)
    name = os.fsdecode(b"caf\xe9.bin")
    (repo.root / name).write_bytes(b"data")
    res = fastci(repo.root, "plan", "--no-bazel")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "UnicodeDecodeError" not in res.stderr
    plan = plan_of(repo.root)
    # An unknown changed path: everything runs, and the reason is about that file
    # (not a decoding error of git's output).
    assert plan["mode"] == "all" and "changed" in plan["reason"]
    assert "caf\\xe9.bin" in plan["reason"]  # shown escaped, never as a raw surrogate
    assert "Error" not in plan["reason"]
    assert [t["id"] for t in plan["tests"]] == ["//t:a"]


# --------------------------------------------------------------------------- the store


def test_zero_byte_store_is_reported_empty_and_left_alone(repo: Repo) -> None:
    db = repo.root / ".fastci" / "evidence.db"
    db.parent.mkdir()
    db.write_bytes(b"")
    res = fastci(repo.root, "plan", "--no-bazel")
    assert res.returncode == 0, res.stderr
    plan = plan_of(repo.root)
    assert plan["mode"] == "all"
    assert f"the evidence store {db} is empty: run `fastci record`" in plan["reason"]
    assert "0 of 0 tests" not in res.stdout
    assert db.read_bytes() == b"" and not Path(f"{db}-wal").exists()  # a reader never writes
    res = fastci(repo.root, "evidence", "show", "//t:a")
    assert res.returncode == 2
    assert one_line(res) == f"fastci: the evidence store {db} is empty: run `fastci record`"
    assert db.read_bytes() == b""


@pytest.mark.parametrize("damage", ["truncated", "random", "table-dropped", "newer-schema"])
def test_a_damaged_store_widens_the_plan_naming_the_file(repo: Repo, damage: str) -> None:
    db = recorded_store(repo.root)
    if damage == "truncated":
        db.write_bytes(db.read_bytes()[:1500])
    elif damage == "random":
        db.write_bytes(os.urandom(8192))
    else:
        conn = sqlite3.connect(db)
        conn.execute("DROP TABLE file_read" if damage == "table-dropped" else
                     f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
        conn.commit()
        conn.close()
    before = db.read_bytes()
    res = fastci(repo.root, "plan", "--no-bazel")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    plan = plan_of(repo.root)
    assert plan["mode"] == "all" and str(db) in plan["reason"], plan["reason"]
    if damage == "table-dropped":
        assert "lacks table(s) file_read" in plan["reason"]
    if damage == "newer-schema":
        assert f"schema version {SCHEMA_VERSION + 1}" in plan["reason"]
    assert db.read_bytes() == before  # nothing was changed


def test_a_writer_holding_the_store_does_not_block_a_plan(repo: Repo) -> None:
    db = recorded_store(repo.root)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_WRITE_LOCK, str(db), "60"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        res = fastci(repo.root, "plan", "--no-bazel", timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert res.returncode == 0, res.stderr
    assert plan_of(repo.root)["mode"] == "selective"  # WAL: the reader sees the committed state


_HOLD_WRITE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO test (name) VALUES ('//t:pending')")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


# --------------------------------------------------------------------------- ingest


def test_concurrent_ingests_into_one_new_store_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store" / "evidence.db"
    dirs = []
    for i in range(4):
        d = tmp_path / f"traces{i}"
        put(d, make(f"t::test{i}", f"r{i}", 1.0 + i, {f"m{i}.py::f": ["ctx"]}))
        dirs.append(d)
    procs = [subprocess.Popen([sys.executable, "-m", "fastci", "ingest", str(d), "--store", str(db),
                               "--source", "pytest"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for d in dirs]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    assert all(rc == 0 for rc, _ in results), results
    assert all("Traceback" not in err for _, err in results)
    with EvidenceStore.open(db) as store:
        assert store.test_ids() == [f"t::test{i}" for i in range(4)]


def test_a_corrupted_trace_is_skipped_marked_incomplete_and_exits_1(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    put(traces, make("t::ok", "r1", 1.0, {"m.py::f": []}))
    bad = put(traces, make("t::bad", "r2", 1.0, {"m.py::g": []}))
    data = bytearray(bad.read_bytes())
    data[len(data) // 2:len(data) // 2 + 16] = os.urandom(16)
    bad.write_bytes(bytes(data))
    junk = traces / trace.file_name("t::junk", "r3", 1)
    junk.write_bytes(os.urandom(300))
    db = tmp_path / "e.db"
    res = fastci(tmp_path, "ingest", str(traces), "--store", str(db), "--source", "pytest")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert str(junk) in res.stdout
    with EvidenceStore.open(db) as store:
        latest = store.latest_runs()
        assert latest["t::ok"].complete
        assert not latest["t::junk"].complete
        # The flipped bytes either break the trace (incomplete) or hit bytes the decoder
        # does not check; either way the test is in the store, never lost.
        assert "t::bad" in latest


def test_ingested_own_traces_are_removed_corrupt_and_foreign_ones_kept(tmp_path: Path) -> None:
    """Issue 12 item 6: ``.fastci/runs`` does not grow by a full recording's traces per
    ingest; a corrupt trace stays for a person to look at, ``--keep-traces`` keeps all, and
    traces outside ``.fastci`` (bazel-testlogs, a folder the user named) are never deleted."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    own = tmp_path / ".fastci" / "runs" / "pytest-traces"
    ok = put(own, make("t::ok", "r1", 1.0, {"m.py::f": []}))
    junk = own / trace.file_name("t::junk", "r3", 1)
    junk.write_bytes(os.urandom(300))
    kept = put(own / "k", make("t::kept", "r4", 1.0, {"m.py::f": []}))
    foreign = put(tmp_path / "elsewhere", make("t::far", "r2", 1.0, {"m.py::f": []}))
    db = tmp_path / "e.db"
    res = fastci(tmp_path, "ingest", str(own / "k"), "--store", str(db), "--keep-traces")
    assert res.returncode == 0 and kept.exists(), res.stdout + res.stderr
    res = fastci(tmp_path, "ingest", str(own), str(foreign.parent), "--store", str(db))
    assert res.returncode == 1, res.stdout + res.stderr  # the junk trace
    assert not ok.exists() and not kept.exists() and junk.exists() and foreign.exists()
    assert "removed 2 ingested trace file(s)" in res.stdout
    with EvidenceStore.open(db) as store:
        assert {"t::ok", "t::kept", "t::far"} <= set(store.test_ids())


# --------------------------------------------------------------------------- plan files


@pytest.mark.parametrize("kind", ["truncated", "non-utf8", "directory", "dangling symlink"])
def test_an_unreadable_plan_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "plan.json"
    if kind == "truncated":
        path.write_text('{"version": 1, "mo')
    elif kind == "non-utf8":
        path.write_bytes(b'{"version": 1, "mode": "\xff"}')
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "nowhere.json")
    res = fastci(tmp_path, "validate-plan", str(path))
    assert res.returncode == 2
    assert "plan.json" in one_line(res)


def test_a_symlinked_plan_is_read_through_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"version": 1, "mode": "all", "reason": "r", "tests": []}))
    link = tmp_path / "plan.json"
    link.symlink_to(real)
    res = fastci(tmp_path, "validate-plan", str(link))
    assert res.returncode == 0, res.stderr
    assert "mode all" in res.stdout

