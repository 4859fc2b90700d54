"""The SQLite evidence store: read API, newest-wins, schema versions, bulk load."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.errors import StoreError
from fastci.evidence.store.schema import SCHEMA_VERSION
from fastci.evidence.store.db import EvidenceStore, RunEvidence, RunRecord, pack_ids, unpack_ids


def run(test: str, at: float, units: dict[str, set[str]], *, key: str | None = None,
        files: dict[str, str] | None = None, complete: bool = True,
        outcome: str = "passed", checksum: str = "c1") -> RunEvidence:
    return RunEvidence(
        test=test, run_key=key or f"{test}@{at}", outcome=outcome, complete=complete,
        duration_s=2.5, gpus=2, workload={"train_iters": 10}, recorded_at=at,
        env_fingerprint="env1", environment={"python": "3.11"}, commit="abc",
        units={u: (checksum, frozenset(s)) for u, s in units.items()}, files=files or {})


@pytest.fixture
def store(tmp_path: Path) -> EvidenceStore:
    return EvidenceStore.open(tmp_path / ".fastci" / "evidence.db", create=True)


def test_read_api(store: EvidenceStore) -> None:
    store.ingest(run("//t:a", 1.0, {"m.py::f": {"bf16|tp=2", "f32"}, "m.py::<module>": set()},
                     files={"data/cfg.json": "d1"}))
    store.ingest(run("//t:b", 1.0, {"m.py::f": {"f32"}, "n.py::g": {"x"}}))
    assert store.test_ids() == ["//t:a", "//t:b"]
    assert store.tests_for_units(["m.py::f", "n.py::g", "zz.py::nope"]) == {
        "m.py::f": {"//t:a", "//t:b"}, "n.py::g": {"//t:b"}, "zz.py::nope": set()}
    assert store.tests_for_modules(["m.py", "n.py", "o.py"]) == {
        "m.py": {"//t:a", "//t:b"}, "n.py": {"//t:b"}, "o.py": set()}
    assert store.tests_for_files(["data/cfg.json", "other"]) == {
        "data/cfg.json": {"//t:a"}, "other": set()}
    assert store.units_of_test("//t:a") == {"m.py::f": ["bf16|tp=2", "f32"], "m.py::<module>": []}
    assert store.files_of_test("//t:a") == ["data/cfg.json"]
    assert {(u, c) for _, u, c in store.recorded_units()} == {
        ("m.py::f", "c1"), ("m.py::<module>", "c1"), ("n.py::g", "c1")}
    latest = store.latest_runs()
    a = latest["//t:a"]
    assert (a.commit, a.env_fingerprint, dict(a.workload), a.duration_s, a.gpus, a.outcome,
            a.complete, a.recorded_at) == ("abc", "env1", {"train_iters": 10}, 2.5, 2, "passed",
                                           True, 1.0)
    assert store.stats()["context"] == 3 and store.stats()["bytes"] > 0


def test_newest_run_wins_and_older_is_history(store: EvidenceStore) -> None:
    assert store.ingest(run("//t:a", 5.0, {"m.py::new": {"n"}}, checksum="c5"))
    assert store.ingest(run("//t:a", 3.0, {"m.py::old": {"o"}}, outcome="failed"))
    assert not store.ingest(run("//t:a", 5.0, {"m.py::new": {"n"}}))  # same key: no-op
    assert set(store.units_of_test("//t:a")) == {"m.py::new"}
    assert store.latest_runs()["//t:a"].recorded_at == 5.0
    assert [r.outcome for r in store.runs_of_test("//t:a")] == ["failed", "passed"]
    assert store.tests_for_units(["m.py::old"]) == {"m.py::old": set()}


def test_result_only_run_keeps_completeness_of_the_evidence(store: EvidenceStore) -> None:
    store.record_result("//t:new", outcome="failed", duration_s=1.0, commit=None, gpus=1,
                        workload={}, source="pytest", recorded_at=10.0)
    assert store.latest_runs()["//t:new"].complete is False  # no evidence: never complete
    store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))
    store.record_result("//t:a", outcome="failed", duration_s=9.0, commit="d", gpus=2,
                        workload={}, source="result", recorded_at=20.0)
    latest = store.latest_runs()["//t:a"]
    assert (latest.outcome, latest.complete, latest.env_fingerprint) == ("failed", True, "env1")
    assert set(store.units_of_test("//t:a")) == {"m.py::f"}  # results do not touch evidence


def test_schema_mismatch_is_one_line_error_and_touches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "evidence.db"
    EvidenceStore.open(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError) as err:
        EvidenceStore.open(path, create=True)
    msg = str(err.value)
    assert "\n" not in msg and "schema version 999" in msg and f"needs {SCHEMA_VERSION}" in msg
    assert "move it aside" in msg
    assert path.read_bytes() == before


def test_missing_and_garbage_stores(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no evidence store"):
        EvidenceStore.open(tmp_path / "none.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a readable evidence store"):
        EvidenceStore.open(junk, create=True)
    assert junk.read_bytes() == b"this is not sqlite" * 100


def test_wal_reader_is_not_blocked_by_writer(store: EvidenceStore) -> None:
    store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.conn.execute("BEGIN IMMEDIATE")
    store.conn.execute("INSERT INTO test (name) VALUES ('//t:pending')")
    reader = EvidenceStore.open(store.path)
    assert reader.test_ids() == ["//t:a"]  # sees the committed state, immediately
    store.conn.execute("COMMIT")
    assert reader.test_ids() == ["//t:a", "//t:pending"]
    reader.close()


def test_reads_kept_for_a_plan_follow_every_writer(store: EvidenceStore) -> None:
    """latest_runs, test_ids, baselines and evidence_commits are read once per plan and
    kept; a write through the same object or another connection's commit drops them."""
    store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))
    reader = EvidenceStore.open(store.path)
    assert set(reader.latest_runs()) == {"//t:a"} and reader.baselines() == {"//t:a": "abc"}
    store.ingest(RunEvidence(test="//t:b", run_key="b1", outcome="failed", complete=True,
                             duration_s=1.0, gpus=1, workload={}, recorded_at=2.0,
                             commit="def", units={"m.py::g": ("c1", frozenset())}))
    assert reader.latest_runs()["//t:b"].outcome == "failed"  # another connection's commit
    assert reader.test_ids() == ["//t:a", "//t:b"]
    assert reader.baselines() == {"//t:a": "abc", "//t:b": "def"}
    assert reader.evidence_commits() == {"abc", "def"}
    store.record_result("//t:a", outcome="failed", duration_s=1.0, commit="ghi", gpus=1,
                        workload={}, source="bazel", recorded_at=3.0)
    assert store.latest_runs()["//t:a"].outcome == "failed"  # its own write
    got = reader.baselines()
    got["//t:c"] = None  # a copy: the kept read does not change
    assert reader.baselines() == {"//t:a": "abc", "//t:b": "def"}
    reader.close()


