"""fastci ingest / evidence show: merging shards, idempotence, corrupt traces, testlogs."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastci import cli
from fastci.evidence.record import trace, trace_pb2
from fastci.evidence.store.ingest import (TraceUnits, find_traces, index_segments, ingest,
                                          label_from_testlogs, merge_run)
from fastci.evidence.store.db import EvidenceStore


@pytest.fixture(autouse=True, params=["columns", "messages"])
def trace_format(request: pytest.FixtureRequest) -> str:
    """Every test here runs on traces as the recorder writes them (format 2: units as
    columns) and as older recorders wrote them (format 1: one message per unit)."""
    global FORMAT
    FORMAT = request.param
    return FORMAT


FORMAT = "columns"


def add_units(t: trace_pb2.Trace, files: object, path: str, quals: list[tuple[str, list[str]]],
              checksum: str = "c", digest: str = "d", checksums: list[str] | None = None) -> None:
    """Add a file with units (qualname, context signatures) to ``files`` of ``t``, in
    the format the test runs with (``checksums``: per unit, else ``checksum`` for all)."""
    sums = checksums if checksums is not None else [checksum] * len(quals)
    if FORMAT == "columns":
        table = trace.ContextTable(t)  # the trace's so far, re-written with the new sets
        for i, sig in enumerate(t.contexts):
            table.sigs[sig] = i
        for ids in _sets_of(t):
            table.sets.setdefault(ids, len(table.sets))
        ft = trace.write_file(files, path, digest,
                              [(q, table.set_of(sigs)) for q, sigs in quals])
        if any(sums):
            ft.checksums = "\n".join(sums)
        table.close()
        return
    ft = files.add(path=path, digest=digest)  # type: ignore[attr-defined]
    for (qual, sigs), sum_ in zip(quals, sums):
        ids = []
        for s in sigs:
            if s not in t.contexts:
                t.contexts.append(s)
            ids.append(list(t.contexts).index(s))
        ft.units.add(qualname=qual, checksum=sum_, contexts=ids)


def _sets_of(t: trace_pb2.Trace) -> list[tuple[int, ...]]:
    flat = trace.u32_column(t.set_contexts).tolist()
    out, at = [], 0
    for n in trace.u32_column(t.set_sizes).tolist():
        out.append(tuple(flat[at:at + n]))
        at += n
    return out


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
        add_units(t, t.files, path, quals)
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
    add_units(shared, coll.files, "t.py", [("<module>", [])])
    consts = shared.segments.add(key="sess/c2")
    add_units(shared, consts.files, "consts.py", [("<module>", ["args()|caller=t.py::<module>"])])
    trace.write_atomic(tmp_path / "s-collection.sess.1.trace", shared)
    x = make("t::x", "r1", 1.0, {"t.py::x": []})
    fixture = x.segments.add(key="sess/fx1:setup")
    add_units(x, fixture.files, "fx.py", [("data", [])])
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


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_trace_found_corrupt_when_its_run_is_merged_is_reported_like_any(
        tmp_path: Path, jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace whose header reads but whose body does not (units that do not add up) is
    found when its run is merged, here or in a worker: reported, its test's run
    incomplete, its file kept; the run's other traces are merged."""
    from fastci.evidence.store import ingest as ingest_mod

    monkeypatch.setattr(ingest_mod, "PARALLEL_FROM", 0)
    put(tmp_path, make("t::ok", "r1", 1.0, {"m.py::f": ["a"]}))
    put(tmp_path, make("t::x", "r2", 1.0, {"m.py::g": []}))
    child = make("t::x", "r2", 1.1, {"m.py::h": ["b"]}, role="child", pid=5)
    child.files[0].unit_sets = b"\x01\x00"  # a partial uint32 (format 1: an unknown field)
    child.set_sizes = b"\x09"
    bad = put(tmp_path, child)
    with EvidenceStore.open(tmp_path / "e.db", create=True) as s:
        rep = ingest(s, find_traces([tmp_path]), source="pytest", commit=None, jobs=jobs)
        assert len(rep.corrupt) == 1 and str(bad) in rep.corrupt[0]
        assert "partial entry" in rep.corrupt[0]
        assert rep.incomplete_tests == {"t::x"} and str(bad) not in rep.ingested
        assert len(rep.ingested) == 2
        latest = s.latest_runs()
        assert latest["t::ok"].complete and not latest["t::x"].complete
        assert rep.runs_added == 3  # t::ok, t::x merged without the child, its corrupt run


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

    from fastci.evidence.store import db as store_mod

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


