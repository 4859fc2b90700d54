"""The SQLite evidence store: what each test executed, read, and how it last ran.

Test processes never open the store; ``fastci ingest`` merges their trace files
(WAL mode, so readers never block the writer). Unit, test and context ids are
integers. Evidence is held as packed id arrays, not one row per (test, unit)
pair: per test its sorted *unit versions* (a unit with the checksum that test
recorded) and their interned context sets, per unit version the sorted tests
that executed it (:mod:`fastci.evidence.store.postings`, written in batches by
:mod:`fastci.evidence.store.batch`). The schema lives in :mod:`fastci.evidence.store.schema`.

This module opens the store and reads it; the write half (ingest, results, bulk
loads) is :class:`fastci.evidence.store.writes.StoreWrites`, the base of
:class:`EvidenceStore`, and the run records are :mod:`fastci.evidence.store.runs`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from fastci.errors import StoreError
from fastci.gcpause import no_gc
from fastci.evidence.store import postings
from fastci.evidence.store.batch import chunks, pack_ids, unpack_ids
from fastci.evidence.store.schema import SCHEMA, SCHEMA_VERSION
from fastci.evidence.store.runs import (INCOMPLETE_KEY, HistoryRun, RunEvidence, RunRecord,
                                        real_overrides)
from fastci.evidence.store.writes import StoreWrites, storable
from fastci.types import (FAILURE_OUTCOMES, OUTCOMES, Checksum, ContextSig, RelPath, TestId, UnitId,
                          is_failure)

LOG = logging.getLogger(__name__)

DEFAULT_PATH = Path(".fastci/evidence.db")
#: How long a writer waits for another writer's transaction before giving up (seconds).
LOCK_WAIT_S = 30.0
#: The tables a store of this schema version has.
TABLES = frozenset({"meta", "test", "unit", "context", "ctxset", "unit_version", "evidence",
                    "file_read", "run", "source", "dist_import", "env_listing"})
__all__ = ["EvidenceStore", "HistoryRun", "RunEvidence", "RunRecord", "StoreLockedError", "pack_ids",
           "unpack_ids", "real_overrides", "lock_holders", "DEFAULT_PATH", "LOCK_WAIT_S",
           "INCOMPLETE_KEY"]


class StoreLockedError(StoreError):
    """Another writer held the store's lock longer than a writer waits."""


