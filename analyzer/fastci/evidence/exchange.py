"""Publishing an evidence store between CI jobs: one canonical, compact file.

GPU CI records on many runners. Each runner ingests its own traces into its own
store; a main-branch job merges the runners' exports into one store and publishes it
as an artifact; a PR job imports the newest one and plans. :func:`export_store` writes
``fastci-evidence`` files, :func:`import_store` merges one into a store.

The file is gzip-compressed JSON lines:

1. a header: ``{"format": "fastci-evidence", "version": 1, "commit": ..., "runs": N,
   "tests": M, "digest": "sha256:..."}``. ``commit`` is the commit the evidence
   describes (given by the exporter, else the newest evidence's commit) and
   ``digest`` the sha256 of every line after the header;
2. one line per run, sorted by (test, recorded_at, run_key): its metadata, and for
   the run whose evidence the store holds for that test, the evidence itself (units
   with their checksums and context signatures, files read, Python sources,
   distributions). Internal row ids never appear, so two stores with the same runs
   export byte-identical files.

Import verifies the header and the digest before it writes anything (a truncated or
edited file is one error line and changes nothing), then ingests in the file's order;
ingesting is idempotent (run keys) and order-independent (the newest recording per
test wins, ties broken by run key), so shards imported in any order give the same
store, as compared by their exports. Nothing in the file is executed: it is data
(JSON), read with ``json.loads``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fastci.errors import StoreError
from fastci.evidence.store import EvidenceStore, RunEvidence

FORMAT = "fastci-evidence"
VERSION = 1
#: The most an evidence file may expand to, and one line of it (one run with its evidence:
#: 500,000 units with their contexts stay well under it). A file over either is refused
#: as it is read, before it costs that memory: a small gzip can expand a thousandfold.
MAX_EXPORT_BYTES = 1 << 30
MAX_LINE_BYTES = 64 << 20


@dataclass(frozen=True)
class Manifest:
    """The header of an evidence file."""

    commit: str | None
    runs: int
    tests: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "commit": self.commit, "runs": self.runs,
                "tests": self.tests, "digest": self.digest}


def _lines(store: EvidenceStore) -> Iterator[tuple[str, str]]:
    """The canonical run lines of ``store``, sorted, each with its test."""
    conn = store.conn
    current = dict(conn.execute("SELECT t.name, r.run_key FROM test t JOIN run r"
                                " ON r.id = t.evidence_run"))
    listings = dict(conn.execute("SELECT fingerprint, packages_list FROM env_listing"))
    rows = conn.execute(
        "SELECT t.name, r.run_key, r.commit_sha, r.env_fingerprint, r.environment, r.workload,"
        " r.overrides, r.duration_s, r.gpus, r.outcome, r.complete, r.recorded_at, r.source,"
        " r.has_evidence FROM run r JOIN test t ON t.id = r.test_id"
        " ORDER BY t.name, r.recorded_at, r.run_key")
    for (test, key, commit, env_fp, environment, workload, overrides, duration, gpus, outcome,
         complete, at, source, has_evidence) in rows:
        env = json.loads(environment)
        if has_evidence and env_fp in listings:
            env["packages_list"] = listings[env_fp]
        line: dict[str, Any] = {
            "test": test, "run_key": key, "commit": commit, "env_fingerprint": env_fp,
            "environment": env, "workload": json.loads(workload),
            "overrides": None if overrides is None else json.loads(overrides),
            "duration_s": duration, "gpus": gpus, "outcome": outcome, "complete": bool(complete),
            "recorded_at": at, "source": source, "has_evidence": bool(has_evidence)}
        if current.get(test) == key:
            line["evidence"] = _evidence(store, test)
        yield test, json.dumps(line, sort_keys=True, separators=(",", ":"))


def _evidence(store: EvidenceStore, test: str) -> dict[str, Any]:
    conn = store.conn
    units = {uid: [checksum, sigs]
             for uid, (checksum, sigs) in sorted(store.evidence_of_test(test).items())}

    def pairs(table: str, key: str, value: str) -> dict[str, str]:
        return dict(sorted(conn.execute(
            f"SELECT x.{key}, x.{value} FROM {table} x JOIN test t ON t.id = x.test_id"
            " WHERE t.name = ?", (test,))))

    return {"units": units, "files": pairs("file_read", "path", "digest"),
            "sources": pairs("source", "path", "digest"),
            "distributions": pairs("dist_import", "name", "version")}


def export_store(store: EvidenceStore, out: Path, *, commit: str | None = None) -> Manifest:
    """Write ``store`` to ``out`` (atomically) and return its manifest.

    ``commit``: the commit the evidence describes (default: the newest evidence's).
    """
    digest = hashlib.sha256()
    runs = 0
    tests: set[str] = set()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as body:
        try:
            for test, line in _lines(store):
                data = (line + "\n").encode()
                digest.update(data)
                body.write(data)
                runs += 1
                tests.add(test)
        except (ValueError, TypeError, RecursionError) as exc:
            # A cell the store should have written as JSON is not (edited by hand, or
            # corrupt): one line, and nothing is written.
            raise StoreError(f"the store holds a malformed JSON cell ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); nothing exported") from exc
        if commit is None:
            row = store.conn.execute(
                "SELECT r.commit_sha FROM test t JOIN run r ON r.id = t.evidence_run"
                " ORDER BY r.recorded_at DESC, r.run_key DESC LIMIT 1").fetchone()
            commit = row[0] if row else None
        manifest = Manifest(commit, runs, len(tests), f"sha256:{digest.hexdigest()}")
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                                           mtime=0) as gz:
                gz.write((json.dumps(manifest.to_json(), sort_keys=True) + "\n").encode())
                body.seek(0)
                while chunk := body.read(1 << 20):
                    gz.write(chunk)
            os.replace(tmp, out)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return manifest


def read_manifest(path: Path) -> Manifest:
    """The header of an evidence file, once the whole file checked out (:func:`load_export`).

    Raises:
        StoreError: not an evidence file, another version, truncated or edited.
    """
    return load_export(path)[0]


def _open(path: Path) -> gzip.GzipFile:
    try:
        return gzip.GzipFile(path, "rb")
    except OSError as exc:
        raise StoreError(f"cannot read the evidence file {path} ({exc})") from exc


def _line(path: Path, f: gzip.GzipFile, read: int) -> bytes:
    """The next line of an evidence file (b"" at its end), ``read`` bytes having been read.

    Raises:
        StoreError: the line or the file expands past its cap.
    """
    raw = f.readline(MAX_LINE_BYTES + 1)
    if len(raw) > MAX_LINE_BYTES:
        raise StoreError(f"{path}: a line expands past {MAX_LINE_BYTES >> 20} MiB (a "
                         "decompression bomb?); nothing imported")
    if read + len(raw) > MAX_EXPORT_BYTES:
        raise StoreError(f"{path}: expands past {MAX_EXPORT_BYTES >> 20} MiB (a decompression "
                         "bomb?); nothing imported")
    return raw


def _header(path: Path, raw: bytes) -> Manifest:
    try:
        head = json.loads(raw)
    except (ValueError, OSError, EOFError, zlib.error, RecursionError) as exc:
        raise StoreError(f"{path} is not a FastCI evidence file ({exc})") from exc
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise StoreError(f"{path} is not a FastCI evidence file (no {FORMAT} header)")
    if head.get("version") != VERSION:
        raise StoreError(f"{path} is a {FORMAT} file of version {head.get('version')!r}; this "
                         f"FastCI reads version {VERSION}")
    try:
        return Manifest(head.get("commit"), int(head["runs"]), int(head["tests"]),
                        str(head["digest"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{path}: a malformed {FORMAT} header ({exc})") from exc


#: A run read from an evidence file, and whether it carries its test's evidence.
LoadedRun = tuple[RunEvidence, bool]


def load_export(path: Path) -> tuple[Manifest, list[LoadedRun]]:
    """Read and check a whole evidence file in one pass: its header, its digest, every run.

    Raises:
        StoreError: not a valid evidence file (nothing is imported from it).
    """
    try:
        with _open(path) as f:
            manifest = _header(path, _line(path, f, 0))
            digest = hashlib.sha256()
            runs: list[LoadedRun] = []
            size = 0
            while raw := _line(path, f, size):
                size += len(raw)
                digest.update(raw)
                line = json.loads(raw)
                if not isinstance(line, dict):
                    raise StoreError(f"{path}: run {len(runs) + 1} is a JSON "
                                     f"{type(line).__name__}, not an object; nothing imported")
                runs.append(_run(line))
    except StoreError:
        raise
    except RecursionError as exc:
        raise StoreError(f"{path}: JSON nested too deeply; nothing imported") from exc
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError,
            AttributeError) as exc:
        raise StoreError(f"{path}: unreadable evidence file ({type(exc).__name__}: "
                         f"{str(exc)[:200]}); nothing imported") from exc
    if f"sha256:{digest.hexdigest()}" != manifest.digest:
        raise StoreError(f"{path}: its content does not match its digest (truncated or edited); "
                         "nothing imported")
    if len(runs) != manifest.runs:
        raise StoreError(f"{path}: {len(runs)} runs, its header says {manifest.runs}; "
                         "nothing imported")
    return manifest, runs


def import_runs(store: EvidenceStore, runs: list[LoadedRun]) -> int:
    """Merge runs read by :func:`load_export` into ``store`` in one transaction; returns
    how many were new."""
    with store.transaction():
        # The runs with evidence in one batch: each posting list is written once.
        new = sum(store.ingest_many(run for run, has_evidence in runs if has_evidence))
        for run, has_evidence in runs:
            if not has_evidence:
                new += store.add_run(run)
    return new


def import_store(store: EvidenceStore, path: Path) -> tuple[Manifest, int]:
    """Merge the evidence file ``path`` into ``store``; returns its manifest and how many
    runs were new. The whole file is checked first: on any error nothing is written.

    Raises:
        StoreError: the file is not a valid evidence file (see :func:`load_export`).
    """
    manifest, runs = load_export(path)
    return manifest, import_runs(store, runs)


def _run(line: dict[str, Any]) -> tuple[RunEvidence, bool]:
    """A run line as :class:`RunEvidence` (units empty without evidence), and whether it
    carries the evidence its test is planned from."""
    evidence = line.get("evidence")
    units = {}
    extra: dict[str, Any] = {"files": {}, "sources": {}, "distributions": {}}
    if evidence is not None:
        units = {uid: (str(c), frozenset(str(s) for s in sigs))
                 for uid, (c, sigs) in evidence["units"].items()}
        extra = {k: {str(a): str(b) for a, b in evidence[k].items()}
                 for k in ("files", "sources", "distributions")}
    run = RunEvidence(
        test=str(line["test"]), run_key=str(line["run_key"]), outcome=str(line["outcome"]),
        complete=bool(line["complete"]), duration_s=float(line["duration_s"]),
        gpus=int(line["gpus"]), workload=dict(line["workload"]),
        recorded_at=float(line["recorded_at"]), env_fingerprint=str(line["env_fingerprint"]),
        overrides=None if line["overrides"] is None else dict(line["overrides"]),
        environment=dict(line["environment"]), commit=line["commit"], source=str(line["source"]),
        units=units, has_evidence=bool(line["has_evidence"]), **extra)
    return run, evidence is not None
