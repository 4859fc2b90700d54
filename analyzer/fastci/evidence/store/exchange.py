"""Publishing an evidence store between CI jobs: one canonical, compact file.

GPU CI records on many runners. Each runner ingests its own traces into its own
store; a main-branch job merges the runners' exports into one store and publishes it
as an artifact; a PR job imports the newest one and plans. :func:`export_store` writes
``fastci-evidence`` files, :func:`load_export` checks one whole and :func:`import_runs`
merges its runs into a store.

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

Imported runs are sanity-checked first (:func:`import_runs`; one warning line per kind
and file): a run dated more than :data:`FUTURE_SLACK_S` past this machine's clock is not
imported (as the newest recording it would win over every genuine one to come), and a
passing run whose evidence is empty, of a test recorded with evidence, is kept as
history only (it would make the test reach nothing).

Two versions of one run (the same run key, different content) are a conflict: reported
in one line, and resolved by :func:`merge_versions`, a function of the set of versions,
so any import order gives the same store.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from fastci.errors import StoreError
from fastci.evidence.store.db import EvidenceStore, RunEvidence
from fastci.types import is_failure

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


def _lines(store: EvidenceStore, keys: Sequence[str] | None = None
           ) -> Iterator[tuple[str, str]]:
    """The canonical run lines of ``store``, sorted, each with its test (only the runs of
    ``keys``, when given)."""
    conn = store.conn
    where, args = "", tuple(keys or ())
    if keys is not None:
        where = f" WHERE r.run_key IN ({','.join('?' * len(args))})"
    current = dict(conn.execute("SELECT t.name, r.run_key FROM test t JOIN run r"
                                " ON r.id = t.evidence_run"))
    listings = dict(conn.execute("SELECT fingerprint, packages_list FROM env_listing"))
    rows = conn.execute(
        "SELECT t.name, r.run_key, r.commit_sha, r.env_fingerprint, r.environment, r.workload,"
        " r.overrides, r.duration_s, r.gpus, r.outcome, r.complete, r.recorded_at, r.source,"
        f" r.has_evidence FROM run r JOIN test t ON t.id = r.test_id{where}"
        " ORDER BY t.name, r.recorded_at, r.run_key", args)
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


#: A run dated more than this past the importing machine's clock is not imported
#: (allows for clock skew between runners).
FUTURE_SLACK_S = 24 * 3600.0


@dataclass(frozen=True)
class ImportReport:
    """What an import did: new runs, and one line per warning and per conflict."""

    new: int
    warnings: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()


def _meta(run: RunEvidence) -> dict[str, Any]:
    """A run's metadata as compared between versions (the package listing, stored
    once per environment and exported only with evidence, is left out)."""
    env = {k: v for k, v in run.environment.items() if k != "packages_list"}
    return {"test": run.test, "run_key": run.run_key, "commit": run.commit,
            "env_fingerprint": run.env_fingerprint, "environment": env,
            "workload": dict(run.workload),
            "overrides": None if run.overrides is None else dict(run.overrides),
            "duration_s": run.duration_s, "gpus": run.gpus, "outcome": run.outcome,
            "complete": run.complete, "recorded_at": run.recorded_at, "source": run.source,
            "has_evidence": run.has_evidence}


def _evidence_of(run: RunEvidence) -> dict[str, Any]:
    return {"units": {u: [c, sorted(sigs)] for u, (c, sigs) in sorted(run.units.items())},
            "files": dict(sorted(run.files.items())),
            "sources": dict(sorted(run.sources.items())),
            "distributions": dict(sorted(run.distributions.items()))}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()


def _same(a: LoadedRun, b: LoadedRun) -> bool:
    """Whether two versions of a run agree: the same metadata, and the same evidence
    where both carry it (an export carries a run's evidence only while it is its test's
    newest recording: carried in one and not the other is no conflict)."""
    if _meta(a[0]) != _meta(b[0]):
        return False
    return not (a[1] and b[1]) or _evidence_of(a[0]) == _evidence_of(b[0])


def merge_versions(versions: Iterable[LoadedRun]) -> LoadedRun:
    """One run out of several versions of it, whatever order they come in.

    The metadata is the first version by (a failure first, then incomplete, then the
    sha256 of the metadata): the safe side, then a total order on content. The evidence
    is the carried evidence with the most units (the widest selection), ties by the
    sha256 of the evidence; carried when any version carries it. Both are minima of
    total orders over the versions, so merging is commutative and associative: any
    import order gives the same run.
    """
    vs = list(versions)
    meta = min(vs, key=lambda v: (not is_failure(v[0].outcome), v[0].complete,
                                  _digest(_meta(v[0]))))[0]
    carriers = [v[0] for v in vs if v[1]]
    if not carriers:
        return meta, False
    ev = min(carriers, key=lambda r: (-len(r.units), _digest(_evidence_of(r))))
    return replace(meta, units=ev.units, files=ev.files, sources=ev.sources,
                   distributions=ev.distributions), True


def _differs(a: RunEvidence, b: RunEvidence) -> str:
    """What two versions of a run disagree on, for the conflict line."""
    ma, mb = _meta(a), _meta(b)
    fields = [k for k in sorted(ma) if ma[k] != mb[k]]
    if fields:
        return ", ".join(f"{k} {ma[k]!r} vs {mb[k]!r}" if k in ("outcome", "complete", "commit")
                         else k for k in fields)
    return "evidence"


def _sane(store: EvidenceStore, runs: list[LoadedRun], where: str, now: float
          ) -> tuple[list[LoadedRun], list[str]]:
    """``runs`` without those dated in the future, passing runs with empty evidence kept
    as history only when their test has evidence; and one warning line per kind."""
    future = [r for r, _ in runs if r.recorded_at > now + FUTURE_SLACK_S]
    kept = [(r, c) for r, c in runs if r.recorded_at <= now + FUTURE_SLACK_S]
    warnings = []
    if future:
        latest = max(r.recorded_at for r in future)
        warnings.append(
            f"{where}: {len(future)} run(s) dated in the future (up to {_when(latest)}; this "
            f"machine's clock says {_when(now)}): not "
            "imported (the newest recording wins: they would hide every recording to come)")
    with_units = {r.test for r, c in kept if c and r.units}
    empty = [r for r, c in kept if c and not r.units and r.outcome == "passed"]
    hollow = {r.run_key for r in empty
              if r.test in with_units or store.evidence_of_test(r.test)}
    if hollow:
        tests = sorted({r.test for r in empty if r.run_key in hollow})
        warnings.append(
            f"{where}: {len(hollow)} passing run(s) with empty evidence, of test(s) recorded "
            f"with evidence ({', '.join(tests[:3])}{' ...' if len(tests) > 3 else ''}): kept as "
            "history, not as their evidence")
        kept = [(replace(r, units={}, files={}, sources={}, distributions={},
                         has_evidence=False), False) if r.run_key in hollow else (r, c)
                for r, c in kept]
    return kept, warnings


def _when(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:g} s after 1970"


def stored_versions(store: EvidenceStore, keys: Iterable[str]) -> dict[str, LoadedRun]:
    """The runs of ``keys`` the store holds, as :func:`load_export` would read them from
    its export (evidence carried for a run that holds its test's evidence)."""
    out: dict[str, LoadedRun] = {}
    wanted = sorted(set(keys))
    for i in range(0, len(wanted), 500):
        for _, line in _lines(store, wanted[i:i + 500]):
            run = _run(json.loads(line))
            out[run[0].run_key] = run
    return out


def import_runs(store: EvidenceStore, runs: list[LoadedRun], *, where: str = "import",
                now: float | None = None) -> ImportReport:
    """Merge runs read by :func:`load_export` into ``store`` in one transaction.

    The runs are sanity-checked first (see the module docstring). A run whose key the
    store holds with other content is a conflict: both versions are merged
    (:func:`merge_versions`) and the merged run replaces the stored one when it differs.
    ``where`` names the source in warning and conflict lines.
    """
    runs, warnings = _sane(store, runs, where, time.time() if now is None else now)
    by_key: dict[str, list[LoadedRun]] = {}
    for run in runs:
        by_key.setdefault(run[0].run_key, []).append(run)
    conflicts: list[str] = []
    stored = stored_versions(store, by_key)
    merged: list[LoadedRun] = []
    replaced: list[str] = []
    for key, versions in sorted(by_key.items()):
        have = stored.get(key)
        every = versions + ([have] if have is not None else [])
        first = every[0]
        disagree = [v for v in every[1:] if not _same(first, v)]
        if not disagree:
            merged.append(first if have is None else have)
            continue
        winner = merge_versions(every)
        other = "the store" if have is not None else where
        conflicts.append(
            f"{where}: conflict: run {key} of {first[0].test} differs from {other} "
            f"({_differs(first[0], disagree[0][0])}): merged the same way in any order "
            f"(outcome {winner[0].outcome!r}{', incomplete' if not winner[0].complete else ''})")
        if have is not None and not (_same(winner, have) and winner[1] == have[1]):
            replaced.append(key)
        merged.append(winner)
    with store.transaction():
        for key in replaced:  # the merged version is ingested in its place
            store.conn.execute("DELETE FROM run WHERE run_key = ?", (key,))
        fresh = [r for r in merged if r[0].run_key not in stored or r[0].run_key in replaced]
        # The runs with evidence in one batch: each posting list is written once.
        new = sum(store.ingest_many(r for r, carried in fresh if carried))
        for r, carried in fresh:
            if not carried:
                new += store.add_run(r)
    return ImportReport(new - len(replaced), tuple(warnings), tuple(conflicts))


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
