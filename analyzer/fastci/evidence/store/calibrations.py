"""The calibration store: what each test did at each rung of its workload ladder.

``fastci calibrate`` runs a test at several workloads between its full workload and
its floors (the *rungs*: :func:`fastci.plan.workload.ladder`) under the recorder,
and keeps per rung what the planner needs to choose a reduced workload safely
(:mod:`fastci.plan.reduce`): the measured cost, the outcome, and, per file, the
lines and arcs executed, per unit the checksum and the contexts it ran in.

It is a separate SQLite file (``.fastci/calibration.db`` by default), never the
evidence store: a rung run at a reduced workload must never make a plan think a
test or the code changed, nor stand in for the test's evidence. Rows hold JSON
(zlib-compressed), never pickles. A rung is replaced when the same test is
calibrated again at the same rung; finished rungs survive a killed calibration.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from fastci.evidence.store.postings import inflate
from fastci.errors import StoreError
from fastci.types import Checksum, ContextSig, RelPath, TestId, UnitId

DEFAULT_PATH = Path(".fastci/calibration.db")
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rung (
    test TEXT NOT NULL,
    rung TEXT NOT NULL,              -- "full", "floors", "train_iters=2", ...
    declaration TEXT NOT NULL,       -- declaration_digest() of the test when calibrated
    overrides TEXT NOT NULL,         -- JSON object: what the rung changed of the full workload
    commit_sha TEXT,
    duration_s REAL NOT NULL,
    gpus INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    complete INTEGER NOT NULL,
    recorded_at REAL NOT NULL,
    coverage BLOB NOT NULL,          -- zlib(JSON): lines, arcs, units, digests
    PRIMARY KEY (test, rung)
);
"""


def declaration_digest(decl: Any) -> str:
    """A digest of everything in a test's declaration that bounds a reduction.

    ``decl`` is a :class:`~fastci.plan.workload.ReductionDecl` (a ``DeclaredTest``,
    a ``TestDecl``, a pytest marker's ``Declaration``); a calibration made under
    another declaration is stale (its rungs may cross what the test now validates).
    """
    blob = json.dumps(declaration_spec(decl), sort_keys=True, separators=(",", ":"),
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def declaration_spec(decl: Any) -> dict[str, Any]:
    """The declaration as JSON-ready data: what :func:`declaration_digest` hashes.

    A rung keeps it, so a runner that cannot list declarations at plan time
    (pytest) can reduce from the declaration the test was calibrated under; the
    pytest plugin checks the plan's overrides against the live marker at run time.
    ``frozen`` undeclared and declared empty both read ``[]``.
    """
    frozen = getattr(decl, "frozen", None)
    return {"workload": dict(decl.workload or {}), "floors": dict(decl.floors),
            "frozen": sorted(frozen or ()),
            "scope": sorted(decl.scope), "constraints": list(decl.constraints),
            "check": getattr(decl, "check", None), "reference": getattr(decl, "reference", None),
            "gpus": int(getattr(decl, "gpus", 0) or 0)}


@dataclass(frozen=True)
class Rung:
    """One calibrated run of a test at one workload.

    Attributes:
        test: the test id (Bazel label or pytest node id).
        rung: the rung's name (``full``, ``floors``, ``dim=value[,dim=value]``).
        declaration: :func:`declaration_digest` of the test when it ran.
        overrides: what the rung changed of the full workload (``{}`` at ``full``).
        commit: the commit it ran at (``dirty:<tree>`` from a modified tree).
        duration_s, gpus: the measured cost (GPU-seconds = duration × max(gpus, 1)).
        outcome: ``passed``, ``failed``, ... as the runner reported it.
        complete: every trace of the run stopped cleanly.
        lines: executed lines per repo-relative file.
        arcs: executed arcs (from line, to line; negative = entry/exit) per file.
        units: per executed unit, its checksum and the contexts it ran in.
        digests: sha256 of each Python file the run executed, as it was on disk.
        spec: the declaration itself (:func:`declaration_spec`; ``{}`` when not kept).
    """

    test: TestId
    rung: str
    declaration: str
    overrides: Mapping[str, Any]
    commit: str | None
    duration_s: float
    gpus: int
    outcome: str
    complete: bool
    recorded_at: float
    lines: Mapping[RelPath, frozenset[int]] = field(default_factory=dict)
    arcs: Mapping[RelPath, frozenset[tuple[int, int]]] = field(default_factory=dict)
    units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]] = field(default_factory=dict)
    digests: Mapping[RelPath, str] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gpu_s(self) -> float:
        """The rung's cost in GPU-seconds (a CPU-only test counts its wall time)."""
        return self.duration_s * max(self.gpus, 1)

    @property
    def usable(self) -> bool:
        """Passed and recorded completely: the only rungs a plan may choose."""
        return self.outcome == "passed" and self.complete


