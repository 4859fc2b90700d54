"""The SQLite evidence store: what each test executed, read, and how it last ran.

Test processes never open the store; ``fastci ingest`` merges their trace files
(WAL mode, so readers never block the writer). Unit, test and context ids are
integers. Evidence is held as packed id arrays, not one row per (test, unit)
pair: per test its sorted *unit versions* (a unit with the checksum that test
recorded) and their interned context sets, per unit version the sorted tests
that executed it (:mod:`fastci.evidence.postings`, written in batches by
:mod:`fastci.evidence.batch`). The schema lives in :mod:`fastci.evidence.schema`.
"""

from __future__ import annotations

import array
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from fastci.errors import StoreError
from fastci.gcpause import no_gc
from fastci.evidence import postings
from fastci.evidence.batch import EvidenceBatch, chunks, pack_ids, unpack_ids
from fastci.evidence.schema import SCHEMA, SCHEMA_VERSION
from fastci.types import (FAILURE_OUTCOMES, OUTCOMES, Checksum, ContextSig, RelPath, TestId, UnitId,
                          is_failure)

LOG = logging.getLogger(__name__)

DEFAULT_PATH = Path(".fastci/evidence.db")
#: How long a writer waits for another writer's transaction before giving up (seconds).
LOCK_WAIT_S = 30.0
#: The tables a store of this schema version has.
TABLES = frozenset({"meta", "test", "unit", "context", "ctxset", "unit_version", "evidence",
                    "file_read", "run", "source", "dist_import", "env_listing"})
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
#: The key of a run's environment JSON that says why its evidence is incomplete although
#: every process stopped cleanly (trace field ``incomplete_reasons``; absent otherwise).
#: Kept there rather than in a column of its own so that stores need no new schema.
INCOMPLETE_KEY = "incomplete_reason"
__all__ = ["EvidenceStore", "HistoryRun", "RunEvidence", "RunRecord", "StoreLockedError", "pack_ids",
           "unpack_ids", "real_overrides", "lock_holders", "DEFAULT_PATH", "LOCK_WAIT_S"]


@dataclass(frozen=True)
class HistoryRun:
    """One run in a test's failure history (:meth:`EvidenceStore.failure_history`)."""

    outcome: str
    commit: str | None
    full: bool  # known to be at full workload
    recorded_at: float