def _statements(script: str) -> Iterator[str]:
    """The statements of an SQL script, one at a time (run inside one transaction)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""
    if pending.strip() and not all(ln.strip().startswith("--") or not ln.strip()
                                   for ln in pending.splitlines()):
        raise StoreError("the store schema ends with an incomplete statement")


#: SQLite's words for a store it cannot write for reasons outside the file's content.
_UNWRITABLE = ("readonly database", "read-only", "disk is full", "disk i/o error",
               "unable to open database file")


def _is_unwritable(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the store's folder or disk cannot be written (read-only, full,
    missing permissions), not that the store is corrupt."""
    text = str(exc).lower()
    return any(words in text for words in _UNWRITABLE)


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds the lock (SQLITE_BUSY / LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (5, 6)  # primary codes SQLITE_BUSY, SQLITE_LOCKED
    return "locked" in str(exc) or "busy" in str(exc)


def lock_holders(path: Path, locks: Path = Path("/proc/locks")) -> list[int]:
    """PIDs of other processes holding a write lock on the SQLite file ``path`` (or its WAL
    index ``-shm``), from the kernel's lock table; ``[]`` where the OS does not say.

    SQLite takes POSIX advisory locks: on the database file in rollback mode, on
    bytes of ``<path>-shm`` in WAL mode; ``/proc/locks`` lists each with its PID
    and ``major:minor:inode``.
    """
    wanted = set()
    for p in (Path(path), Path(f"{path}-shm")):
        try:
            st = p.stat()
        except OSError:
            continue
        wanted.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    try:
        table = locks.read_text(errors="replace")
    except OSError:
        return []
    pids = set()
    for line in table.splitlines():
        # "1: POSIX  ADVISORY  WRITE 4242 08:01:123 120 120"; a blocked waiter's line has "->".
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[3] != "WRITE" or parts[5] not in wanted:
            continue
        if parts[4].isdigit() and int(parts[4]) not in (0, os.getpid()):
            pids.add(int(parts[4]))
    return sorted(pids)


#: The 11 columns of a run (joined with its test) that a :class:`RunRecord` begins with.
_RECORD_COLUMNS = ("t.name, r.commit_sha, r.env_fingerprint, r.workload, r.overrides,"
                   " r.duration_s, r.gpus, r.outcome, r.complete, r.recorded_at, r.environment")
#: A run row for latest_runs: the record's columns, then the run's id (column 11).
_ROW = f"{_RECORD_COLUMNS}, r.id"
#: Run rows by id.
_RUN_ROWS = f"SELECT {_ROW} FROM run r JOIN test t ON t.id = r.test_id"
#: Each test's newest run (a run row), then the id of its newest run at full workload.
_LATEST_RUNS = (
    f"SELECT {_ROW},"
    " CASE WHEN r.overrides = '{}' THEN r.id ELSE"
    " (SELECT f.id FROM run f WHERE f.test_id = t.id AND f.overrides = '{}'"
    "  ORDER BY f.recorded_at DESC, f.run_key DESC LIMIT 1) END"
    " FROM test t JOIN run r ON r.id = (SELECT n.id FROM run n WHERE n.test_id = t.id"
    "  ORDER BY n.recorded_at DESC, n.run_key DESC LIMIT 1)")
#: A unit version as a read finds it: (the key asked for, version id, unit id, checksum,
#: the posting list: sorted test rowids).
_Posting = tuple[str, int, UnitId, Checksum, postings.Ids]


class EvidenceStore(StoreWrites):
    """Read and write the evidence store (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, path: Path,
                 lock_wait_s: float = 30.0) -> None:
        self.conn = conn
        self.path = path
        self.lock_wait_s = lock_wait_s
        # latest_runs() and _tests() are read by several stages of one plan; a write
        # through this object drops them, and so does another connection's commit
        # (SQLite's data_version, asked on each read: _fresh).
        self._latest: dict[TestId, RunRecord] | None = None
        self._test_rows: tuple[list[TestId], dict[TestId, str | None]] | None = None
        self._data_version: int | None = None
        self._depth = 0  # nesting of _Tx

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path, *, create: bool = False,
             lock_wait_s: float | None = None) -> "EvidenceStore":
        """Open the store to read, or with ``create`` to write (making it if absent).

        A reader never writes: a missing, zero-byte or table-less store is a
        :class:`StoreError` ("empty: run `fastci record`"), never initialised. A
        writer waits up to ``lock_wait_s`` (default :data:`LOCK_WAIT_S`) for another
        writer's transaction, then raises a :class:`StoreLockedError` naming the
        holder's PID where the OS tells.

        Raises:
            StoreError: the store is missing, empty, unreadable, lacks a table, or has
                another schema version (nothing is changed).
        """
        path = Path(path)
        wait_s = LOCK_WAIT_S if lock_wait_s is None else lock_wait_s
        exists = path.exists()
        if not exists and not create:
            raise StoreError(f"no evidence store at {path}; run `fastci record` or `fastci ingest`")
        if path.is_dir():
            raise StoreError(f"the evidence store {path} is a directory; move it aside")
        if not exists:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(path), timeout=wait_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the evidence store {path} ({exc})") from exc
        store = cls(conn, path, wait_s)
        try:
            if create:  # WAL is persistent: readers of a written store use it without asking
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=OFF")
            tables = store._tables()
            if not tables and not create:
                raise StoreError(f"the evidence store {path} is empty: run `fastci record`")
            if not tables:
                with store._tx():
                    if not store._tables():  # another writer may have made it meanwhile
                        for statement in _statements(SCHEMA):
                            conn.execute(statement)
                        conn.execute("INSERT INTO meta VALUES ('schema_version', ?), "
                                     "('created_at', ?)", (str(SCHEMA_VERSION), f"{time.time():.3f}"))
                tables = store._tables()
            store._check_schema(tables)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise store._error(exc) from exc
            raise
        return store

    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _check_schema(self, tables: set[str]) -> None:
        version = None
        if "meta" in tables:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = row[0] if row else None
        if version != str(SCHEMA_VERSION):
            raise StoreError(
                f"evidence store {self.path} has schema version {version or 'unknown'}, this "
                f"FastCI needs {SCHEMA_VERSION}; move it aside (nothing was changed) and re-run "
                "`fastci record`")
        missing = sorted(TABLES - tables)
        if missing:
            raise StoreError(f"evidence store {self.path} lacks table(s) {', '.join(missing)}; "
                             "move it aside (nothing was changed) and re-run `fastci record`")

    def _error(self, exc: sqlite3.Error) -> StoreError:
        """The one-line error for a SQLite failure on this store."""
        if _is_busy(exc):
            holders = lock_holders(self.path)
            who = (f"pid {', '.join(map(str, holders))}" if holders
                   else "a process the OS does not name")
            return StoreLockedError(
                f"the evidence store {self.path} is locked by another writer ({who}) and stayed "
                f"locked for {self.lock_wait_s:g} s; runs ingested so far are kept: retry when "
                "it finishes")
        if _is_unwritable(exc):
            # The file is fine; its folder or disk is not: no advice to move it aside.
            return StoreError(f"cannot write the evidence store {self.path} ({exc}): the "
                              "store is not damaged; free space or make its folder writable")
        return StoreError(f"{self.path} is not a readable evidence store ({exc}); "
                          "move it aside and re-run `fastci record`")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> "EvidenceStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    class _Tx:
        """One write transaction; nested ones join the outermost (all or nothing)."""

        def __init__(self, store: EvidenceStore) -> None:
            self.store = store

        def __enter__(self) -> None:
            self.store._depth += 1
            if self.store._depth > 1:
                return
            try:  # waits up to the connection's timeout for another writer
                self.store.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                self.store._depth -= 1
                raise self.store._error(exc) from exc

        def __exit__(self, exc_type: object, *rest: object) -> None:
            self.store._depth -= 1
            if self.store._depth == 0:
                self.store.conn.execute("ROLLBACK" if exc_type else "COMMIT")

    def _tx(self) -> "EvidenceStore._Tx":
        self._drop_cached()
        return EvidenceStore._Tx(self)

    def _drop_cached(self) -> None:
        self._latest = None
        self._test_rows = None

    def _fresh(self) -> None:
        """Drop what was read before another connection committed a change."""
        version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._drop_cached()
            self._data_version = version

    def transaction(self) -> "EvidenceStore._Tx":
        """A write transaction around several writes (``ingest``, ``add_run``...): all of
        them land, or none (an exception rolls every one back)."""
        return self._tx()

    # ------------------------------------------------------------------ read side

    def test_ids(self) -> list[TestId]:
        """Every test the store knows, sorted."""
        return list(self._tests()[0])

    def _tests(self) -> tuple[list[TestId], dict[TestId, str | None]]:
        """Every test (sorted), and the commit of each one's held evidence: one read for
        :meth:`test_ids`, :meth:`baselines` and :meth:`evidence_commits`, which a plan
        asks for in turn, kept as :meth:`latest_runs` is (see :meth:`_fresh`)."""
        self._fresh()
        if self._test_rows is None:
            rows = self.conn.execute(
                "SELECT t.name, r.commit_sha, r.id IS NOT NULL FROM test t"
                " LEFT JOIN run r ON r.id = t.evidence_run ORDER BY t.name").fetchall()
            self._test_rows = ([row[0] for row in rows],
                               {name: commit for name, commit, held in rows if held})
        return self._test_rows

    def latest_runs(self) -> dict[TestId, RunRecord]:
        """The newest run per test (ties: the greater run key), with its ``last_full`` run."""
        self._fresh()
        if self._latest is None:
            self._latest = self._latest_runs()
        return dict(self._latest)

    def _latest_runs(self) -> dict[TestId, RunRecord]:
        with no_gc():
            return self._latest_runs_of_rows()

    def _latest_runs_of_rows(self) -> dict[TestId, RunRecord]:
        # SQLite finds each test's newest run and newest full-workload run through the
        # run_by_test index (newest: the greatest (recorded_at, run_key); TEXT compares
        # by UTF-8 bytes, which is code point order, and run keys are unique); only those
        # rows reach Python. Full is the writer's one spelling of "no overrides", '{}'
        # (real_overrides, _json). When the newest run is also the newest full one (the
        # usual case) its row is decoded once. Package listings are read once.
        listings = dict(self.conn.execute("SELECT fingerprint, packages_list FROM env_listing"))
        rows = self.conn.execute(_LATEST_RUNS).fetchall()
        other_full = [row[12] for row in rows if row[12] is not None and row[12] != row[11]]
        full_rows: dict[int, tuple[Any, ...]] = {}
        for i in range(0, len(other_full), 500):
            chunk = other_full[i:i + 500]
            full_rows.update((row[11], row) for row in self.conn.execute(
                f"{_RUN_ROWS} WHERE r.id IN ({','.join('?' * len(chunk))})", chunk))
        of_row = RunRecord.of_row
        if not listings and not other_full:  # the rows are the records (see RunRecord)
            return {row[0]: of_row(row) for row in rows}
        out: dict[TestId, RunRecord] = {}
        for row in rows:
            listing = listings.get(row[2])
            full_id = row[12]
            if full_id is not None and full_id != row[11]:
                full = full_rows[full_id]
                row = (*row[:12], of_row((*full, None, listings.get(full[2]))), listing)
            elif listing is not None:
                row = (*row, listing)
            out[row[0]] = of_row(row)
        return out

    def evidence_commits(self) -> set[str | None]:
        """The commits the tests' current evidence was recorded at (None: not known)."""
        return set(self._tests()[1].values())

    def baselines(self) -> dict[TestId, str | None]:
        """Test -> the commit its held evidence was recorded at (None: not known)."""
        return dict(self._tests()[1])

    def recorded_units(self, *, paths: Iterable[RelPath] | None = None,
                       tests: Iterable[TestId] | None = None) -> list[tuple[TestId, UnitId, Checksum]]:
        """(test, unit, the checksum *that test* recorded) for units in ``paths`` or of ``tests``.

        Both None: every pair held. Sorted. By path it reads the posting lists of the
        versions of those files' units; by test, those tests' rows.
        """
        out: set[tuple[TestId, UnitId, Checksum]] = set()
        if paths is None and tests is None:
            tids = [r[0] for r in self.conn.execute("SELECT test_id FROM evidence")]
            return sorted(self._pairs_of_tests(tids))
        if paths is not None:
            rows = self._versions_where("u.path", paths)
            names = self._names(t for *_, ts in rows for t in ts.tolist())
            out.update((names[t], uid, checksum) for _, _, uid, checksum, ts in rows
                       for t in ts.tolist())
        if tests is not None:
            out.update(self._pairs_of_tests(self._test_rowids(tests)))
        return sorted(out)

    def _pairs_of_tests(self, tids: Iterable[int]) -> Iterator[tuple[TestId, UnitId, Checksum]]:
        held = self._held(tids)
        names = self._names(held)
        versions = self._versions(v for vids, _ in held.values() for v in vids.tolist())
        for tid, (vids, _) in held.items():
            name = names[tid]
            for v in vids.tolist():
                uid, checksum = versions[v]
                yield name, uid, checksum

    def _versions_where(self, col: str, keys: Iterable[str]) -> list[_Posting]:
        """(key, version id, uid, checksum, test rowids) of every unit version whose ``col``
        (``u.uid`` or ``u.path``) is in ``keys``: the posting lists only."""
        out = []
        for chunk in chunks(sorted(k for k in set(keys) if storable(k))):
            out += [(key, vid, uid, checksum, postings.decode(blob))
                    for key, vid, uid, checksum, blob in self.conn.execute(
                        f"SELECT {col}, v.id, u.uid, v.checksum, v.tests FROM unit u"
                        " JOIN unit_version v"
                        f" ON v.unit_id = u.id WHERE {col} IN ({','.join('?' * len(chunk))})",
                        chunk)]
        return out

    def _test_rowids(self, tests: Iterable[TestId]) -> list[int]:
        out: list[int] = []
        for chunk in chunks(sorted(t for t in set(tests) if storable(t))):
            out += [r[0] for r in self.conn.execute(
                "SELECT id FROM test WHERE name IN (%s)" % ",".join("?" * len(chunk)), chunk)]
        return out

    def _names(self, tids: Iterable[int]) -> dict[int, TestId]:
        """Test rowid -> name."""
        out: dict[int, TestId] = {}
        for chunk in chunks(sorted(set(tids))):
            out.update(self.conn.execute(
                "SELECT id, name FROM test WHERE id IN (%s)" % ",".join("?" * len(chunk)), chunk))
        return out

    def _held(self, tids: Iterable[int]) -> dict[int, tuple[postings.Ids, postings.Ids]]:
        """Test rowid -> (its sorted unit-version ids, their context-set ids)."""
        out = {}
        for chunk in chunks(sorted(set(tids))):
            for tid, vids, sets in self.conn.execute(
                    "SELECT test_id, versions, ctxsets FROM evidence WHERE test_id IN (%s)"
                    % ",".join("?" * len(chunk)), chunk):
                out[tid] = (postings.decode(vids), postings.decode(sets))
        return out

    def _versions(self, vids: Iterable[int]) -> dict[int, tuple[UnitId, Checksum]]:
        """Unit-version id -> (unit id, checksum)."""
        out: dict[int, tuple[UnitId, Checksum]] = {}
        for chunk in chunks(sorted(set(vids))):
            out.update((vid, (uid, checksum)) for vid, uid, checksum in self.conn.execute(
                "SELECT v.id, u.uid, v.checksum FROM unit_version v JOIN unit u"
                " ON u.id = v.unit_id WHERE v.id IN (%s)" % ",".join("?" * len(chunk)), chunk))
        return out

    def _contexts(self, set_ids: Iterable[int]) -> dict[int, list[ContextSig]]:
        """Context-set id -> its context signatures, sorted."""
        sets: dict[int, list[int]] = {}
        for chunk in chunks(sorted(set(set_ids))):
            sets.update((i, unpack_ids(blob)) for i, blob in self.conn.execute(
                "SELECT id, ids FROM ctxset WHERE id IN (%s)" % ",".join("?" * len(chunk)), chunk))
        sigs = self._sigs(c for ids in sets.values() for c in ids)
        return {i: sorted(sigs[c] for c in ids) for i, ids in sets.items()}

    def source_digests(self, *, paths: Iterable[RelPath] | None = None,
                       tests: Iterable[TestId] | None = None) -> list[tuple[TestId, RelPath, str]]:
        """(test, Python path, sha256 of the file when that test was recorded), sorted."""
        query = "SELECT t.name, s.path, s.digest FROM source s JOIN test t ON t.id = s.test_id"
        return sorted(set(self._rows(query, paths=paths, tests=tests, path_col="s.path")))

    def _rows(self, query: str, *, paths: Iterable[RelPath] | None, tests: Iterable[TestId] | None,
              path_col: str) -> Iterator[Any]:
        """Rows of ``query`` whose ``path_col`` is in ``paths`` or whose test is in ``tests``
        (both None: every row); a row matching both comes twice (callers dedupe)."""
        if paths is None and tests is None:
            yield from self.conn.execute(query)
            return
        for col, keys in ((path_col, paths), ("t.name", tests)):
            if keys is None:
                continue
            for chunk in chunks(sorted(k for k in set(keys) if storable(k))):
                yield from self.conn.execute(
                    f"{query} WHERE {col} IN ({','.join('?' * len(chunk))})", chunk)

    def distributions_of_tests(self, tests: Iterable[TestId] | None = None) -> \
            dict[TestId, dict[str, str]]:
        """Test -> {distribution name: version} its held evidence imported."""
        out: dict[TestId, dict[str, str]] = {}
        query = ("SELECT t.name, d.name, d.version FROM dist_import d JOIN test t"
                 " ON t.id = d.test_id")
        rows: Iterable[Any]
        if tests is None:
            rows = self.conn.execute(query)
        else:
            rows = (r for chunk in chunks(sorted(set(tests))) for r in self.conn.execute(
                f"{query} WHERE t.name IN ({','.join('?' * len(chunk))})", chunk))
        for test, name, version in rows:
            out.setdefault(test, {})[name] = version
        return out

    def tests_for_distributions(self, names: Iterable[str]) -> dict[str, set[TestId]]:
        """Distribution name -> tests whose held evidence imported it (every asked name a key)."""
        return self._tests_by_key(names, "SELECT d.name, t.name FROM dist_import d JOIN test t"
                                  " ON t.id = d.test_id WHERE d.name IN (%s)")

    def _tests_by_key(self, keys: Iterable[str], query: str) -> dict[str, set[TestId]]:
        """Run ``query`` (one ``IN (%s)`` over ``keys``, yielding (key, test)) in chunks."""
        wanted = sorted(set(keys))
        out: dict[str, set[TestId]] = {k: set() for k in wanted}
        for chunk in chunks([k for k in wanted if storable(k)]):
            for key, name in self.conn.execute(query % ",".join("?" * len(chunk)), chunk):
                out[key].add(name)
        return out

    def tests_for_units(self, units: Iterable[UnitId]) -> dict[UnitId, set[TestId]]:
        """Unit id -> tests whose evidence executed it (every asked id is a key)."""
        return self._tests_by_version(units, "u.uid")

    def _tests_by_version(self, keys: Iterable[str], col: str) -> dict[str, set[TestId]]:
        wanted = set(keys)
        rows = self._versions_where(col, wanted)
        names = self._names(t for *_, ts in rows for t in ts.tolist())
        out: dict[str, set[TestId]] = {k: set() for k in sorted(wanted)}
        for key, *_, tids in rows:
            out[key].update(names[t] for t in tids.tolist())
        return out

    def tests_for_files(self, paths: Iterable[RelPath]) -> dict[RelPath, set[TestId]]:
        """Path -> tests that opened that (non-Python) file for reading."""
        return self._tests_by_key(paths, "SELECT f.path, t.name FROM file_read f JOIN test t"
                                  " ON t.id = f.test_id WHERE f.path IN (%s)")

    def tests_for_modules(self, paths: Iterable[RelPath]) -> dict[RelPath, set[TestId]]:
        """Path -> tests that executed any unit of that Python file."""
        return self._tests_by_version(paths, "u.path")

    def file_digests(self, paths: Iterable[RelPath] | None = None) -> \
            list[tuple[RelPath, TestId, str]]:
        """(path, test, recorded digest) of every file read held as evidence (or of ``paths``)."""
        query = "SELECT f.path, t.name, f.digest FROM file_read f JOIN test t ON t.id = f.test_id"
        if paths is None:
            return [(p, t, d) for p, t, d in self.conn.execute(query + " ORDER BY f.path, t.name")]
        out: list[tuple[RelPath, TestId, str]] = []
        for chunk in chunks(sorted(p for p in set(paths) if storable(p))):
            q = query + " WHERE f.path IN (%s)" % ",".join("?" * len(chunk))
            out += [(p, t, d) for p, t, d in self.conn.execute(q, chunk)]
        return sorted(out)

    def units_of_test(self, test: TestId) -> dict[UnitId, list[ContextSig]]:
        """Unit id -> the test's context signatures there (sorted)."""
        return {uid: sigs for uid, (_, sigs) in self.evidence_of_test(test).items()}

    def evidence_of_test(self, test: TestId) -> dict[UnitId, tuple[Checksum, list[ContextSig]]]:
        """Unit id -> (the checksum the test recorded, its context signatures, sorted): the
        test's whole held evidence (an export writes it)."""
        held = self._held(self._test_rowids([test]))
        if not held:
            return {}
        (vids, sets), = held.values()
        versions = self._versions(vids.tolist())
        contexts = self._contexts(sets.tolist())
        return {versions[v][0]: (versions[v][1], contexts[c])
                for v, c in zip(vids.tolist(), sets.tolist())}

    def contexts_of_units(self, units: Iterable[UnitId]) -> dict[TestId, dict[UnitId, list[ContextSig]]]:
        """Test -> unit -> its context signatures (sorted), for ``units`` only: the posting
        lists of those units' versions, then the rows of the tests found there (pruning
        reads it for the changed units)."""
        rows = self._versions_where("u.uid", units)
        held = self._held(t for *_, ts in rows for t in ts.tolist())
        names = self._names(held)
        found: list[tuple[int, UnitId, int]] = []
        for _, vid, uid, _, tids in rows:
            for t in tids.tolist():
                vids, sets = held[t]
                found.append((t, uid, int(sets[int(np.searchsorted(vids, vid))])))
        contexts = self._contexts(c for _, _, c in found)
        out: dict[TestId, dict[UnitId, list[ContextSig]]] = {}
        for t, uid, c in found:
            out.setdefault(names[t], {})[uid] = list(contexts[c])
        return out

    def files_of_test(self, test: TestId) -> list[RelPath]:
        """Files the test opened for reading, sorted."""
        return [r[0] for r in self.conn.execute(
            "SELECT f.path FROM test t JOIN file_read f ON f.test_id = t.id WHERE t.name = ?"
            " ORDER BY f.path", (test,))]

    def runs_of_test(self, test: TestId) -> list[RunRecord]:
        """Every run of ``test``, oldest first."""
        return list(self._runs(" WHERE t.name = ?", (test,)))

    def recent_outcomes(self, tests: Iterable[TestId], n: int = 10) -> dict[TestId, tuple[str, ...]]:
        """The outcomes of each of ``tests``' last ``n`` runs, newest first, in
        :meth:`runs_of_test`'s order (ties: the greater run key); one query per chunk of
        tests. A test with no run is absent."""
        return {t: tuple(o for o, _ in runs) for t, runs in self.recent_runs(tests, n).items()}

    def recent_runs(self, tests: Iterable[TestId], n: int = 10
                    ) -> dict[TestId, tuple[tuple[str, str | None], ...]]:
        """(outcome, commit) of each of ``tests``' last ``n`` runs, as :meth:`recent_outcomes`."""
        out: dict[TestId, list[tuple[str, str | None]]] = {}
        for chunk in chunks(sorted(set(tests))):
            rows = self.conn.execute(
                "SELECT name, outcome, commit_sha FROM (SELECT t.name AS name, r.outcome AS"
                " outcome, r.commit_sha AS commit_sha, row_number() OVER (PARTITION BY"
                " r.test_id ORDER BY r.recorded_at DESC, r.run_key DESC) AS k FROM run r JOIN"
                " test t ON t.id = r.test_id WHERE t.name IN (%s)) WHERE k <= ? ORDER BY name, k"
                % ",".join("?" * len(chunk)), (*chunk, n))
            for name, outcome, commit in rows:
                out.setdefault(name, []).append((outcome, commit))
        return {t: tuple(r) for t, r in out.items()}

    def failure_history(self, n: int = 20) -> dict[TestId, tuple[HistoryRun, ...]]:
        """The last ``n`` runs, newest first (by clock; ties: the greater run key), of each
        test that has a failure among them (:func:`fastci.types.is_failure`), for ordering
        its history by git ancestry (:mod:`fastci.select.history`). One pass over the runs
        that did not pass, then the windows of only those tests."""
        self._fresh()
        ok = sorted(OUTCOMES - FAILURE_OUTCOMES)
        failing = [tid for (tid,) in self.conn.execute(
            f"SELECT DISTINCT test_id FROM run WHERE outcome NOT IN ({','.join('?' * len(ok))})",
            ok)]
        out: dict[TestId, list[HistoryRun]] = {}
        for chunk in chunks(sorted(failing)):
            rows = self.conn.execute(
                "SELECT name, outcome, commit_sha, overrides, recorded_at FROM (SELECT t.name AS"
                " name, r.outcome AS outcome, r.commit_sha AS commit_sha, r.overrides AS"
                " overrides, r.recorded_at AS recorded_at, row_number() OVER (PARTITION BY"
                " r.test_id ORDER BY r.recorded_at DESC, r.run_key DESC) AS k FROM run r JOIN"
                " test t ON t.id = r.test_id WHERE r.test_id IN (%s)) WHERE k <= ?"
                " ORDER BY name, k" % ",".join("?" * len(chunk)), (*chunk, n))
            for name, outcome, commit, overrides, at in rows:
                out.setdefault(name, []).append(HistoryRun(outcome, commit, overrides == "{}", at))
        return {t: tuple(r) for t, r in out.items() if any(is_failure(h.outcome) for h in r)}

    def _runs(self, where: str, args: tuple[str, ...]) -> Iterator[RunRecord]:
        """Runs (joined with their test) matching ``where``, oldest first."""
        rows = self.conn.execute(
            f"SELECT {_ROW}, NULL, l.packages_list FROM run r JOIN test t ON t.id = r.test_id"
            f" LEFT JOIN env_listing l ON l.fingerprint = r.env_fingerprint{where}"
            " ORDER BY r.recorded_at, r.run_key", args)
        yield from map(RunRecord.of_row, rows)

    def stats(self) -> dict[str, int]:
        """Row counts per table, ``evidence`` the (test, unit) pairs held, and the file
        size in bytes."""
        out = {t: self.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
               for t in ("test", "unit", "context", "ctxset", "unit_version", "file_read", "run",
                         "source", "dist_import", "env_listing")}
        out["evidence"] = self.conn.execute("SELECT coalesce(sum(pairs), 0) FROM evidence"
                                            ).fetchone()[0]
        out["bytes"] = sum(p.stat().st_size for p in
                           (self.path, Path(f"{self.path}-wal")) if p.exists())
        return out

    def _sigs(self, ids: Iterable[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for chunk in chunks(sorted(set(ids))):
            q = "SELECT id, sig FROM context WHERE id IN (%s)" % ",".join("?" * len(chunk))
            out.update(dict(self.conn.execute(q, chunk)))
        return out
