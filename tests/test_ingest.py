"""fastci ingest / evidence show: merging shards, idempotence, corrupt traces, testlogs."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from fastci import cli
from fastci.evidence import trace, trace_pb2
from fastci.evidence.ingest import find_traces, ingest, label_from_testlogs
from fastci.evidence.store import EvidenceStore


def make(test: str, run_id: str, at: float, units: dict[str, list[str]], *, role: str = "main",
         complete: bool = True, outcome: str = "passed", pid: int = 1,
         reads: tuple[str, ...] = ()) -> trace_pb2.Trace:
    t = trace_pb2.Trace(format_version=trace.FORMAT_VERSION, test_id=test, run_id=run_id,
                        complete=complete, outcome=outcome if role == "main" else "", role=role,
                        pid=pid, started_at=at, duration_s=1.5, gpus=1,
                        workload_json=json.dumps({"steps": 4}))
    t.environment.fingerprint = "envA"
    by_file: dict[str, list[tuple[str, list[str]]]] = {}
    for uid, sigs in units.items():
        path, _, qual = uid.partition("::")
        by_file.setdefault(path, []).append((qual, sigs))
    for path, quals in sorted(by_file.items()):
        ft = t.files.add(path=path, digest="d")
        for qual, sigs in quals:
            ids = []
            for s in sigs:
                if s not in t.contexts:
                    t.contexts.append(s)
                ids.append(list(t.contexts).index(s))
            ft.units.add(qualname=qual, checksum="c", contexts=ids)
    for r in reads:
        t.reads.add(path=r, digest="x")
    return t


def put(d: Path, t: trace_pb2.Trace) -> Path:
    return trace.write_atomic(d / trace.file_name(t.test_id, t.run_id, t.pid), t)


def counts(db: Path) -> dict[str, int]:
    with EvidenceStore.open(db) as s:
        return s.stats() | {"bytes": 0}


def test_merge_children_shards_and_idempotence(tmp_path: Path) -> None:
    a, b = tmp_path / "machine_a", tmp_path / "machine_b"
    put(a, make("t::x", "r1", 10.0, {"m.py::f": ["ctx-main"]}, reads=("data/x.json",)))
    put(a, make("t::x", "r1", 10.5, {"m.py::f": ["ctx-rank1"], "m.py::g": []}, role="child",
                pid=2))
    put(b, make("t::y", "r2", 11.0, {"n.py::h": []}))
    db = tmp_path / "e.db"
    with EvidenceStore.open(db, create=True) as s:
        rep = ingest(s, find_traces([a, b]), source="pytest", commit="c0")
        assert (rep.traces, rep.runs_added, rep.corrupt) == (3, 2, [])
        assert s.units_of_test("t::x") == {"m.py::f": ["ctx-main", "ctx-rank1"], "m.py::g": []}
        assert s.files_of_test("t::x") == ["data/x.json"]
        assert s.latest_runs()["t::x"].recorded_at == 10.0 and s.latest_runs()["t::x"].complete
        assert s.test_ids() == ["t::x", "t::y"]
    before = counts(db)
    with EvidenceStore.open(db) as s:
        again = ingest(s, find_traces([b, a]), source="pytest", commit="c0")
    assert (again.runs_added, again.runs_skipped) == (0, 2)
    assert counts(db) == before


def test_same_test_twice_newest_wins(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    put(old, make("t::x", "r-old", 1.0, {"m.py::old": []}))
    put(new, make("t::x", "r-new", 2.0, {"m.py::new": []}))
    db = tmp_path / "e.db"
    with EvidenceStore.open(db, create=True) as s:
        ingest(s, find_traces([new]), source="pytest", commit=None)
        ingest(s, find_traces([old]), source="pytest", commit=None)  # late shard, older run
        assert set(s.units_of_test("t::x")) == {"m.py::new"}


def test_child_without_clean_stop_makes_run_incomplete(tmp_path: Path) -> None:
    put(tmp_path, make("t::x", "r1", 1.0, {"m.py::f": []}))
    put(tmp_path, make("t::x", "r1", 1.1, {}, role="child", complete=False, pid=7))
    with EvidenceStore.open(tmp_path / "e.db", create=True) as s:
        rep = ingest(s, find_traces([tmp_path]), source="pytest", commit=None)
        assert rep.incomplete_tests == {"t::x"}
        assert s.latest_runs()["t::x"].complete is False


def test_shared_segments_are_merged_with_what_they_include(tmp_path: Path) -> None:
    shared = make("", "sess", 0.5, {}, role="shared")
    coll = shared.segments.add(key="sess/c1", includes=["sess/c2"])
    coll.files.add(path="t.py", digest="d").units.add(qualname="<module>", checksum="c")
    consts = shared.segments.add(key="sess/c2")
    ft = consts.files.add(path="consts.py", digest="d")
    shared.contexts.append("args()|caller=t.py::<module>")
    ft.units.add(qualname="<module>", checksum="c", contexts=[0])
    trace.write_atomic(tmp_path / "s-collection.sess.1.trace", shared)
    x = make("t::x", "r1", 1.0, {"t.py::x": []})
    fixture = x.segments.add(key="sess/fx1:setup")
    fixture.files.add(path="fx.py", digest="d").units.add(qualname="data", checksum="c")
    fixture.reads.add(path="data/x.json", digest="x")
    x.shared.extend(["sess/c1", "sess/fx1:setup"])
    put(tmp_path, x)
    y = make("t::y", "r2", 2.0, {"t.py::y": []})
    y.shared.extend(["sess/c1", "sess/fx1:setup"])
    put(tmp_path, y)
    z = make("t::z", "r3", 3.0, {"t.py::z": []})
    z.shared.extend(["sess/c1", "sess/fx9:teardown"])  # its trace was never written
    put(tmp_path, z)
    with EvidenceStore.open(tmp_path / "e.db", create=True) as s:
        rep = ingest(s, find_traces([tmp_path]), source="pytest", commit=None)
        assert rep.runs_added == 3 and s.test_ids() == ["t::x", "t::y", "t::z"]
        assert s.units_of_test("t::y") == {
            "t.py::y": [], "t.py::<module>": [], "fx.py::data": [],
            "consts.py::<module>": ["args()|caller=t.py::<module>"]}
        assert set(s.units_of_test("t::x")) == set(s.units_of_test("t::y")) - {"t.py::y"} | {"t.py::x"}
        assert s.tests_for_files(["data/x.json"]) == {"data/x.json": {"t::x", "t::y"}}
        assert rep.incomplete_tests == {"t::z"}
        assert s.latest_runs()["t::z"].complete is False
        assert s.latest_runs()["t::y"].complete is True


def test_corrupt_trace_is_reported_skipped_and_incomplete(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    traces = tmp_path / "traces"
    good = put(traces, make("t::ok", "r1", 1.0, {"m.py::f": []}))
    bad = put(traces, make("t::bad", "r2", 1.0, {"m.py::g": []}))
    bad.write_bytes(bad.read_bytes()[:-5])
    db = tmp_path / "e.db"
    rc = cli.main(["ingest", str(traces), "--store", str(db)])
    out = capsys.readouterr().out
    assert rc == 1
    assert str(bad) in out and "truncated" in out
    assert "1 with incomplete evidence" in out and "1 corrupt trace(s) skipped" in out
    with EvidenceStore.open(db) as s:
        latest = s.latest_runs()
        assert latest["t::ok"].complete and not latest["t::bad"].complete
    assert good.exists() and bad.exists()  # nothing deleted
    assert cli.main(["ingest", str(traces), "--store", str(db)]) == 1  # still reported
    assert "0 run(s) added" in capsys.readouterr().out


def test_bazel_testlogs_zip_and_bep(tmp_path: Path) -> None:
    logs = tmp_path / "bazel-testlogs"
    loose = logs / "pkg" / "sub" / "a_test" / "test.outputs" / "fastci_traces"
    put(loose, make("//pkg/sub:a_test", "r1", 1.0, {"pkg/sub/a.py::f": []}))
    zdir = logs / "pkg" / "b_test" / "shard_1_of_2" / "test.outputs"
    zdir.mkdir(parents=True)
    t = make("//pkg:b_test", "r2", 1.0, {"pkg/b.py::g": []}, outcome="passed")
    with zipfile.ZipFile(zdir / "outputs.zip", "w") as zf:
        zf.writestr("fastci_traces/" + trace.file_name(t.test_id, t.run_id, 1), trace.encode(t))
        zf.writestr("fastci_workload.json", "{}")
    (logs / "pkg" / "c_test" / "test.outputs").mkdir(parents=True)
    (logs / "pkg" / "c_test" / "test.outputs" / "outputs.zip").write_bytes(b"broken zip")
    stale = logs / "pkg" / "stale_test" / "test.outputs" / "fastci_traces"
    put(stale, make("//pkg:stale_test", "r0", 0.5, {"pkg/s.py::s": []}))  # an older invocation
    assert label_from_testlogs(zdir / "outputs.zip", logs) == "//pkg:b_test"
    bep = tmp_path / "bep.json"
    bep.write_text("\n".join(json.dumps(e) for e in [
        {"id": {"testSummary": {"label": "//pkg:b_test"}},
         "testSummary": {"overallStatus": "FAILED", "totalRunDurationMillis": "4000"}},
        {"id": {"testSummary": {"label": "//pkg/sub:a_test"}},
         "testSummary": {"overallStatus": "PASSED", "totalRunDurationMillis": "2000"}},
        {"id": {"testSummary": {"label": "//pkg:c_test"}},
         "testSummary": {"overallStatus": "FAILED", "totalRunDurationMillis": "100"}},
    ]) + "\n")
    db = tmp_path / "e.db"
    rc = cli.main(["ingest", str(logs), "--bep", str(bep), "--store", str(db)])
    assert rc == 1  # the broken archive
    with EvidenceStore.open(db) as s:
        latest = s.latest_runs()
        assert (latest["//pkg:b_test"].outcome, latest["//pkg:b_test"].duration_s) == ("failed", 4.0)
        assert latest["//pkg/sub:a_test"].duration_s == 2.0
        assert not latest["//pkg:c_test"].complete
        assert "//pkg:stale_test" not in latest  # not in this invocation's build events
        assert s.tests_for_units(["pkg/b.py::g"]) == {"pkg/b.py::g": {"//pkg:b_test"}}


def test_evidence_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put(tmp_path / "tr", make("t::x", "r1", 1.0, {"m.py::f": ["args(x=T(bf16,2d,cpu,s))|tp=2"]},
                              reads=("data/cfg.yaml",)))
    db = tmp_path / "e.db"
    assert cli.main(["ingest", str(tmp_path / "tr"), "--store", str(db)]) == 0
    capsys.readouterr()
    assert cli.main(["evidence", "show", "t::x", "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert "m.py::f  [1 context(s)]" in out and "T(bf16,2d,cpu,s)" in out
    assert "data/cfg.yaml" in out and "last run: passed" in out and "complete evidence" in out
    assert cli.main(["evidence", "show", "t::nope", "--store", str(db)]) == 2
    assert "no evidence for 't::nope'" in capsys.readouterr().err


def test_ingest_into_a_store_locked_by_another_writer_is_one_line_naming_the_holder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from fastci.evidence import store as store_mod

    traces = tmp_path / "traces"
    put(traces, make("t::a", "r1", 1.0, {"m.py::f": []}))
    db = tmp_path / "e.db"
    EvidenceStore.open(db, create=True).close()
    hold = ("import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); c.execute(\"INSERT INTO test (name) VALUES ('x')\")\n"
            "print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdout=subprocess.PIPE,
                              text=True)
    monkeypatch.setattr(store_mod, "LOCK_WAIT_S", 0.5)  # the bounded wait (30 s by default)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc = cli.main(["ingest", str(traces), "--store", str(db), "--source", "pytest"])
    finally:
        holder.kill()
        holder.wait()
    assert rc == 2
    err = capsys.readouterr().err
    assert err == (f"fastci: the evidence store {db} is locked by another writer (pid {holder.pid})"
                   " and stayed locked for 0.5 s; runs ingested so far are kept: retry when it"
                   " finishes\n")
    # Retrying once the writer is gone ingests the run.
    assert cli.main(["ingest", str(traces), "--store", str(db), "--source", "pytest"]) == 0
    with EvidenceStore.open(db) as s:
        assert s.test_ids() == ["t::a"]