def _pack(r: Rung) -> bytes:
    data = {"lines": {p: sorted(v) for p, v in r.lines.items()},
            "arcs": {p: sorted([a, b] for a, b in v) for p, v in r.arcs.items()},
            "units": {u: [c, sorted(ctx)] for u, (c, ctx) in r.units.items()},
            "digests": dict(r.digests), "spec": dict(r.spec)}
    return zlib.compress(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


#: The most a rung's stored coverage may expand to; a bigger blob is corrupt (the rung
#: is not used, so its test runs at full workload).
MAX_COVERAGE_BYTES = 256 << 20


def _unpack(blob: bytes) -> dict[str, Any]:
    data = json.loads(inflate(blob, MAX_COVERAGE_BYTES, "a rung's coverage").decode())
    if not isinstance(data, dict):
        raise ValueError("coverage is not a JSON object")
    return data


class CalibrationStore:
    """Rungs by test, in a SQLite file of their own (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path, *, create: bool = False) -> CalibrationStore:
        """Open (or, with ``create``, create) the store at ``path``.

        Raises:
            StoreError: absent (without ``create``), unreadable, corrupt, or of
                another schema version -- one line saying which.
        """
        if not create and not path.is_file():
            raise StoreError(f"no calibration at {path}; run `fastci calibrate`")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                conn.close()
                raise StoreError(f"calibration store {path} has schema {row[0]}, this FastCI "
                                 f"reads {SCHEMA_VERSION}: calibrate again into a new file")
        except sqlite3.Error as exc:
            raise StoreError(f"calibration store {path} is unreadable: {exc}") from exc
        return cls(conn, path)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> CalibrationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, rung: Rung) -> None:
        """Store ``rung``, replacing the same test's rung of the same name."""
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO rung VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (rung.test, rung.rung, rung.declaration,
                 json.dumps(dict(rung.overrides), sort_keys=True), rung.commit,
                 float(rung.duration_s), int(rung.gpus), rung.outcome, int(rung.complete),
                 float(rung.recorded_at), _pack(rung)))
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write calibration store {self.path}: {exc}") from exc

    def tests(self) -> list[TestId]:
        """Every calibrated test, sorted."""
        return [r[0] for r in self._query("SELECT DISTINCT test FROM rung ORDER BY test", ())]

    def names(self, test: TestId) -> dict[str, str]:
        """Rung name -> declaration digest of ``test``'s stored rungs (cheap: no coverage)."""
        return {r[0]: r[1] for r in self._query(
            "SELECT rung, declaration FROM rung WHERE test = ?", (test,))}

    def rungs(self, test: TestId, name: str | None = None) -> list[Rung]:
        """``test``'s rungs (only the one called ``name`` when given), cheapest first; a
        rung whose row is corrupt is left out. Each rung's coverage is decompressed, so
        ask for one rung by name when one is all that is needed."""
        out = []
        rows = self._query("SELECT * FROM rung WHERE test = ?", (test,)) if name is None else \
            self._query("SELECT * FROM rung WHERE test = ? AND rung = ?", (test, name))
        for row in rows:
            try:
                out.append(_rung(row))
            except (ValueError, TypeError, KeyError, zlib.error) as exc:
                import logging

                logging.getLogger(__name__).warning(
                    "calibration of %s at rung %s is unreadable (%s): not used", test, row[1], exc)
        return sorted(out, key=lambda r: (r.gpu_s, r.rung))

    def _query(self, sql: str, args: Iterable[Any]) -> list[tuple[Any, ...]]:
        try:
            return list(self._conn.execute(sql, tuple(args)))
        except sqlite3.Error as exc:
            raise StoreError(f"calibration store {self.path} is unreadable: {exc}") from exc


def _rung(row: tuple[Any, ...]) -> Rung:
    test, name, decl, overrides, commit, dur, gpus, outcome, complete, at, blob = row
    data = _unpack(blob)
    over = json.loads(overrides)
    if not isinstance(over, dict):
        raise ValueError("overrides is not a JSON object")
    return Rung(
        test=test, rung=name, declaration=decl, overrides=over, commit=commit,
        duration_s=float(dur), gpus=int(gpus), outcome=str(outcome), complete=bool(complete),
        recorded_at=float(at),
        lines={p: frozenset(int(x) for x in v) for p, v in data.get("lines", {}).items()},
        arcs={p: frozenset((int(a), int(b)) for a, b in v)
              for p, v in data.get("arcs", {}).items()},
        units={u: (str(c), frozenset(str(x) for x in ctx))
               for u, (c, ctx) in data.get("units", {}).items()},
        digests={p: str(d) for p, d in data.get("digests", {}).items()},
        spec=data["spec"] if isinstance(data.get("spec"), dict) else {})
