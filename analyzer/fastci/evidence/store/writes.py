"""The write side of the evidence store: ingesting runs, results and bulk loads.

:class:`StoreWrites` is a part of :class:`fastci.evidence.store.db.EvidenceStore`
(its base): every way a run gets in. ``ingest_many`` decides runs in chunks of
:data:`INGEST_CHUNK` with set-based reads and writes, keeps the newest recording of
each test whatever the order of ingestion (ties: the greater run key), and rewrites
each touched posting list once per :data:`FLUSH_PAIRS` pair changes
(:class:`fastci.evidence.store.batch.EvidenceBatch`). The reads are in ``db``.
"""

from __future__ import annotations

import array
import json
import logging
import sqlite3
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from fastci.errors import StoreError
from fastci.gcpause import no_gc
from fastci.evidence.store import postings
from fastci.evidence.store.batch import EvidenceBatch, chunks, pack_ids
from fastci.evidence.store.runs import RunEvidence, real_overrides
from fastci.types import Checksum, ContextSig, RelPath, TestId, UnitId


LOG = logging.getLogger(__name__)

#: Pairs added or dropped in one batch before its posting lists are written (bounds the
#: memory of a huge import; a posting list is rewritten once per this many pair changes).
FLUSH_PAIRS = 20_000_000
#: Runs decided per round of set-based reads and writes in ``ingest_many``.
INGEST_CHUNK = 2000
#: Per-test tables an ingest rewrites, with their columns as rows are given.
_TEST_ROWS = {"file_read": ("path", "test_id", "digest"), "source": ("path", "test_id", "digest"),
              "dist_import": ("test_id", "name", "version")}
#: The page cache of an ingest batch, KiB (measured: 36.2 s against 38.7 s with SQLite's
#: 2 MB for a full-suite ingest at 100,000 tests; pages are only held as they are used).
INGEST_CACHE_KIB = 262_144
_INSERT_RUN = ("INSERT INTO run (id, test_id, run_key, commit_sha, env_fingerprint, environment,"
               " workload, overrides, duration_s, gpus, outcome, complete, recorded_at, source,"
               " has_evidence) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")


def _json(obj: Mapping[str, Any]) -> str:
    """``obj`` as canonical JSON (sorted keys). A full-suite ingest writes the same few
    workloads and environments 100,000 times each: their text is kept by content."""
    if not obj:
        return "{}"
    if not all(type(v) in _SCALARS for v in obj.values()):  # nested values: not kept
        return json.dumps(dict(obj), sort_keys=True, default=str)
    # The value's type is part of the key: 1, 1.0 and True are equal, and hash alike.
    key = frozenset((k, type(v), v) for k, v in obj.items())
    text = _JSON_TEXT.get(key)
    if text is None:
        if len(_JSON_TEXT) >= 4096:
            _JSON_TEXT.clear()
        text = _JSON_TEXT[key] = json.dumps(dict(obj), sort_keys=True, default=str)
    return text


# _json's texts by content (the items with their values' types), for scalar values.
_JSON_TEXT: dict[frozenset[tuple[Any, type, Any]], str] = {}
_SCALARS = frozenset({str, int, float, bool, type(None)})


