"""The evidence arrays' write side: many recordings merged with one posting update each.

:meth:`fastci.evidence.store.db.EvidenceStore.ingest_many` decides per run, in order,
whether it is its test's newest recording (as one :meth:`~EvidenceStore.ingest`
after another would); for each one that is, :class:`EvidenceBatch` writes the
test's row of ``evidence`` at once and notes which (unit version, test) pairs
came and went. :meth:`EvidenceBatch.flush` nets those out (a pair added by one
run and dropped by a newer one in the same batch is no change) and rewrites each
touched posting list once: a full-suite recording rewrites a posting list once,
not once per test that executed the unit, and a recording that executed what the
held evidence did touches no posting list at all.

Ids live in caches local to one batch (one transaction): a rolled-back
transaction leaves no cached id behind.
"""

from __future__ import annotations

import logging
import sqlite3
from operator import itemgetter
from typing import Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import numpy.typing as npt

from fastci.evidence.store import postings
from fastci.evidence.store.columns import UnitColumns, UnitTable
from fastci.types import Checksum, ContextSig, UnitId

LOG = logging.getLogger(__name__)

_CHUNK = 500
#: From this many unit versions to intern at once (a full-suite recording's first chunk),
#: all are read in one pass rather than 500 units a query (measured: ~5 s -> ~1 s for
#: 505,000 versions).
SCAN_VERSIONS_FROM = 50_000
_T = TypeVar("_T")
_K = TypeVar("_K", str, bytes)
_first = itemgetter(0)
_second = itemgetter(1)


