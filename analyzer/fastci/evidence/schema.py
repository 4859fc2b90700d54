"""The evidence store's SQL schema, versioned (like coverage.py's ``sqldata.py``).

Version history:

* 1 — tests, units (integer ids, path index), interned contexts, evidence rows
  (unit x test -> packed context ids), files read, runs.
* 2 — runs keep the declared workload and the overrides applied apart:
  ``run.workload`` is the declared (full) workload, the new ``run.overrides``
  what the run changed (``{}`` = full workload, NULL = not known). A reduced
  run no longer looks like a changed declaration, and "failed last" can ask
  for the newest full-workload run.

A store with another version is never migrated or deleted silently:
:class:`~fastci.evidence.store.EvidenceStore` raises ``StoreError`` saying to
move it aside and re-record.
"""

from __future__ import annotations

SCHEMA_VERSION = 2

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
-- that executed it (selection compares it with the current source).
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

-- Test executed unit, in these contexts: little-endian uint32 context ids.
-- Keyed unit-first so tests_for_units is one index range per unit.
CREATE TABLE evidence (
    unit_id INTEGER NOT NULL,
    test_id INTEGER NOT NULL,
    contexts BLOB NOT NULL,
    PRIMARY KEY (unit_id, test_id)
) WITHOUT ROWID;
CREATE INDEX evidence_by_test ON evidence (test_id);

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
CREATE INDEX run_by_test ON run (test_id, recorded_at);
"""