def storable(key: str) -> bool:
    """Whether ``key`` can be a TEXT value (UTF-8): a path git decoded with
    ``surrogateescape`` from bytes that are not UTF-8 cannot, so the store holds
    nothing for it (no test is known to touch it; selection decides from there).
    """
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class StoreWrites:
    """The write half of :class:`~fastci.evidence.store.db.EvidenceStore` (its base)."""

    conn: sqlite3.Connection
    path: Path

    if TYPE_CHECKING:
        def _tx(self) -> AbstractContextManager[Any]: ...

    def _id(self, table: str, col: str, value: str) -> int:
        row = self.conn.execute(f"SELECT id FROM {table} WHERE {col} = ?", (value,)).fetchone()
        if row:
            return int(row[0])
        cur = self.conn.execute(f"INSERT INTO {table} ({col}) VALUES (?)", (value,))
        return int(cur.lastrowid or 0)

    def has_run(self, run_key: str) -> bool:
        """Whether a run with this key was ingested already."""
        return self.conn.execute("SELECT 1 FROM run WHERE run_key = ?", (run_key,)).fetchone() \
            is not None

    @staticmethod
    def _run_row(rid: int | None, test_id: int, key: str, commit: str | None, env_fp: str,
                 environment: Mapping[str, Any], workload: Mapping[str, Any],
                 overrides: Mapping[str, Any] | None, duration_s: float, gpus: int,
                 outcome: str, complete: bool, at: float, source: str,
                 has_evidence: bool) -> tuple[Any, ...]:
        """The values of a ``run`` row (:data:`_INSERT_RUN`; ``rid`` None: SQLite's next)."""
        return (rid, test_id, key, commit, env_fp, _json(environment),
                _json(workload),
                None if overrides is None else _json(real_overrides(workload, overrides)),
                float(duration_s), int(gpus), outcome, int(complete), float(at), source,
                int(has_evidence))

    def _insert_run(self, test_id: int, key: str, commit: str | None, env_fp: str,
                    environment: Mapping[str, Any], workload: Mapping[str, Any],
                    overrides: Mapping[str, Any] | None, duration_s: float, gpus: int,
                    outcome: str, complete: bool, at: float, source: str,
                    has_evidence: bool) -> int:
        cur = self.conn.execute(_INSERT_RUN, self._run_row(
            None, test_id, key, commit, env_fp, environment, workload, overrides, duration_s,
            gpus, outcome, complete, at, source, has_evidence))
        return int(cur.lastrowid or 0)

    def ingest(self, run: RunEvidence) -> bool:
        """Add one recorded run; replace the test's evidence if it is the newest.

        Returns ``False`` (and changes nothing) if ``run.run_key`` was ingested before.
        """
        return self.ingest_many([run])[0]

    def ingest_many(self, runs: Iterable[RunEvidence], *,
                    flush_pairs: int = FLUSH_PAIRS, chunk: int = INGEST_CHUNK) -> list[bool]:
        """Add recorded runs in one transaction, as :meth:`ingest` one after another would
        (in this order; whether each was new), rewriting each touched posting list once
        per batch instead of once per run. ``runs`` is read once, lazily, ``chunk`` runs at
        a time: a full-suite recording need not be held in memory. Every ``flush_pairs``
        pair changes the posting lists are written (memory stays bounded; the result is
        the same).

        Per chunk, set-based: which run keys are known, the tests' ids and the evidence
        each holds are read in a few queries, the unit versions and context sets of the
        winning runs interned at once, and the rows written with ``executemany``; each run
        is decided in order exactly as :meth:`ingest` decides it (newest wins, ties: the
        greater run key).
        """
        # A batch rewrites hundreds of MB of a large store: a page cache of up to
        # INGEST_CACHE_KIB (SQLite's default is 2 MB) spares re-reading B-tree pages.
        held = self.conn.execute("PRAGMA cache_size").fetchone()[0]
        self.conn.execute(f"PRAGMA cache_size=-{INGEST_CACHE_KIB}")
        try:
            with self._tx(), no_gc():
                out = self._ingest_batches(runs, flush_pairs, chunk)
        finally:
            self.conn.execute(f"PRAGMA cache_size={int(held)}")
        return out

    def _ingest_batches(self, runs: Iterable[RunEvidence], flush_pairs: int,
                        chunk: int) -> list[bool]:
        out: list[bool] = []
        batch = EvidenceBatch(self.conn)
        part: list[RunEvidence] = []
        for run in runs:
            part.append(run)
            if len(part) >= chunk:
                out += self._ingest_chunk(part, batch, flush_pairs)
                part = []
        if part:
            out += self._ingest_chunk(part, batch, flush_pairs)
        batch.flush()
        return out

    def _known_keys(self, keys: Iterable[str]) -> set[str]:
        """Those of ``keys`` some run has."""
        out: set[str] = set()
        for part in chunks(sorted(set(keys))):
            out.update(r[0] for r in self.conn.execute(
                "SELECT run_key FROM run WHERE run_key IN (%s)" % ",".join("?" * len(part)),
                part))
        return out

    def _test_ids(self, names: Iterable[TestId]) -> dict[TestId, int]:
        """Test name -> rowid, rows made for new names (in the order of ``names``, the ids
        one ``_id`` after another would give)."""
        out: dict[TestId, int] = {}
        wanted = list(dict.fromkeys(names))
        query = "SELECT name, id FROM test WHERE name IN (%s)"
        for part in chunks(sorted(wanted)):
            out.update(self.conn.execute(query % ",".join("?" * len(part)), part))
        new = [n for n in wanted if n not in out]
        if new:
            self.conn.executemany("INSERT INTO test (name) VALUES (?)", ((n,) for n in new))
            for part in chunks(sorted(new)):
                out.update(self.conn.execute(query % ",".join("?" * len(part)), part))
        return out

    def _held_runs(self, tids: Iterable[int]) -> dict[int, tuple[float, str]]:
        """Test rowid -> (recorded_at, run key) of the run whose evidence it holds (absent:
        none held)."""
        out: dict[int, tuple[float, str]] = {}
        for part in chunks(sorted(set(tids))):
            for tid, at, key in self.conn.execute(
                    "SELECT t.id, t.evidence_at, r.run_key FROM test t LEFT JOIN run r"
                    " ON r.id = t.evidence_run WHERE t.id IN (%s)" % ",".join("?" * len(part)),
                    part):
                if key is not None:
                    out[tid] = (at, key)
        return out

    def _ingest_chunk(self, runs: list[RunEvidence], batch: EvidenceBatch,
                      flush_pairs: int) -> list[bool]:
        out = self._new_runs(runs)
        wins = self._insert_runs([r for r, new in zip(runs, out) if new])
        last = self._write_units(wins, batch, flush_pairs)
        self._hold_evidence(last)
        return out

    def _new_runs(self, runs: list[RunEvidence]) -> list[bool]:
        """Whether each run's key is new to the store (a key twice in the chunk: the
        second is known by then)."""
        known = self._known_keys(r.run_key for r in runs)
        out: list[bool] = []
        for run in runs:
            out.append(run.run_key not in known)
            known.add(run.run_key)
        return out

    def _insert_runs(self, runs: list[RunEvidence]) -> list[tuple[int, int, RunEvidence]]:
        """Insert the run rows (and their package listings); the runs whose evidence
        each test now holds, as (test rowid, run rowid, run), in order."""
        c = self.conn
        tids = self._test_ids(r.test for r in runs)
        held = self._held_runs(tids.values())
        rid = int(c.execute("SELECT coalesce(max(id), 0) FROM run").fetchone()[0])
        run_rows: list[tuple[Any, ...]] = []
        listings: list[tuple[str, str]] = []
        wins: list[tuple[int, int, RunEvidence]] = []
        for run in runs:
            tid = tids[run.test]
            environment = dict(run.environment)
            listing = environment.pop("packages_list", "")
            if listing and run.env_fingerprint:
                listings.append((run.env_fingerprint, str(listing)))
            rid += 1  # what SQLite gives: one more than the greatest rowid
            run_rows.append(self._run_row(rid, tid, run.run_key, run.commit, run.env_fingerprint,
                                          environment, run.workload, run.overrides,
                                          run.duration_s, run.gpus, run.outcome, run.complete,
                                          run.recorded_at, run.source, True))
            # The newest recording wins whatever the order of ingestion (ties: the
            # greater run key), so shards merge into the same store in any order.
            mine = (run.recorded_at, run.run_key)
            if tid in held and held[tid] > mine:
                LOG.info("%s: run %s is older than the evidence held; kept as history",
                         run.test, run.run_key)
                continue
            held[tid] = mine
            wins.append((tid, rid, run))
        c.executemany("INSERT OR IGNORE INTO env_listing VALUES (?,?)", listings)
        c.executemany(_INSERT_RUN, run_rows)
        return wins

    @staticmethod
    def _write_units(wins: list[tuple[int, int, RunEvidence]], batch: EvidenceBatch,
                     flush_pairs: int) -> dict[int, tuple[int, RunEvidence]]:
        """Write the winning runs' units into the posting lists; each test's last winner."""
        ids = batch.prepare([run.units for _, _, run in wins], [tid for tid, _, _ in wins])
        last: dict[int, tuple[int, RunEvidence]] = {}
        flushed = False
        for (tid, run_id, run), (vids, sets) in zip(wins, ids):
            # A flush deletes the versions interned for later runs that no test holds yet:
            # after one, replace() interns again (context sets are never deleted).
            batch.replace(tid, run.units, None if flushed else vids, sets)
            last[tid] = (run_id, run)
            if batch.pending >= flush_pairs:
                batch.flush()
                flushed = True
        batch.write_rows()
        return last

    def _hold_evidence(self, last: dict[int, tuple[int, RunEvidence]]) -> None:
        """Each test holds its last winner: its files read, sources and distributions
        replace the test's (as one ingest after another leaves them), and the test row
        points at the run."""
        self._replace_rows("file_read", {tid: {(p, tid, d) for p, d in run.files.items()
                                               if storable(p)}
                                         for tid, (_, run) in last.items()})
        self._replace_rows("source", {tid: {(p, tid, d) for p, d in run.sources.items()
                                            if storable(p)}
                                      for tid, (_, run) in last.items()})
        self._replace_rows("dist_import", {tid: {(tid, n, v) for n, v in run.distributions.items()}
                                           for tid, (_, run) in last.items()})
        self.conn.executemany("UPDATE test SET evidence_run = ?, evidence_at = ? WHERE id = ?",
                              [(run_id, run.recorded_at, tid) for tid, (run_id, run) in last.items()])

    def _replace_rows(self, table: str, rows: dict[int, set[tuple[Any, ...]]]) -> None:
        """Make ``rows[t]`` the rows of ``table`` (file_read, source, dist_import) of each
        test ``t``, writing only the tests whose rows differ (a re-recording mostly saw
        the same files: a million rows rewritten for nothing took 4 s at 100,000 tests)."""
        cols = _TEST_ROWS[table]
        at = cols.index("test_id")
        changed: list[int] = []
        for part in chunks(sorted(rows)):
            held = self.conn.execute(f"SELECT {', '.join(cols)} FROM {table}"
                                     " WHERE test_id IN (%s)" % ",".join("?" * len(part)),
                                     part).fetchall()
            # A chunk of tests at once first: two sorted lists of tuples compared in C
            # (most tests of a re-recording saw the same files: building a set per test
            # to find that out took 2-3 s at 100,000 tests); test by test only if they differ.
            want = [row for t in part for row in rows[t]]
            try:
                held.sort()
                want.sort()
                if held == want:
                    continue
            except TypeError:  # values that do not compare: test by test
                pass
            by_test: dict[int, set[tuple[Any, ...]]] = {t: set() for t in part}
            for row in held:
                by_test[row[at]].add(row)
            changed += [t for t in part if by_test[t] != rows[t]]
        for part in chunks(changed):
            self.conn.execute(f"DELETE FROM {table} WHERE test_id IN (%s)"
                              % ",".join("?" * len(part)), part)
        self.conn.executemany(f"INSERT INTO {table} ({', '.join(cols)})"
                              f" VALUES ({','.join('?' * len(cols))})",
                              [r for t in changed for r in sorted(rows[t])])

    def add_run(self, run: RunEvidence) -> bool:
        """Add ``run`` as history only, as it was recorded elsewhere (an export's run whose
        evidence another recording superseded, or a plain result); its evidence, if any,
        is not held. Returns ``False`` (and changes nothing) if its key is known."""
        with self._tx():
            if self.has_run(run.run_key):
                return False
            tid = self._id("test", "name", run.test)
            environment = dict(run.environment)
            environment.pop("packages_list", None)
            self._insert_run(tid, run.run_key, run.commit, run.env_fingerprint, environment,
                             run.workload, run.overrides, run.duration_s, run.gpus, run.outcome,
                             run.complete, run.recorded_at, run.source, run.has_evidence)
        return True

    def record_result(self, test: TestId, *, outcome: str, duration_s: float,
                      commit: str | None, gpus: int, workload: Mapping[str, Any],
                      source: str, recorded_at: float | None = None,
                      run_key: str | None = None,
                      overrides: Mapping[str, Any] | None = None) -> None:
        """Add a plain result (no evidence) for ``test``.

        ``workload`` is the test's declared (full) workload, ``overrides`` what
        this run changed of it (``{}``: full workload; ``None``: not known, so the
        run never counts as a full-workload run). The run inherits ``complete``
        and the environment fingerprint of the evidence the store holds for the
        test (``complete`` is false if it holds none), so a result never makes
        missing evidence look complete.
        """
        at = time.time() if recorded_at is None else recorded_at
        key = run_key or f"result:{test}:{at!r}:{source}"
        with self._tx():
            if self.has_run(key):
                return
            tid = self._id("test", "name", test)
            row = self.conn.execute(
                "SELECT r.complete, r.env_fingerprint FROM test t JOIN run r"
                " ON r.id = t.evidence_run WHERE t.id = ?", (tid,)).fetchone()
            complete, env_fp = (bool(row[0]), row[1]) if row else (False, "")
            self._insert_run(tid, key, commit, env_fp, {}, workload, overrides, duration_s, gpus,
                             outcome, complete, at, source, False)

    def bulk_load(self, tests: Sequence[TestId], units: Sequence[tuple[UnitId, Checksum]],
                  contexts: Sequence[ContextSig],
                  evidence: Iterable[tuple[int, int, Sequence[int]]],
                  *, recorded_at: float | None = None, env_fingerprint: str = "",
                  outcome: str = "passed",
                  sources: Iterable[tuple[int, RelPath, str]] = ()) -> None:
        """Fast load into an *empty* store (benchmarks, imports).

        ``evidence`` yields ``(test_index, unit_index, context_indexes)`` into the
        given sequences, each (test, unit) pair once. Every test gets one complete
        run; each unit's checksum is the one every test recorded. ``sources`` yields
        ``(test_index, path, sha256)``: the source files each test's recording ran, as
        an ingest keeps them (read after ``evidence``).

        Raises:
            StoreError: the store has tests, or a (test, unit) pair comes twice.
        """
        if self.conn.execute("SELECT count(*) FROM test").fetchone()[0]:
            raise StoreError(f"bulk_load needs an empty store; {self.path} has tests")
        at = time.time() if recorded_at is None else recorded_at
        t_arr, u_arr, s_arr, canonical = _pair_columns(evidence)
        c = self.conn
        c.execute("PRAGMA synchronous=OFF")
        with self._tx():
            self._bulk_rows(tests, units, contexts, canonical, at=at,
                            env_fingerprint=env_fingerprint, outcome=outcome)
            self._bulk_postings(t_arr, u_arr, s_arr, units)
            c.executemany("INSERT INTO source (path, test_id, digest) VALUES (?,?,?)",
                          ((path, t + 1, digest) for t, path, digest in sources))
        c.execute("PRAGMA synchronous=NORMAL")

    def _bulk_rows(self, tests: Sequence[TestId], units: Sequence[tuple[UnitId, Checksum]],
                   contexts: Sequence[ContextSig], canonical: Mapping[tuple[int, ...], int], *,
                   at: float, env_fingerprint: str, outcome: str) -> None:
        """:meth:`bulk_load`'s plain rows: one complete run per test, the units (version
        i + 1 of unit i), the context signatures and the distinct context sets."""
        c = self.conn
        c.executemany("INSERT INTO test (id, name, evidence_run, evidence_at) VALUES (?,?,?,?)",
                      ((i + 1, t, i + 1, at) for i, t in enumerate(tests)))
        c.executemany("INSERT INTO run (id, test_id, run_key, env_fingerprint, environment,"
                      " workload, overrides, duration_s, gpus, outcome, complete, recorded_at,"
                      " source, has_evidence) VALUES (?,?,?,?,'{}','{}','{}',1.0,1,?,1,?,"
                      "'bulk',1)",
                      ((i + 1, i + 1, f"bulk:{t}", env_fingerprint, outcome, at)
                       for i, t in enumerate(tests)))
        c.executemany("INSERT INTO unit (id, uid, path, checksum) VALUES (?,?,?,?)",
                      ((i + 1, u, u.partition("::")[0], cs) for i, (u, cs) in enumerate(units)))
        c.executemany("INSERT INTO context (id, sig) VALUES (?,?)",
                      ((i + 1, s) for i, s in enumerate(contexts)))
        c.executemany("INSERT INTO ctxset (id, ids) VALUES (?,?)",
                      ((i + 1, pack_ids(x + 1 for x in k)) for i, k in enumerate(canonical)))

    def _bulk_postings(self, t_arr: postings.Ids, u_arr: postings.Ids, s_arr: postings.Ids,
                       units: Sequence[tuple[UnitId, Checksum]]) -> None:
        """:meth:`bulk_load`'s posting lists: per test its sorted versions with their
        context sets, per unit version the tests that hold it.

        Raises:
            StoreError: a (test, unit) pair comes twice.
        """
        c = self.conn
        # Unit i's one version is version i + 1; per test its sorted versions.
        order = np.lexsort((u_arr, t_arr))
        by_test_t, by_test_u = t_arr[order], u_arr[order] + np.uint32(1)
        if len(order) and bool(np.any((np.diff(by_test_t) == 0) & (np.diff(by_test_u) == 0))):
            raise StoreError("bulk_load: a (test, unit) pair comes twice")
        by_test_s = s_arr[order]
        del order
        c.executemany("INSERT INTO evidence (test_id, pairs, versions, ctxsets) VALUES (?,?,?,?)",
                      ((int(by_test_t[a]) + 1, b - a, postings.encode_sorted(by_test_u[a:b]),
                        postings.encode_ids(by_test_s[a:b]))
                       for a, b in _runs_of(by_test_t)))
        del by_test_t, by_test_u, by_test_s
        order = np.lexsort((t_arr, u_arr))
        by_unit_u, by_unit_t = u_arr[order], t_arr[order] + np.uint32(1)
        del order
        spans = np.array(list(_runs_of(by_unit_u)), dtype=np.int64).reshape(-1, 2)
        lists = postings.encode_sorted_many(by_unit_t, spans[:, 0], spans[:, 1])
        c.executemany("INSERT INTO unit_version (id, unit_id, checksum, tests) VALUES (?,?,?,?)",
                      ((u + 1, u + 1, units[u][1], tests)
                       for u, tests in zip(by_unit_u[spans[:, 0]].tolist(), lists)))