# ------------------------------------------------------------------ merge_run, both formats

QUALS = ["<module>", "f", "C.m", "g.<locals>.h"]
SIGS = ["a", "b|tp=2", "caller=x.py::f"]


class TreeChecksums:
    """Checksums as the source tree gives them (Checksums.of's contract), from a dict."""

    def __init__(self, sums: dict[tuple[str, str], dict[str, str]]) -> None:
        self.sums = sums

    def of(self, path: str, digest: str) -> dict[str, str]:
        return self.sums.get((path, digest), {})


file_st = st.tuples(
    st.sampled_from(["m.py", "pkg/n.py"]), st.sampled_from(["d1", "d2", ""]),
    st.lists(st.tuples(st.sampled_from(QUALS), st.lists(st.sampled_from(SIGS), max_size=3),
                       st.sampled_from(["", "", "r1", "r2"])),
             max_size=4, unique_by=lambda u: u[0]))
trace_st = st.lists(file_st, max_size=3, unique_by=lambda f: f[0])


def reference(parts: list[list[tuple[str, str, list[tuple[str, list[str], str]]]]],
              tree: TreeChecksums) -> dict[str, tuple[str, frozenset[str]]]:
    """merge_run's units as the dict-based merge defined them: parts in order, a unit's
    first non-empty checksum (recorded, else the tree's), the union of its contexts."""
    out: dict[str, tuple[str, set[str]]] = {}
    for files in parts:
        for path, digest, units in files:
            known = tree.of(path, digest)
            for qual, sigs, recorded in units:
                uid = f"{path}::{qual}"
                checksum, got = out.get(uid, ("", set()))
                out[uid] = (checksum or recorded or known.get(qual, ""), got | set(sigs))
    return {u: (c, frozenset(s)) for u, (c, s) in out.items()}


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # it only picks the format
@given(st.lists(trace_st, min_size=1, max_size=3), st.lists(trace_st, max_size=2),
       st.lists(trace_st, min_size=1, max_size=2))
def test_merged_units_match_the_dict_merge_in_both_formats(
        processes: list[list[Any]], segments: list[list[Any]], other: list[list[Any]]) -> None:
    """A run of several processes and shared segments, then another run through the same
    reader (one table per ingest): the units are what the dict-based merge gives."""
    tree = TreeChecksums({("m.py", "d1"): {"<module>": "t0", "f": "t1", "C.m": "t2"},
                          ("pkg/n.py", "d2"): {"f": "n1"}})

    def build(files: list[Any], role: str, pid: int, run: str) -> trace_pb2.Trace:
        t = make("t::x" if role != "shared" else "", run, 1.0, {}, role=role, pid=pid)
        for path, digest, units in files:
            add_units(t, t.files, path, [(q, sigs) for q, sigs, _ in units], digest=digest,
                      checksums=[c for _, _, c in units])
        return t

    reader = TraceUnits(tree)  # type: ignore[arg-type]
    traces = [build(files, "main" if i == 0 else "child", i + 1, "r1")
              for i, files in enumerate(processes)]
    holder = make("", "sess", 0.5, {}, role="shared")
    for i, files in enumerate(segments):
        seg = holder.segments.add(key=f"sess/s{i}")
        for path, digest, units in files:
            add_units(holder, seg.files, path, [(q, sigs) for q, sigs, _ in units],
                      digest=digest, checksums=[c for _, _, c in units])
    traces[0].shared.extend(f"sess/s{i}" for i in range(len(segments)))
    index = index_segments([holder])
    run = merge_run(traces, source="pytest", commit=None, segments=index, units=reader)
    assert dict(run.units) == reference(processes + segments, tree)
    assert len(run.units) == len(dict(run.units))  # each unit once
    second = [build(files, "main" if i == 0 else "child", i + 1, "r2")
              for i, files in enumerate(other)]
    again = merge_run(second, source="pytest", commit=None, units=reader)
    assert dict(again.units) == reference(other, tree)