def test_bulk_load_matches_queries(store: EvidenceStore) -> None:
    tests = [f"//t:{i}" for i in range(20)]
    units = [(f"m{i % 5}.py::f{i}", f"c{i}") for i in range(50)]
    contexts = ["a", "b", "c"]
    ev = sorted(((t, u, [t % 3]) for t in range(20) for u in range(50) if (t + u) % 7 == 0),
                key=lambda e: (e[1], e[0]))
    store.bulk_load(tests, units, contexts, ev)
    expected = {units[u][0]: {tests[t] for t, uu, _ in ev if uu == u} for u in range(50)}
    assert store.tests_for_units([u for u, _ in units]) == expected
    assert store.units_of_test("//t:3")["m4.py::f4"] == ["a"]
    assert all(r.complete for r in store.latest_runs().values())
    with pytest.raises(StoreError, match="empty store"):
        store.bulk_load(tests, units, contexts, [])


def test_bulk_load_keeps_the_source_files_given(store: EvidenceStore) -> None:
    tests = ["//t:a", "//t:b"]
    units = [("m.py::f", "c1"), ("n.py::g", "c2")]
    store.bulk_load(tests, units, ["x"], [(0, 0, [0]), (1, 1, [0])],
                    sources=[(0, "m.py", "d-m"), (1, "n.py", "d-n")])
    assert store.source_digests() == [("//t:a", "m.py", "d-m"), ("//t:b", "n.py", "d-n")]