def chunks(items: Sequence[_T], size: int = _CHUNK) -> Iterator[Sequence[_T]]:
    """``items`` in slices of at most ``size`` (SQLite's bound-parameter limit)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def pack_ids(ids: Iterable[int]) -> bytes:
    """Context ids as sorted distinct little-endian uint32 (a context set's key)."""
    return np.asarray(sorted(set(ids)), dtype="<u4").tobytes()


def unpack_ids(blob: bytes) -> list[int]:
    """Inverse of :func:`pack_ids`."""
    return [int(i) for i in np.frombuffer(blob, dtype="<u4")]


def _pairs(vids: postings.Ids, tid: int) -> npt.NDArray[np.uint64]:
    """(unit version, test) pairs as one sortable key each: version high, test low."""
    return (vids.astype(np.uint64) << np.uint64(32)) | np.uint64(tid)


def _sorted_union(a: npt.NDArray[np.uint64], b: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The sorted distinct keys of sorted ``a`` and ``b`` (np.union1d hashes in numpy 2:
    slower). The stable sort is timsort: two sorted runs merge in one linear pass
    (quicksort took 4 s for 55 M keys, this 0.1 s)."""
    keys = np.concatenate([a, b])
    keys.sort(kind="stable")
    if not len(keys):
        return keys
    out: npt.NDArray[np.uint64] = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return out


def _present(n: int, parts: Sequence[postings.Ids]) -> npt.NDArray[np.int64]:
    """The distinct values below ``n`` in ``parts``, ascending (a mask: np.unique hashes
    in numpy 2, slower by far)."""
    mask = np.zeros(n, dtype=bool)
    for part in parts:
        mask[part] = True
    return np.flatnonzero(mask)


class EvidenceBatch:
    """The evidence rows and posting-list changes of one batch of recordings."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.pending = 0  # pairs added or dropped since the last flush
        # Test rowid -> its evidence row's packed versions and context sets as replace()
        # left them (None: no row), and the rows to write (None: delete) at write_rows().
        self.rows: dict[int, tuple[bytes, bytes] | None] = {}
        self.writes: dict[int, tuple[int, bytes, bytes] | None] = {}
        self._reset()

    def _reset(self) -> None:
        # (uid, checksum) -> unit version id; frozenset of sigs -> context set id.
        self.versions: dict[tuple[UnitId, Checksum], int] = {}
        # uid -> one version id of :attr:`versions` and its checksum: most units have one
        # version, so a recording's versions are found by its unit ids (str keys, hashed
        # once) with C-level passes (:meth:`_vids`).
        self.primary: dict[UnitId, int] = {}
        self.primary_checksum: dict[UnitId, Checksum] = {}
        self.ctxsets: dict[frozenset[ContextSig], int] = {}
        self.contexts: dict[ContextSig, int] = {}
        self.units: dict[UnitId, int] = {}
        # id(table) -> (the table, its rows' version ids, its set rows' context-set ids;
        # 0: not interned yet): a table's rows are interned once per batch.
        self.tables: dict[int, tuple[UnitTable, npt.NDArray[np.int64],
                                     npt.NDArray[np.int64]]] = {}
        # Version id -> (uid, checksum), and as arrays: version id -> unit rowid, and unit
        # rowid -> the version the newest winning recording executed (0: none), whose
        # checksum becomes unit.checksum (for display) at flush().
        self.vinfo: dict[int, tuple[UnitId, Checksum]] = {}
        self.v2u: npt.NDArray[np.uint32] = np.zeros(0, np.uint32)
        self.newest: npt.NDArray[np.uint32] = np.zeros(0, np.uint32)
        self.created: list[int] = []
        self.added: list[npt.NDArray[np.uint64]] = []
        self.dropped: list[npt.NDArray[np.uint64]] = []
        self.pending = 0

    # ------------------------------------------------------------ interning

    def _unit_ids(self, uids: Iterable[UnitId]) -> None:
        """Fill :attr:`units` for ``uids`` (rows are made for new ones)."""
        missing = sorted({u for u in uids if u not in self.units})
        for chunk in chunks(missing):
            q = "SELECT uid, id FROM unit WHERE uid IN (%s)" % ",".join("?" * len(chunk))
            self.units.update(self.conn.execute(q, chunk))
        new = [u for u in missing if u not in self.units]
        if new:
            self.conn.executemany("INSERT INTO unit (uid, path, checksum) VALUES (?,?,'')",
                                  ((uid, uid.partition("::")[0]) for uid in new))
            for chunk in chunks(new):
                q = "SELECT uid, id FROM unit WHERE uid IN (%s)" % ",".join("?" * len(chunk))
                self.units.update(self.conn.execute(q, chunk))

    def _version_ids(self, keys: list[tuple[UnitId, Checksum]]) -> None:
        """Fill :attr:`versions` for ``keys`` (rows with empty posting lists for new ones)."""
        missing = sorted({k for k in keys if k not in self.versions})
        if not missing:
            return
        seen: list[int] = []  # every version entered into the caches
        if len(missing) >= SCAN_VERSIONS_FROM:  # a full-suite recording: one pass over all
            rows: Iterable[tuple[UnitId, int, Checksum, int]] = self.conn.execute(
                "SELECT u.uid, u.id, v.checksum, v.id FROM unit_version v"
                " JOIN unit u ON u.id = v.unit_id")
        else:
            self._unit_ids(u for u, _ in missing)
            names = {self.units[u]: u for u, _ in missing}
            rows = ((names[unit_id], unit_id, checksum, vid)
                    for chunk in chunks(sorted(names))
                    for unit_id, checksum, vid in self.conn.execute(
                        "SELECT unit_id, checksum, id FROM unit_version WHERE unit_id IN (%s)"
                        % ",".join("?" * len(chunk)), chunk))
        for uid, unit_id, checksum, vid in rows:
            self.units[uid] = unit_id
            self.versions[(uid, checksum)] = vid
            self.primary[uid] = vid
            self.primary_checksum[uid] = checksum
            self.vinfo[vid] = (uid, checksum)
            seen.append(vid)
        self._unit_ids(u for u, _ in missing if u not in self.units)  # units without versions
        for key in missing:
            if key not in self.versions:
                cur = self.conn.execute("INSERT INTO unit_version (unit_id, checksum, tests)"
                                        " VALUES (?,?,x'')", (self.units[key[0]], key[1]))
                self.versions[key] = vid = int(cur.lastrowid or 0)
                self.primary[key[0]] = vid
                self.primary_checksum[key[0]] = key[1]
                self.vinfo[vid] = key
                self.created.append(vid)
                seen.append(vid)
        self._map_versions(seen)

    def _map_versions(self, vids: list[int]) -> None:
        """Enter the unit rowids of the versions ``vids`` into :attr:`v2u`."""
        if not vids:
            return
        top = max(vids) + 1
        if top > len(self.v2u):
            self.v2u = np.concatenate([self.v2u, np.zeros(top - len(self.v2u), np.uint32)])
        self.v2u[np.array(vids, dtype=np.int64)] = [self.units[self.vinfo[v][0]] for v in vids]

    def _intern(self, table: str, col: str, keys: list[_K], cache: dict[_K, int]) -> None:
        """Fill ``cache`` (key -> id in ``table``, ``col`` the key) for ``keys``, rows made
        for new ones (in the order of ``keys``)."""
        missing = [k for k in dict.fromkeys(keys) if k not in cache]
        query = f"SELECT {col}, id FROM {table} WHERE {col} IN (%s)"
        for chunk in chunks(missing):
            cache.update(self.conn.execute(query % ",".join("?" * len(chunk)), chunk))
        new = [k for k in missing if k not in cache]
        if new:
            self.conn.executemany(f"INSERT INTO {table} ({col}) VALUES (?)", ((k,) for k in new))
            for chunk in chunks(new):
                cache.update(self.conn.execute(query % ",".join("?" * len(chunk)), chunk))

    def prepare(self, recordings: Sequence[Mapping[UnitId, tuple[Checksum,
                                                                   frozenset[ContextSig]]]],
                tids: Iterable[int]) -> list[tuple[Sequence[int] | None, Sequence[int]]]:
        """Intern at once what :meth:`replace` will need for ``recordings`` (their unit
        versions and context sets) and read the evidence rows of tests ``tids``: a few
        set-based queries instead of some per recording. Returns each recording's
        unit-version ids and context-set ids (in its units' order), for :meth:`replace`."""
        found: list[list[int] | None] = []
        found_sets: list[list[int | None]] = []
        missing: list[tuple[UnitId, Checksum]] = []
        sets: set[frozenset[ContextSig]] = set()
        versions, ctxsets = self.versions, self.ctxsets
        self._intern_columns([u for u in recordings if isinstance(u, UnitColumns)])
        for units in recordings:  # per unit only C-level passes: most are known
            if isinstance(units, UnitColumns):
                found.append([])
                found_sets.append([])
                continue
            vids = self._vids(units)
            found.append(vids)
            if vids is None:
                missing += [k for k in zip(units, map(_first, units.values()))
                            if k not in versions]
            these = list(map(ctxsets.get, map(_second, units.values())))
            found_sets.append(these)
            if None in these:
                sets.update(s for s in map(_second, units.values()) if s not in ctxsets)
        if missing:
            self._version_ids(missing)
        if sets:
            self._intern_sets(sets)
        wanted = sorted({t for t in tids if t not in self.rows})
        self.rows.update((t, None) for t in wanted)
        for chunk in chunks(wanted):
            self.rows.update((t, (v, c)) for t, v, c in self.conn.execute(
                "SELECT test_id, versions, ctxsets FROM evidence WHERE test_id IN (%s)"
                % ",".join("?" * len(chunk)), chunk))
        return [self._column_ids(units) if isinstance(units, UnitColumns) else
                (vids if vids is not None else self._vids(units),
                 these if None not in these else  # type: ignore[misc]
                 list(map(ctxsets.__getitem__, map(_second, units.values()))))
                for vids, these, units in zip(found, found_sets, recordings)]

    def _intern_columns(self, recordings: Sequence[UnitColumns]) -> None:
        """Intern the unit versions and context sets ``recordings`` use that their
        tables' rows do not have ids for yet (each row once per batch)."""
        by_table: dict[int, list[UnitColumns]] = {}
        for cols in recordings:
            by_table.setdefault(id(cols.table), []).append(cols)
        for key, group in by_table.items():
            table = group[0].table
            _, vids, sets = self.tables.get(key, (table, np.zeros(0, np.int64),
                                                  np.zeros(0, np.int64)))
            if len(vids) < len(table.keys):
                vids = np.concatenate([vids, np.zeros(len(table.keys) - len(vids), np.int64)])
            if len(sets) < len(table.sets):
                sets = np.concatenate([sets, np.zeros(len(table.sets) - len(sets), np.int64)])
            rows = _present(len(vids), [c.rows for c in group])
            new = rows[vids[rows] == 0].tolist()
            if new:
                keys = [table.keys[r] for r in new]
                self._version_ids(keys)
                vids[new] = [self.versions[k] for k in keys]
            set_rows = _present(len(sets), [c.sets for c in group])
            new = set_rows[sets[set_rows] == 0].tolist()
            if new:
                frozen = [table.sets[r] for r in new]
                self._intern_sets(set(frozen))
                sets[new] = [self.ctxsets[f] for f in frozen]
            self.tables[key] = (table, vids, sets)

    def _column_ids(self, units: UnitColumns) -> tuple[postings.Ids, postings.Ids]:
        """The version and context-set ids of ``units`` (interned by :meth:`_intern_columns`)."""
        _, vids, sets = self.tables[id(units.table)]
        return vids[units.rows].astype(np.uint32), sets[units.sets].astype(np.uint32)

    def _intern_sets(self, sets: set[frozenset[ContextSig]]) -> None:
        """Fill :attr:`ctxsets` for ``sets`` (rows made for new ones)."""
        new_sets = sorted((s for s in sets if s not in self.ctxsets), key=sorted)
        if not new_sets:
            return
        self._intern("context", "sig", sorted({c for s in new_sets for c in s}), self.contexts)
        packed = {s: pack_ids(self.contexts[c] for c in s) for s in new_sets}
        ids: dict[bytes, int] = {}
        self._intern("ctxset", "ids", list(packed.values()), ids)
        self.ctxsets.update((s, ids[p]) for s, p in packed.items())

    def _vids(self, units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]]
              ) -> list[int] | None:
        """The version ids of ``units`` (in their order) as :attr:`versions` holds them;
        None when some is not interned."""
        # (an unknown unit's None never equals a checksum)
        if list(map(self.primary_checksum.get, units)) == list(map(_first, units.values())):
            return list(map(self.primary.__getitem__, units))
        vids = list(map(self.versions.get, zip(units, map(_first, units.values()))))
        return None if None in vids else vids  # type: ignore[return-value]

    def write_rows(self) -> None:
        """Write the evidence rows :meth:`replace` made since the last call."""
        self.conn.executemany("DELETE FROM evidence WHERE test_id = ?",
                              [(t,) for t, row in self.writes.items() if row is None])
        self.conn.executemany("INSERT OR REPLACE INTO evidence (test_id, pairs, versions, ctxsets)"
                              " VALUES (?,?,?,?)",
                              [(t, *row) for t, row in self.writes.items() if row is not None])
        self.writes.clear()
        self.rows.clear()

    def _context_id(self, sig: ContextSig) -> int:
        got = self.contexts.get(sig)
        if got is None:
            row = self.conn.execute("SELECT id FROM context WHERE sig = ?", (sig,)).fetchone()
            if row is None:
                row = (self.conn.execute("INSERT INTO context (sig) VALUES (?)",
                                         (sig,)).lastrowid,)
            self.contexts[sig] = got = int(row[0])
        return got

    def _ctxset_id(self, sigs: frozenset[ContextSig]) -> int:
        got = self.ctxsets.get(sigs)
        if got is None:
            key = pack_ids(self._context_id(s) for s in sigs)
            row = self.conn.execute("SELECT id FROM ctxset WHERE ids = ?", (key,)).fetchone()
            if row is None:
                row = (self.conn.execute("INSERT INTO ctxset (ids) VALUES (?)",
                                         (key,)).lastrowid,)
            self.ctxsets[sigs] = got = int(row[0])
        return got

    # ------------------------------------------------------------ writing

    def _ids_of(self, units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]]
                ) -> tuple[Sequence[int], Sequence[int]]:
        """The unit-version and context-set ids of ``units``, interned as needed (for
        :meth:`replace` without :meth:`prepare`'s: a batch of one, or after a flush)."""
        if isinstance(units, UnitColumns):
            self._intern_columns([units])
            return self._column_ids(units)  # type: ignore[return-value]
        values = list(units.values())
        vids = self._vids(units)
        if vids is None:
            keys = list(zip(units, map(_first, values)))
            self._version_ids(keys)
            vids = [self.versions[k] for k in keys]
        got = list(map(self.ctxsets.get, map(_second, values)))
        sets = [self._ctxset_id(v[1]) for v in values] if None in got else got
        return vids, sets  # type: ignore[return-value]

    def replace(self, tid: int, units: Mapping[UnitId, tuple[Checksum, frozenset[ContextSig]]],
                vids: Sequence[int] | None = None, sets: Sequence[int] | None = None) -> None:
        """Make ``units`` the held evidence of test ``tid`` (its row is written at
        :meth:`write_rows`, the posting lists at :meth:`flush`); ``vids`` and ``sets``: its
        unit-version and context-set ids as :meth:`prepare` gave them."""
        if vids is None or sets is None:
            vids, sets = self._ids_of(units)
        new = postings.as_ids(vids)
        order = np.argsort(new, kind="stable")
        new = new[order]
        # The newest recording's checksum wins, an unknown ('') one too.
        rows = self.v2u[new]
        if len(rows) and int(rows.max()) >= len(self.newest):
            grow = int(rows.max()) + 1 - len(self.newest)
            self.newest = np.concatenate([self.newest, np.zeros(grow, np.uint32)])
        self.newest[rows] = new
        if tid not in self.rows:
            got = self.conn.execute("SELECT versions, ctxsets FROM evidence WHERE test_id = ?",
                                    (tid,)).fetchone()
            self.rows[tid] = (got[0], got[1]) if got else None
        held = self.rows[tid]
        set_ids = postings.as_ids(sets)[order]
        old = postings.decode(held[0]) if held is not None else postings.EMPTY
        # The row is written at write_rows() (replace() reads it from self.rows till then).
        if held is not None and len(new) and np.array_equal(old, new):
            # The same units, the same checksums: no posting list changes, and no row to
            # write either when the contexts are the same too (most of a re-recording:
            # compressing rows only to find them equal was most of the batch's zlib).
            if not np.array_equal(postings.decode(held[1]), set_ids):
                ctx = postings.encode_ids(set_ids)
                self.writes[tid] = (len(new), held[0], ctx)
                self.rows[tid] = (held[0], ctx)
            return
        packed, ctx = postings.encode_sorted(new), postings.encode_ids(set_ids)
        self.writes[tid] = (len(new), packed, ctx) if len(new) else None
        self.rows[tid] = (packed, ctx) if len(new) else None
        gone = np.setdiff1d(old, new, assume_unique=True)
        came = np.setdiff1d(new, old, assume_unique=True)
        if len(gone):
            self.dropped.append(_pairs(gone, tid))
        if len(came):
            self.added.append(_pairs(came, tid))
        self.pending += len(gone) + len(came)

    def flush(self) -> None:
        """Write the units' newest checksums and each touched posting list once."""
        self._write_checksums()
        added = np.concatenate(self.added) if self.added else np.zeros(0, np.uint64)
        dropped = np.concatenate(self.dropped) if self.dropped else np.zeros(0, np.uint64)
        keys = np.concatenate([added, dropped])
        signs = np.concatenate([np.ones(len(added), np.int8), -np.ones(len(dropped), np.int8)])
        order = np.argsort(keys, kind="stable")
        keys, signs = keys[order], signs[order]
        # (not np.unique: numpy 2 hashes, slower by far than a pass over sorted keys)
        start = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) \
            if len(keys) else np.zeros(0, np.int64)
        uniq = keys[start]
        # A pair can come and go several times in one batch: what counts is the net.
        net = np.add.reduceat(signs.astype(np.int32), start) if len(keys) else \
            np.zeros(0, np.int32)
        plus, minus = uniq[net > 0], uniq[net < 0]
        touched = np.union1d(plus >> np.uint64(32), minus >> np.uint64(32)).astype(np.int64)
        empty = self._update_postings(touched, plus, minus)
        gone = sorted(set(empty) | set(self.created))
        for chunk in chunks(gone):
            self.conn.execute("DELETE FROM unit_version WHERE length(tests) = 0 AND id IN (%s)"
                              % ",".join("?" * len(chunk)), chunk)
        LOG.debug("flushed %d pair changes into %d posting lists", len(plus) + len(minus),
                  len(touched))
        self._reset()

    def _write_checksums(self) -> None:
        items = sorted(self.vinfo[v] for v in self.newest[np.flatnonzero(self.newest)].tolist())
        self._unit_ids(u for u, _ in items)
        held: dict[int, str] = {}
        ids = sorted(self.units[u] for u, _ in items)
        for chunk in chunks(ids):
            held.update(self.conn.execute("SELECT id, checksum FROM unit WHERE id IN (%s)"
                                          % ",".join("?" * len(chunk)), chunk))
        self.conn.executemany("UPDATE unit SET checksum = ? WHERE id = ?",
                              [(c, self.units[u]) for u, c in items
                               if held.get(self.units[u]) != c])

    def _update_postings(self, touched: npt.NDArray[np.int64], plus: npt.NDArray[np.uint64],
                         minus: npt.NDArray[np.uint64]) -> list[int]:
        """Apply the net pair changes to the posting lists of ``touched`` versions (one
        merge of sorted arrays for all of them); return the versions left without a test."""
        ids = touched.tolist()
        rows: list[tuple[int, bytes]] = []
        for chunk in chunks(ids):
            rows += self.conn.execute("SELECT id, tests FROM unit_version WHERE id IN (%s)"
                                      % ",".join("?" * len(chunk)), chunk).fetchall()
        rows.sort()
        vids = np.array([v for v, _ in rows], dtype=np.uint64)
        held, lens = postings.decode_many([blob for _, blob in rows])
        # Every held (version, test) pair of the touched versions as one sorted key array.
        cur = held.astype(np.uint64) | np.repeat(vids << np.uint64(32), lens)
        if len(minus) and len(cur):
            at = np.minimum(np.searchsorted(minus, cur), len(minus) - 1)
            cur = cur[minus[at] != cur]
        merged = _sorted_union(cur, plus) if len(plus) else cur
        tests = (merged & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        starts = np.searchsorted(merged >> np.uint64(32), vids, side="left")
        ends = np.searchsorted(merged >> np.uint64(32), vids, side="right")
        empty: list[int] = vids[starts == ends].tolist()
        self.conn.executemany("UPDATE unit_version SET tests = ? WHERE id = ?",
                              zip(postings.encode_sorted_many(tests, starts, ends),
                                  vids.tolist()))
        return empty