class RunRecord(tuple[Any, ...]):
    """One run of a test as the store knows it.

    ``workload`` is the declared (full) workload the run knew; ``overrides`` what
    the run changed of it: ``{}`` when it ran at full workload, ``None`` when the
    writer did not say (such a run never counts as a full-workload run).
    :meth:`EvidenceStore.latest_runs` also fills ``last_full``: the test's newest
    run known to be at full workload (this record itself when it is one).

    Immutable. Held as a tuple of the store's row (:data:`_ROW`'s layout, see
    :meth:`of_row`), its JSON columns parsed when read: a plan reads the newest run
    of every test, 100,000 at scale, and a tuple made from the row costs a fifth of
    an object with a ``__dict__`` (measured: 0.04 against 0.2 s). Equality compares
    the fields, as a dataclass's would, never the layout.
    """

    __slots__ = ()

    def __new__(cls, test: TestId, commit: str | None, env_fingerprint: str,
                workload: Mapping[str, Any], duration_s: float, gpus: int, outcome: str,
                complete: bool, recorded_at: float, overrides: Mapping[str, Any] | None = None,
                last_full: RunRecord | None = None, environment_json: str = "{}",
                packages_list: str = "") -> RunRecord:
        return tuple.__new__(cls, (test, commit, env_fingerprint, workload, overrides, duration_s,
                                   gpus, outcome, complete, recorded_at, environment_json, None,
                                   last_full, packages_list))

    @classmethod
    def of_row(cls, row: tuple[Any, ...]) -> RunRecord:
        """A record of a row in :data:`_ROW`'s layout: the 11 record columns, the run's
        id, then optionally the newest full-workload run (None; the run's own id: this
        run; or a RunRecord) and the package listing of its environment."""
        return tuple.__new__(cls, row)

    if TYPE_CHECKING:
        test: TestId
        commit: str | None
        env_fingerprint: str
        duration_s: float
        gpus: int
        outcome: str
        recorded_at: float
        environment_json: str
    else:
        test = property(itemgetter(0))
        commit = property(itemgetter(1))
        env_fingerprint = property(itemgetter(2))
        duration_s = property(itemgetter(5))
        gpus = property(itemgetter(6))
        outcome = property(itemgetter(7))
        recorded_at = property(itemgetter(9))
        environment_json = property(itemgetter(10))

    @property
    def workload(self) -> Mapping[str, Any]:
        got: Mapping[str, Any] | str = self[3]
        return _loads(got) if isinstance(got, str) else got

    @property
    def overrides(self) -> Mapping[str, Any] | None:
        got: Mapping[str, Any] | str | None = self[4]
        return _loads(got) if isinstance(got, str) else got

    @property
    def complete(self) -> bool:
        return bool(self[8])

    @property
    def last_full(self) -> RunRecord | None:
        got = self[12] if len(self) > 12 else None
        if got is None or isinstance(got, RunRecord):
            return got
        if got == self[11]:
            return self  # the run's own id: it is its own newest full-workload run
        raise StoreError(f"the run record of {self.test} names a full-workload run it does not hold")

    @property
    def packages_list(self) -> str:
        return (self[13] if len(self) > 13 else None) or ""

    def _fields(self) -> tuple[Any, ...]:
        """What equality compares: the fields (:data:`_COMPARED`), mappings as dicts, and
        the record's own ``last_full`` as a marker (no recursion into itself)."""
        full = self.last_full
        return (*(_plain(getattr(self, name)) for name in _COMPARED),
                _ITSELF if full is self else full)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunRecord):
            return NotImplemented
        return self._fields() == other._fields()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, RunRecord):
            return NotImplemented
        return self._fields() != other._fields()

    __hash__ = None  # type: ignore[assignment]  # holds dicts, as the dataclass it replaced

    def __repr__(self) -> str:
        full = self.last_full
        shown = ", ".join(f"{name}={_plain(getattr(self, name))!r}" for name in _COMPARED)
        return f"RunRecord({shown}, last_full={'<itself>' if full is self else repr(full)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return RunRecord.of_row, (tuple(self),)

    def as_dict(self) -> dict[str, Any]:
        """The fields by name (``last_full`` as its own dict, ``"itself"`` when the record
        is its own newest full-workload run): what ``fastci evidence show --json`` prints."""
        full = self.last_full
        return {**{name: _plain(getattr(self, name)) for name in _COMPARED},
                "last_full": "itself" if full is self else None if full is None
                else full.as_dict(),
                "environment_json": self.environment_json, "packages_list": self.packages_list}

    @property
    def environment(self) -> dict[str, Any]:
        """The run's environment parts (``python``, ``base_fingerprint`` ...) and, when the
        store holds it, ``packages_list``: what environment rules compare package by package."""
        try:
            env = json.loads(self.environment_json)
        except ValueError:
            env = {}
        env = env if isinstance(env, dict) else {}
        if self.packages_list:
            env["packages_list"] = self.packages_list
        return env

    @property
    def incomplete_reason(self) -> str:
        """Why the run's evidence is incomplete, when its recording said (``""``: not said)."""
        got = self.environment.get(INCOMPLETE_KEY)
        return got if isinstance(got, str) else ""

    @property
    def full(self) -> bool:
        """Whether the run is known to have run at the full declared workload."""
        return self.overrides is not None and not self.overrides


@dataclass(frozen=True)
class RunEvidence:
    """A merged recording of one test run (all its processes), ready to ingest.

    ``workload`` is the declared (full) workload, ``overrides`` what the run
    changed of it (see :class:`RunRecord`).
    """

    test: TestId
    run_key: str
    outcome: str
    complete: bool
    duration_s: float
    gpus: int
    workload: Mapping[str, Any]
    recorded_at: float
    env_fingerprint: str = ""
    # What the run changed of ``workload`` (the declared one): {} = full
    # workload, None = the recording did not say (never counts as full).
    overrides: Mapping[str, Any] | None = None
    environment: Mapping[str, Any] = field(default_factory=dict)
    commit: str | None = None
    source: str = "bazel"
    units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]] = field(default_factory=dict)
    files: Mapping[RelPath, str] = field(default_factory=dict)
    # Python path -> sha256 of its bytes when recorded (the test's baseline of the file).
    sources: Mapping[RelPath, str] = field(default_factory=dict)
    # Third-party distributions the run imported: name -> version.
    distributions: Mapping[str, str] = field(default_factory=dict)
    # A run imported from an export without its evidence (history; :meth:`add_run`).
    has_evidence: bool = True


class StoreLockedError(StoreError):
    """Another writer held the store's lock longer than a writer waits."""