def test_pack_round_trip() -> None:
    assert unpack_ids(pack_ids([5, 1, 5, 70000])) == [1, 5, 70000]


@settings(max_examples=25, deadline=None)
@given(st.permutations([1.0, 2.0, 3.0, 4.0]))
def test_newest_wins_in_any_ingest_order(tmp_path_factory: pytest.TempPathFactory,
                                         order: list[float]) -> None:
    path = tmp_path_factory.mktemp("perm") / "e.db"
    with EvidenceStore.open(path, create=True) as s:
        for at in order:
            s.ingest(run("//t:a", at, {f"m.py::v{int(at)}": set()}))
        assert set(s.units_of_test("//t:a")) == {"m.py::v4"}
        assert len(s.runs_of_test("//t:a")) == 4


def test_evidence_commits_are_those_of_the_evidence_runs(store: EvidenceStore) -> None:
    assert store.evidence_commits() == set()
    store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))  # recorded at commit "abc"
    store.record_result("//t:a", outcome="failed", duration_s=9.0, commit="d", gpus=2,
                        workload={}, source="result", recorded_at=20.0)
    assert store.evidence_commits() == {"abc"}  # a result-only run moves no evidence


def test_runs_keep_declared_workload_and_overrides_apart(store: EvidenceStore) -> None:
    declared = {"train_iters": 8, "hidden_size": 64}
    store.record_result("//t:a", outcome="passed", duration_s=1.0, commit=None, gpus=1,
                        workload=declared, overrides={"train_iters": 2, "hidden_size": 64},
                        source="bazel", recorded_at=1.0)
    r = store.latest_runs()["//t:a"]
    # An override equal to the declared value changes nothing: it is dropped.
    assert (dict(r.workload), r.overrides, r.full) == (declared, {"train_iters": 2}, False)
    assert r.last_full is None
    store.ingest(RunEvidence(test="//t:a", run_key="k2", outcome="failed", complete=True,
                             duration_s=1.0, gpus=1, workload=declared, recorded_at=2.0,
                             overrides={}))
    store.record_result("//t:a", outcome="passed", duration_s=1.0, commit=None, gpus=1,
                        workload=declared, source="bazel", recorded_at=3.0)  # overrides unknown
    runs = store.runs_of_test("//t:a")
    assert [(r.overrides, r.full) for r in runs] == [
        ({"train_iters": 2}, False), ({}, True), (None, False)]
    latest = store.latest_runs()["//t:a"]
    assert latest.outcome == "passed" and latest.overrides is None
    assert latest.last_full is not None and latest.last_full.outcome == "failed" \
        and latest.last_full.recorded_at == 2.0  # the newest run known to be at full workload
    store.record_result("//t:a", outcome="passed", duration_s=1.0, commit=None, gpus=1,
                        workload=declared, overrides={}, source="bazel", recorded_at=4.0)
    latest = store.latest_runs()["//t:a"]
    assert latest.last_full is not None and latest.last_full.recorded_at == 4.0 and latest.full


