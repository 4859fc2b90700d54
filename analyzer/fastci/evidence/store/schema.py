"""The evidence store's SQL schema, versioned (like coverage.py's ``sqldata.py``).

Version history:

* 1 — tests, units (integer ids, path index), interned contexts, evidence rows
  (unit x test -> packed context ids), files read, runs.
* 2 — runs keep the declared workload and the overrides applied apart:
  ``run.workload`` is the declared (full) workload, the new ``run.overrides``
  what the run changed (``{}`` = full workload, NULL = not known). A reduced
  run no longer looks like a changed declaration, and "failed last" can ask
  for the newest full-workload run.
* 3 — every test keeps its own baseline: ``evidence.checksum`` is the unit's
  checksum as *that test's* recording saw it (``unit.checksum`` only keeps the
  newest, for display), the new ``source`` table the digest of every Python
  file the test executed, and ``dist_import`` the third-party distributions
  (name, version) the test's processes imported, and ``env_listing`` the installed
  packages (``name==version`` lines) once per environment fingerprint, so two
  environments can be compared package by package. Selection compares each test
  with its own baseline, so a partial re-record never hides or repeats a change.
* 4 — compact evidence (issue 16, scale): no row per (test, unit) pair. A unit
  as one test recorded it, ``(unit, checksum)``, is a *unit version*
  (``unit_version``, holding its posting list: the sorted ids of the tests whose
  held evidence executed it); a set of contexts is interned once (``ctxset``);
  ``evidence`` holds one row per test: its sorted unit-version ids and the
  parallel context-set ids, packed (:mod:`fastci.evidence.store.postings`). Each test's
  own checksum is the checksum of its unit version, so the semantics of version 3
  are kept exactly; 7-10 bytes per pair on disk instead of about 68 (docs/EVIDENCE.md).

A store with another version is never migrated or deleted silently:
:class:`~fastci.evidence.store.db.EvidenceStore` raises ``StoreError`` saying to
move it aside and re-record.
"""

from __future__ import annotations

SCHEMA_VERSION = 4

SCHEMA = """
-- Key/value facts about the store itself: schema_version, created_at.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- One row per test (Bazel label or pytest node id). evidence_run is the run
-- whose evidence is held in `evidence`/`file_read` (the newest recording).
CREATE TABLE test (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    evidence_run INTEGER,            -- run.id, NULL until first recorded
    evidence_at REAL NOT NULL DEFAULT 0
);

-- One row per unit id `path::qualname`; checksum as of the newest recording
-- that executed it (for display: selection compares each test's own, its unit version's).
CREATE TABLE unit (
    id INTEGER PRIMARY KEY,
    uid TEXT NOT NULL UNIQUE,
    path TEXT NOT NULL,
    checksum TEXT NOT NULL DEFAULT ''
);
CREATE INDEX unit_by_path ON unit (path);

-- Interned context signatures (see docs/EVIDENCE.md).
CREATE TABLE context (
    id INTEGER PRIMARY KEY,
    sig TEXT NOT NULL UNIQUE
);

-- An interned set of context ids (little-endian uint32, sorted): most units run in
-- one of a few sets, so a pair holds a 1-4 byte set id instead of its own list.
CREATE TABLE ctxset (
    id INTEGER PRIMARY KEY,
    ids BLOB NOT NULL UNIQUE
);

-- A unit version: unit `unit_id` as some test's recording saw it (its checksum; ''
-- = not known, which never equals a real checksum, so the test re-runs). `tests`:
-- the posting list, the sorted ids of the tests whose held evidence executed this
-- version (packed, fastci.evidence.store.postings), so tests_for_units reads only the
-- versions of the asked units. A version no test holds any more is deleted.
CREATE TABLE unit_version (
    id INTEGER PRIMARY KEY,
    unit_id INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    tests BLOB NOT NULL
);
CREATE UNIQUE INDEX unit_version_by_unit ON unit_version (unit_id, checksum);

-- A test's held evidence, one row per test: `versions` the sorted ids of the unit
-- versions it executed, `ctxsets` (parallel) the context set of each (both packed);
-- `pairs` how many. A test executes at most one version of a unit.
CREATE TABLE evidence (
    test_id INTEGER PRIMARY KEY,
    pairs INTEGER NOT NULL,
    versions BLOB NOT NULL,
    ctxsets BLOB NOT NULL
);

-- The Python files a test executed, with the sha256 of their bytes when it was
-- recorded: the version of the file its evidence describes (its baseline).
CREATE TABLE source (
    path TEXT NOT NULL,
    test_id INTEGER NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (path, test_id)
) WITHOUT ROWID;
CREATE INDEX source_by_test ON source (test_id);

-- Third-party distributions a test's processes imported (name as installed, version).
CREATE TABLE dist_import (
    test_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    PRIMARY KEY (test_id, name)
) WITHOUT ROWID;
CREATE INDEX dist_import_by_name ON dist_import (name);

-- The installed distributions of an environment (one `name==version` a line), once per
-- fingerprint (the fingerprint covers them): which packages two environments differ in.
CREATE TABLE env_listing (
    fingerprint TEXT PRIMARY KEY,
    packages_list TEXT NOT NULL
) WITHOUT ROWID;

-- Non-Python files a test opened for reading under the repo.
CREATE TABLE file_read (
    path TEXT NOT NULL,
    test_id INTEGER NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (path, test_id)
) WITHOUT ROWID;
CREATE INDEX file_read_by_test ON file_read (test_id);

-- Every ingested run of a test: recordings (has_evidence = 1) and plain
-- results (fastci run / pytest). run_key makes ingestion idempotent.
CREATE TABLE run (
    id INTEGER PRIMARY KEY,
    test_id INTEGER NOT NULL,
    run_key TEXT NOT NULL UNIQUE,
    commit_sha TEXT,
    env_fingerprint TEXT NOT NULL,
    environment TEXT NOT NULL,       -- JSON object
    workload TEXT NOT NULL,          -- JSON object: the declared (full) workload
    overrides TEXT,                  -- JSON object: what the run changed of it ({} = ran at
                                     -- full workload); NULL = not known (never counts as full)
    duration_s REAL NOT NULL,
    gpus INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    complete INTEGER NOT NULL,       -- 1 = every trace of the run stopped cleanly
    recorded_at REAL NOT NULL,       -- unix seconds
    source TEXT NOT NULL,            -- bazel | pytest | result
    has_evidence INTEGER NOT NULL
);
CREATE INDEX run_by_test ON run (test_id, recorded_at, run_key);
"""