def test_runs_merged_in_worker_processes_make_the_same_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fastci ingest --jobs 2``: forked workers merge the runs (each into its own table,
    mirrored here) and the store holds exactly what merging them here gives."""
    from fastci.evidence.store import ingest as ingest_mod

    monkeypatch.setattr(ingest_mod, "PARALLEL_FROM", 0)
    monkeypatch.setattr(ingest_mod, "TASK_RUNS", 3)  # many tasks, tables grow across them
    shared = make("", "sess", 0.5, {}, role="shared")
    add_units(shared, shared.segments.add(key="sess/c1").files, "t.py", [("<module>", ["s"])])
    put(tmp_path, shared)
    trace.write_atomic(tmp_path / "s-collection.sess.1.trace", shared)
    for i in range(20):
        units = {f"m{i % 3}.py::f{j}": [f"tp={j % 2}", f"dtype=bf{i % 4}"][:1 + i % 2]
                 for j in range(i % 5 + 1)}
        units[f"t.py::test_{i}"] = []
        t = make(f"t::x{i}", f"r{i}", 1.0 + i, units)
        t.shared.append("sess/c1")
        put(tmp_path, t)
        if i % 4 == 0:  # a child process of the same run
            put(tmp_path, make(f"t::x{i}", f"r{i}", 1.5 + i, {"m0.py::f0": ["child"]},
                               role="child", pid=9))
    stores = {}
    for jobs in (1, 2):
        with EvidenceStore.open(tmp_path / f"e{jobs}.db", create=True) as s:
            rep = ingest(s, find_traces([tmp_path]), source="pytest", commit=None, jobs=jobs)
            assert rep.runs_added == 20 and not rep.incomplete_tests
            stores[jobs] = (s.recorded_units(), {t: s.evidence_of_test(t) for t in s.test_ids()},
                            s.stats() | {"bytes": 0})
    assert ingest_mod.worker_count(2, 20) == 2
    assert stores[2] == stores[1]
    assert stores[1][1]["t::x0"]["m0.py::f0"] == ("c", ["child", "tp=0"])  # both processes


def test_few_runs_or_one_cpu_merge_here() -> None:
    from fastci.evidence.store.ingest import PARALLEL_FROM, worker_count

    assert worker_count(8, PARALLEL_FROM - 1) == 0
    assert worker_count(1, 10 * PARALLEL_FROM) == 0
    assert worker_count(3, PARALLEL_FROM) == 3


def test_a_mirror_table_holds_the_rows_it_is_sent_and_makes_none() -> None:
    from fastci.evidence.store.columns import MirrorTable, UnitTable

    worker, mirror = UnitTable(), MirrorTable()
    rows = [worker.row("m.py::f", "c"), worker.row("m.py::g", ""), worker.row("m.py::f", "c")]
    sets = [worker.set_row(frozenset({"a"})), worker.set_row(frozenset())]
    mirror.extend(worker.keys, worker.sets)
    assert rows == [0, 1, 0] and sets == [0, 1]
    assert mirror.keys == worker.keys and mirror.sets == worker.sets
    with pytest.raises(TypeError, match="only takes"):
        mirror.row("m.py::h", "")


@pytest.mark.parametrize("inside, bazel, stored", [
    ("xfailed", "passed", "xfailed"), ("xpassed", "passed", "xpassed"),
    ("skipped", "passed", "skipped"), ("passed", "passed", "passed"),
    ("xfailed", "failed", "failed"),  # a failure Bazel reports wins
    ("failed", "passed", "passed"), ("xfailed", "error", "error")])
def test_bazel_verdict_keeps_the_word_pytest_gave_inside_a_passing_target(
        inside: str, bazel: str, stored: str) -> None:
    """Issue 38 item 6, the Bazel path: a target whose pytest reported an expected failure
    passes in Bazel's build events; its run is stored as ``xfailed``, not ``passed``."""
    from fastci.evidence.store.ingest import TestResult

    t = make("//pkg:x_test", "r1", 1.0, {"pkg/x.py::f": []}, outcome=inside)
    run = merge_run([trace.decode(trace.encode(t))], source="bazel", commit=None,
                    result=TestResult(bazel, 2.0))
    assert (run.outcome, run.duration_s) == (stored, 2.0)