def test_a_run_record_is_its_fields_whatever_its_layout(store: EvidenceStore) -> None:
    """A record read from the store equals one built from the same fields (JSON text and
    parsed dicts, its own id or none); it is its own last full run without recursing in
    ==, repr or pickle; and it cannot be hashed or changed."""
    store.ingest(RunEvidence(test="//t:a", run_key="k1", outcome="passed", complete=True,
                             duration_s=2.5, gpus=2, workload={"steps": 4}, recorded_at=1.0,
                             overrides={}, env_fingerprint="e1"))
    got = store.latest_runs()["//t:a"]
    assert got.last_full is got and got.full and got.complete is True
    built = RunRecord("//t:a", None, "e1", {"steps": 4}, 2.5, 2, "passed", True, 1.0,
                      overrides={}, environment_json=got.environment_json)
    assert got != built  # built has no last full run
    history = store.runs_of_test("//t:a")
    assert history == [built] and history[0].last_full is None
    again = pickle.loads(pickle.dumps(got))
    assert again == got and again.last_full is again
    assert "last_full=<itself>" in repr(got) and "'steps': 4" in repr(got)
    with pytest.raises(TypeError):
        hash(got)
    with pytest.raises(AttributeError):
        got.outcome = "failed"  # type: ignore[misc]
    w = got.workload
    w["steps"] = 1  # type: ignore[index]
    assert got.workload == {"steps": 4}  # a copy each read: the record does not change
    assert RunRecord("//t:b", None, "e", {}, 1.0, 1, "failed", False, 2.0, last_full=built) \
        .last_full == built


def test_old_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evidence.db"
    EvidenceStore.open(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=f"schema version 1, this FastCI needs {SCHEMA_VERSION}; "
                                         "move it aside"):
        EvidenceStore.open(path)
    assert SCHEMA_VERSION == 4


def test_a_reader_never_initialises_an_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "evidence.db"
    path.write_bytes(b"")
    with pytest.raises(StoreError) as err:
        EvidenceStore.open(path)
    assert str(err.value) == f"the evidence store {path} is empty: run `fastci record`"
    assert path.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["evidence.db"]
    # A writer initialises it (the same file, now with the schema).
    EvidenceStore.open(path, create=True).close()
    with EvidenceStore.open(path) as store:
        assert store.test_ids() == []


def test_a_store_missing_a_table_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "evidence.db"
    EvidenceStore.open(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE evidence")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    for create in (False, True):
        with pytest.raises(StoreError, match=r"lacks table\(s\) evidence; move it aside"):
            EvidenceStore.open(path, create=create)
    assert path.read_bytes() == before


def test_a_directory_is_no_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        EvidenceStore.open(tmp_path, create=True)


def test_a_locked_store_names_the_holder_after_a_bounded_wait(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from fastci.evidence.store.db import StoreLockedError, lock_holders

    path = tmp_path / "evidence.db"
    EvidenceStore.open(path, create=True).close()
    assert lock_holders(path) == []
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert lock_holders(path) == [holder.pid]
        store = EvidenceStore.open(path, create=True, lock_wait_s=0.3)
        started = time.monotonic()
        with pytest.raises(StoreLockedError) as err:
            store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))
        assert time.monotonic() - started < 10
        assert str(err.value).startswith(f"the evidence store {path} is locked by another writer "
                                         f"(pid {holder.pid}) and stayed locked for 0.3 s")
        assert "\n" not in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    assert store.ingest(run("//t:a", 1.0, {"m.py::f": set()}))  # the holder's gone: it works
    store.close()


_HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO test (name) VALUES ('//t:pending')")
print("held", flush=True)
time.sleep(60)
"""


def test_lock_holders_reads_write_locks_of_the_file_from_the_lock_table(tmp_path: Path) -> None:
    import os

    from fastci.evidence.store.db import lock_holders

    path = tmp_path / "evidence.db"
    path.write_bytes(b"x")
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    table = tmp_path / "locks"
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE 4242 {dev}:{st.st_ino} 0 EOF\n"
        f"2: POSIX  ADVISORY  READ  4343 {dev}:{st.st_ino} 0 EOF\n"  # a reader: not the writer
        f"3: POSIX  ADVISORY  WRITE 4444 {dev}:{st.st_ino + 1} 0 EOF\n"  # another file
        f"4: -> POSIX  ADVISORY  WRITE 4545 {dev}:{st.st_ino} 0 EOF\n")  # a waiter
    assert lock_holders(path, table) == [4242]
    assert lock_holders(path, tmp_path / "no-such-table") == []


def test_paths_that_are_not_utf8_are_unknown_to_the_store(store: EvidenceStore) -> None:
    store.ingest(run("//t:a", 1.0, {"m.py::f": set()}, files={"d.bin": "x"}))
    odd = "caf\udce9.bin"  # git's b"caf\xe9.bin" decoded with surrogateescape
    assert store.tests_for_files([odd, "d.bin"]) == {odd: set(), "d.bin": {"//t:a"}}
    assert store.tests_for_modules([odd]) == {odd: set()}
    assert store.tests_for_units([f"{odd}::f"]) == {f"{odd}::f": set()}
    assert store.file_digests([odd]) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["//t:a", "//t:b", "//t:c"]),
                          st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from(["k1", "k2", "k3"]),
                          st.sampled_from([None, {}, {"steps": 1}]), st.booleans()),
                max_size=12))
def test_latest_runs_are_the_last_runs_of_test_in_their_order(tmp_path_factory: pytest.TempPathFactory,
                                                              runs: list) -> None:
    """latest_runs() (selected in SQL) is each test's last run in runs_of_test's order (ties:
    the greater run key) with its newest full-workload run as last_full."""
    with EvidenceStore.open(tmp_path_factory.mktemp("s") / "e.db", create=True) as s:
        for test, at, key, overrides, result in runs:
            if result:
                s.record_result(test, outcome="passed", duration_s=at, commit=None, gpus=1,
                                workload={"steps": 4}, source="result", recorded_at=at,
                                run_key=f"{test}:{key}", overrides=overrides)
            else:
                s.ingest(RunEvidence(test, f"{test}:{key}", "passed", True, at, 1,
                                     {"steps": 4}, at, overrides=overrides))
        latest = s.latest_runs()
        assert set(latest) == {t for t, *_ in runs}
        for test, got in latest.items():
            history = s.runs_of_test(test)
            fulls = [r for r in history if r.full]
            assert _public(got) == _public(history[-1])
            assert (got.last_full is None) == (not fulls)
            if fulls:
                assert _public(got.last_full) == _public(fulls[-1])
                assert (got.last_full is got) == history[-1].full


def _public(r: Any) -> tuple[Any, ...]:
    """A run record's fields but its last_full."""
    return (r.test, r.commit, r.env_fingerprint, dict(r.workload), r.duration_s, r.gpus,
            r.outcome, r.complete, r.recorded_at, r.overrides, r.environment_json,
            r.packages_list)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["//t:a", "//t:b", "//t:c"]),
                          st.sampled_from([1.0, 2.0, 3.0]), st.integers(0, 30),
                          st.sampled_from(["passed", "failed", "skipped", "error"])),
                max_size=30, unique_by=lambda r: (r[0], r[2])),
       st.integers(1, 4))
def test_recent_outcomes_are_the_last_runs_of_test_newest_first(
        tmp_path_factory: pytest.TempPathFactory, runs: list, n: int) -> None:
    """recent_outcomes() (one windowed query) gives what runs_of_test() ends with, reversed."""
    with EvidenceStore.open(tmp_path_factory.mktemp("s") / "e.db", create=True) as s:
        for test, at, key, outcome in runs:
            s.record_result(test, outcome=outcome, duration_s=1.0, commit=None, gpus=1,
                            workload={}, source="result", recorded_at=at,
                            run_key=f"{test}:{key:02d}")
        got = s.recent_outcomes(["//t:a", "//t:b", "//t:c", "//t:none"], n)
        assert set(got) == {t for t, *_ in runs}
        for test, outcomes in got.items():
            assert outcomes == tuple(r.outcome for r in reversed(s.runs_of_test(test)))[:n]


def test_run_json_keeps_values_of_equal_hash_apart() -> None:
    """The canonical JSON of workloads and environments is kept by content: 1, 1.0 and
    True are equal and hash alike in Python, and must still be written as they are."""
    from fastci.evidence.store.writes import _json

    assert _json({"a": 1}) == '{"a": 1}'
    assert _json({"a": True}) == '{"a": true}'
    assert _json({"a": 1.0}) == '{"a": 1.0}'
    assert _json({"b": 2, "a": [1]}) == '{"a": [1], "b": 2}'
    assert _json({"a": [True]}) == '{"a": [true]}'
    assert _json({}) == "{}"