def _pair_columns(evidence: Iterable[tuple[int, int, Sequence[int]]]) -> tuple[
        postings.Ids, postings.Ids, postings.Ids, dict[tuple[int, ...], int]]:
    """``bulk_load``'s (test, unit, context list) triples as three uint32 columns (test,
    unit, context set id from 1) and the distinct context sets (canonical: sorted,
    distinct) by id order: context lists that are the same set share one id."""
    t_col, u_col, s_col = array.array("I"), array.array("I"), array.array("I")
    sets: dict[tuple[int, ...], int] = {}
    for t, u, ctx in evidence:  # the only per-pair Python: the rest is array work
        t_col.append(t)
        u_col.append(u)
        s_col.append(sets.setdefault(tuple(ctx), len(sets)))
    canonical: dict[tuple[int, ...], int] = {}
    remap = np.array([canonical.setdefault(tuple(sorted(set(k))), len(canonical))
                      for k in sets] or [0], dtype=np.uint32)
    t_arr = np.frombuffer(t_col, dtype=np.uint32)
    u_arr = np.frombuffer(u_col, dtype=np.uint32)
    s_arr = remap[np.frombuffer(s_col, dtype=np.uint32)] + np.uint32(1)
    return t_arr, u_arr, s_arr, canonical

def _runs_of(sorted_ids: postings.Ids) -> Iterator[tuple[int, int]]:
    """The [start, end) slices of equal values in a sorted array."""
    if not len(sorted_ids):
        return
    cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
    bounds = [0, *cuts.tolist(), len(sorted_ids)]
    yield from zip(bounds[:-1], bounds[1:])
