"""The compact evidence representation (schema 4) against a reference model of dicts.

Random sequences of recordings (several tests, units whose checksums change,
contexts, re-recordings in any order, ties on the time, run keys seen before)
are ingested one by one, in batches (``ingest_many``, with posting lists flushed
every few pairs or once) and through an export/import; every read method must
return what the model, the semantics of schema 3 written as dicts, says.
"""

from __future__ import annotations

import sqlite3
import tempfile
from unittest import mock
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.errors import StoreError
from fastci.evidence.store import batch as batch_mod
from fastci.evidence.store.columns import UnitTable
from exchange_support import import_store
from fastci.evidence.store.exchange import export_store
from fastci.evidence.store.schema import SCHEMA_VERSION
from fastci.evidence.store.db import EvidenceStore, RunEvidence

TESTS = ["//t:a", "//t:b", "//t:c", "p/test_x.py::test_y"]
UNITS = ["m.py::f", "m.py::g", "m.py::<module>", "n.py::h", "pkg/o.py::C.m"]
PATHS = ["m.py", "n.py", "pkg/o.py", "absent.py"]
Units = dict[str, tuple[str, frozenset[str]]]


@dataclass
class Model:
    """What the store must hold: newest recording per test wins (ties: the greater key)."""

    keys: set[str] = field(default_factory=set)
    tests: set[str] = field(default_factory=set)
    held: dict[str, tuple[float, str]] = field(default_factory=dict)
    evidence: dict[str, Units] = field(default_factory=dict)
    # The held run's files read, Python sources and distributions, per test.
    reads: dict[str, dict[str, str]] = field(default_factory=dict)
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    dists: dict[str, dict[str, str]] = field(default_factory=dict)

    def ingest(self, run: RunEvidence) -> bool:
        if run.run_key in self.keys:
            return False
        self.keys.add(run.run_key)
        self.tests.add(run.test)
        if run.test in self.held and self.held[run.test] > (run.recorded_at, run.run_key):
            return True
        self.held[run.test] = (run.recorded_at, run.run_key)
        self.evidence[run.test] = dict(run.units)
        self.reads[run.test] = dict(run.files)
        self.sources[run.test] = dict(run.sources)
        self.dists[run.test] = dict(run.distributions)
        return True

    def pairs(self) -> list[tuple[str, str, str]]:
        return sorted((t, u, c) for t, ev in self.evidence.items() for u, (c, _) in ev.items())


units_st = st.dictionaries(
    st.sampled_from(UNITS),
    st.tuples(st.sampled_from(["c1", "c2", "c3", ""]),
              st.frozensets(st.sampled_from(["x", "y|tp=2", "z"]), max_size=3)),
    max_size=len(UNITS))


@st.composite
def runs_st(draw: st.DrawFn) -> RunEvidence:
    test = draw(st.sampled_from(TESTS))
    at = float(draw(st.integers(1, 4)))
    key = f"{test}@{draw(st.integers(0, 6))}"  # few keys: some come again (no-ops)
    return RunEvidence(test=test, run_key=key, outcome="passed", complete=True, duration_s=1.0,
                       gpus=1, workload={}, recorded_at=at, commit="abc",
                       units=draw(units_st), sources=draw(files_st), files=draw(files_st),
                       distributions=draw(st.dictionaries(st.sampled_from(["torch", "numpy"]),
                                                          st.sampled_from(["1", "2"]))))


files_st = st.dictionaries(st.sampled_from(PATHS[:3]), st.sampled_from(["d1", "d2"]), max_size=3)


def check(store: EvidenceStore, model: Model) -> None:
    assert store.test_ids() == sorted(model.tests)
    asked = [*UNITS, "zz.py::nope"]
    assert store.tests_for_units(asked) == {
        u: {t for t, ev in model.evidence.items() if u in ev} for u in asked}
    assert store.tests_for_modules(PATHS) == {
        p: {t for t, ev in model.evidence.items() if any(u.partition("::")[0] == p for u in ev)}
        for p in PATHS}
    pairs = model.pairs()
    assert store.recorded_units() == pairs
    assert store.recorded_units(paths=["m.py", "absent.py"]) == [
        x for x in pairs if x[1].startswith("m.py::")]
    assert store.recorded_units(tests=TESTS[:2]) == [x for x in pairs if x[0] in TESTS[:2]]
    assert store.recorded_units(paths=["n.py"], tests=[TESTS[2]]) == [
        x for x in pairs if x[1].startswith("n.py::") or x[0] == TESTS[2]]
    for test in [*TESTS, "//t:never"]:
        ev = model.evidence.get(test, {})
        assert store.units_of_test(test) == {u: sorted(s) for u, (_, s) in ev.items()}
        assert store.evidence_of_test(test) == {u: (c, sorted(s)) for u, (c, s) in ev.items()}
    some = UNITS[::2]
    assert store.contexts_of_units(some) == {
        t: {u: sorted(s) for u, (_, s) in ev.items() if u in some}
        for t, ev in model.evidence.items() if any(u in some for u in ev)}
    assert store.source_digests() == sorted(
        (t, p, d) for t, files in model.sources.items() for p, d in files.items())
    assert store.file_digests() == sorted(
        (p, t, d) for t, files in model.reads.items() for p, d in files.items())
    assert store.distributions_of_tests() == {t: d for t, d in model.dists.items() if d}
    stats = store.stats()
    assert stats["evidence"] == len(pairs)
    # Every unit version some test holds, and no other (an emptied one is deleted).
    assert stats["unit_version"] == len({(u, c) for _, u, c in pairs})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(runs_st(), min_size=1, max_size=6), min_size=1, max_size=5),
       st.lists(st.sampled_from(["one", "batch", "batch-flush-often", "batch-small-chunks",
                                 "columns", "columns-flush-often", "columns-scan"]),
                min_size=5, max_size=5))