def real_overrides(workload: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides that change something: entries equal to the declared value are dropped.

    So "ran at full workload" is one thing (``{}``), however a writer spelled it.
    """
    return {k: v for k, v in overrides.items() if k not in workload or workload[k] != v}


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


def _storable(key: str) -> bool:
    """Whether ``key`` can be a TEXT value (UTF-8): a path git decoded with
    ``surrogateescape`` from bytes that are not UTF-8 cannot, so the store holds
    nothing for it (no test is known to touch it; selection decides from there).
    """
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
#: What a record's equality puts where its ``last_full`` is the record itself.
_ITSELF = object()
#: The fields a record's equality compares (and its repr shows) besides ``last_full``;
#: the environment's text and package listing are not compared.
_COMPARED = ("test", "commit", "env_fingerprint", "workload", "duration_s", "gpus", "outcome",
             "complete", "recorded_at", "overrides")


def _plain(value: Any) -> Any:
    """A field's value with a mapping as a plain dict (what equality and JSON see)."""
    return dict(value) if isinstance(value, Mapping) else value


def _loads(text: str) -> Any:
    """``json.loads``, without its cost for the empty object most runs hold."""
    return {} if text == "{}" else json.loads(text)


#: A unit version as a read finds it: (the key asked for, version id, unit id, checksum,
#: the posting list: sorted test rowids).
_Posting = tuple[str, int, UnitId, Checksum, postings.Ids]


class EvidenceStore:
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

    def unit_checksums(self) -> dict[UnitId, Checksum]:
        """Unit id -> checksum at (the newest) record time."""
        return dict(self.conn.execute("SELECT uid, checksum FROM unit"))

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
        for chunk in chunks(sorted(k for k in set(keys) if _storable(k))):
            out += [(key, vid, uid, checksum, postings.decode(blob))
                    for key, vid, uid, checksum, blob in self.conn.execute(
                        f"SELECT {col}, v.id, u.uid, v.checksum, v.tests FROM unit u"
                        " JOIN unit_version v"
                        f" ON v.unit_id = u.id WHERE {col} IN ({','.join('?' * len(chunk))})",
                        chunk)]
        return out

    def _test_rowids(self, tests: Iterable[TestId]) -> list[int]:
        out: list[int] = []
        for chunk in chunks(sorted(t for t in set(tests) if _storable(t))):
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
            for chunk in chunks(sorted(k for k in set(keys) if _storable(k))):
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
        for chunk in chunks([k for k in wanted if _storable(k)]):
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
        for chunk in chunks(sorted(p for p in set(paths) if _storable(p))):
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

    # ------------------------------------------------------------------ write side

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
        c = self.conn
        known = self._known_keys(r.run_key for r in runs)
        out: list[bool] = []
        for run in runs:  # a key twice in the chunk: the second is known by then
            out.append(run.run_key not in known)
            known.add(run.run_key)
        tids = self._test_ids(r.test for r, new in zip(runs, out) if new)
        held = self._held_runs(tids.values())
        rid = int(c.execute("SELECT coalesce(max(id), 0) FROM run").fetchone()[0])
        run_rows: list[tuple[Any, ...]] = []
        listings: list[tuple[str, str]] = []
        wins: list[tuple[int, int, RunEvidence]] = []
        for run, new in zip(runs, out):
            if not new:
                continue
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
        # Only each test's last winner's files remain (as one ingest after another leaves).
        self._replace_rows("file_read", {tid: {(p, tid, d) for p, d in run.files.items()
                                               if _storable(p)}
                                         for tid, (_, run) in last.items()})
        self._replace_rows("source", {tid: {(p, tid, d) for p, d in run.sources.items()
                                            if _storable(p)}
                                      for tid, (_, run) in last.items()})
        self._replace_rows("dist_import", {tid: {(tid, n, v) for n, v in run.distributions.items()}
                                           for tid, (_, run) in last.items()})
        c.executemany("UPDATE test SET evidence_run = ?, evidence_at = ? WHERE id = ?",
                      [(run_id, run.recorded_at, tid) for tid, (run_id, run) in last.items()])
        return out

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
        t_col, u_col, s_col = array.array("I"), array.array("I"), array.array("I")
        sets: dict[tuple[int, ...], int] = {}
        for t, u, ctx in evidence:  # the only per-pair Python: the rest is array work
            t_col.append(t)
            u_col.append(u)
            s_col.append(sets.setdefault(tuple(ctx), len(sets)))
        # Context lists that are the same set share one id (canonical: sorted, distinct).
        canonical: dict[tuple[int, ...], int] = {}
        remap = np.array([canonical.setdefault(tuple(sorted(set(k))), len(canonical))
                          for k in sets] or [0], dtype=np.uint32)
        t_arr = np.frombuffer(t_col, dtype=np.uint32)
        u_arr = np.frombuffer(u_col, dtype=np.uint32)
        s_arr = remap[np.frombuffer(s_col, dtype=np.uint32)] + np.uint32(1)
        c = self.conn
        c.execute("PRAGMA synchronous=OFF")
        with self._tx():
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
            c.executemany("INSERT INTO source (path, test_id, digest) VALUES (?,?,?)",
                          ((path, t + 1, digest) for t, path, digest in sources))
        c.execute("PRAGMA synchronous=NORMAL")


def _runs_of(sorted_ids: postings.Ids) -> Iterator[tuple[int, int]]:
    """The [start, end) slices of equal values in a sorted array."""
    if not len(sorted_ids):
        return
    cuts = np.flatnonzero(np.diff(sorted_ids)) + 1
    bounds = [0, *cuts.tolist(), len(sorted_ids)]
    yield from zip(bounds[:-1], bounds[1:])