def test_every_read_matches_the_model(batches: list[list[RunEvidence]], how: list[str]) -> None:
    model = Model()
    table = UnitTable()  # as one ingest's traces share one (``columns``: units as its rows)
    with tempfile.TemporaryDirectory() as tmp:
        store = EvidenceStore.open(Path(tmp) / "e.db", create=True)
        for batch, mode in zip(batches, how):
            expected = [model.ingest(r) for r in batch]
            if mode.startswith("columns"):
                batch = [replace(r, units=table.columns(r.units)) for r in batch]
                # (scan: the versions read in one pass, as for a full-suite recording)
                with mock.patch.object(batch_mod, "SCAN_VERSIONS_FROM",
                                       0 if mode == "columns-scan" else batch_mod.SCAN_VERSIONS_FROM):
                    got = store.ingest_many(iter(batch), flush_pairs=1 if "flush" in mode else 10**9)
            elif mode == "one":
                got = [store.ingest(r) for r in batch]
            else:
                got = store.ingest_many(iter(batch),
                                        flush_pairs=1 if mode != "batch" else 10**9,
                                        chunk=2 if mode == "batch-small-chunks" else 2000)
            assert got == expected
            check(store, model)
        # An export imported into an empty store holds the same evidence.
        export_store(store, Path(tmp) / "e.jsonl.gz")
        other = EvidenceStore.open(Path(tmp) / "o.db", create=True)
        import_store(other, Path(tmp) / "e.jsonl.gz")
        assert other.recorded_units() == store.recorded_units()
        for test in TESTS:
            assert other.evidence_of_test(test) == store.evidence_of_test(test)
        store.close()
        other.close()


def test_a_rolled_back_batch_leaves_nothing(tmp_path: Path) -> None:
    store = EvidenceStore.open(tmp_path / "e.db", create=True)
    first = RunEvidence(test="//t:a", run_key="k1", outcome="passed", complete=True,
                        duration_s=1.0, gpus=1, workload={}, recorded_at=1.0,
                        units={"m.py::f": ("c1", frozenset({"x"}))})
    store.ingest(first)
    before = (store.recorded_units(), store.stats())
    with pytest.raises(RuntimeError), store.transaction():
        store.ingest_many([RunEvidence(test="//t:a", run_key="k2", outcome="passed",
                                       complete=True, duration_s=1.0, gpus=1, workload={},
                                       recorded_at=2.0,
                                       units={"m.py::g": ("c2", frozenset({"y"}))})])
        raise RuntimeError("the import failed half way")
    assert (store.recorded_units(), store.stats()) == before
    # The next batch starts from the store, not from ids the rolled-back one cached.
    assert store.ingest_many([RunEvidence(test="//t:b", run_key="k3", outcome="passed",
                                          complete=True, duration_s=1.0, gpus=1, workload={},
                                          recorded_at=2.0,
                                          units={"m.py::g": ("c2", frozenset({"y"}))})]) == [True]
    assert store.tests_for_units(["m.py::f", "m.py::g"]) == {"m.py::f": {"//t:a"},
                                                             "m.py::g": {"//t:b"}}


def test_a_version_3_store_is_refused_and_left_alone(tmp_path: Path) -> None:
    """Schema 3 held one row per pair; such a store is never migrated nor deleted: opening it,
    to read or to write, says to move it aside and re-record, and the file is unchanged."""
    path = tmp_path / "evidence.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")  # as version 3 made its stores
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '3');"
        "CREATE TABLE test (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
        " evidence_run INTEGER, evidence_at REAL NOT NULL DEFAULT 0);"
        "CREATE TABLE evidence (unit_id INTEGER NOT NULL, test_id INTEGER NOT NULL,"
        " contexts BLOB NOT NULL, checksum TEXT NOT NULL DEFAULT '',"
        " PRIMARY KEY (unit_id, test_id)) WITHOUT ROWID;"
        "INSERT INTO test (name) VALUES ('//t:a');"
        "INSERT INTO evidence VALUES (1, 1, x'', 'c1');")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    for create in (False, True):
        with pytest.raises(StoreError, match=f"schema version 3, this FastCI needs "
                                             f"{SCHEMA_VERSION}; move it aside"):
            EvidenceStore.open(path, create=create)
    assert path.read_bytes() == before
    assert SCHEMA_VERSION == 4


@pytest.mark.parametrize("how", ["one", "batch", "columns"])
def test_a_re_recording_that_only_ran_in_other_contexts_replaces_them(
        tmp_path: Path, how: str) -> None:
    """Same units, same checksums: no posting list changes, but the contexts are new."""
    def run(key: str, at: float, sigs: set[str]) -> RunEvidence:
        units = {"m.py::f": ("c1", frozenset(sigs)), "m.py::g": ("c2", frozenset({"x"}))}
        return RunEvidence(test="//t:a", run_key=key, outcome="passed", complete=True,
                           duration_s=1.0, gpus=1, workload={}, recorded_at=at,
                           units=UnitTable().columns(units) if how == "columns" else units)

    with EvidenceStore.open(tmp_path / "e.db", create=True) as store:
        for r in (run("r1", 1.0, {"tp=1"}), run("r2", 2.0, {"tp=2", "bf16"}),
                  run("r3", 3.0, {"tp=2", "bf16"})):  # r3: the same again, nothing to write
            if how == "one":
                store.ingest(r)
            else:
                store.ingest_many([r])
        assert store.units_of_test("//t:a") == {"m.py::f": ["bf16", "tp=2"], "m.py::g": ["x"]}
        assert store.tests_for_units(["m.py::f"]) == {"m.py::f": {"//t:a"}}
