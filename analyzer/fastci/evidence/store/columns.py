"""A run's units as columns of row numbers into a table one ingest shares.

A full-suite recording holds tens of millions of (test, unit) pairs. Held as a dict
per run (unit id -> checksum and set of contexts) every pair costs a few Python
objects to build and as many lookups to store (~5 us, ~4 minutes for 50 million
pairs). Here a run's units are two arrays instead: per unit, the row of its
(unit id, checksum) in a :class:`UnitTable` and the row of its set of contexts
there. The table is shared by every run one ``fastci ingest`` merges, so each unit
version and each context set is interned once for the whole recording, and the
store maps a run's rows to its own ids with one array lookup
(:meth:`fastci.evidence.store.batch.EvidenceBatch.prepare`).

:class:`UnitColumns` is still a read-only mapping, the same as the dict (built on
first use), for every reader that wants one.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from fastci.types import Checksum, ContextSig, UnitId

Rows = npt.NDArray[np.uint32]
UnitValue = tuple[Checksum, frozenset[ContextSig]]


#: The key of the empty set of contexts (no pair of 32-bit signature numbers has it).
EMPTY_SET = 0xFFFFFFFFFFFFFFFF


def small_set_keys(sizes: npt.NDArray[np.int64], starts: npt.NDArray[np.int64],
                   numbers: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """One integer per set of at most two signatures: ``lo << 32 | hi`` of its sorted
    signature numbers (``lo == hi`` for one, :data:`EMPTY_SET` for none). ``sizes``
    and ``starts``: each set's size and start in ``numbers``."""
    keys = np.full(len(sizes), EMPTY_SET, dtype=np.uint64)
    first = numbers[np.minimum(starts, max(len(numbers) - 1, 0))] if len(numbers) else \
        np.zeros(len(sizes), np.uint64)
    second = numbers[np.minimum(starts + 1, max(len(numbers) - 1, 0))] if len(numbers) else first
    second = np.where(sizes == 2, second, first)
    lo, hi = np.minimum(first, second), np.maximum(first, second)
    filled = sizes > 0
    keys[filled] = (lo[filled] << np.uint64(32)) | hi[filled]
    return keys


class UnitTable:
    """Unit versions (unit id, checksum) and context sets, each with a row number."""

    def __init__(self) -> None:
        self.keys: list[tuple[UnitId, Checksum]] = []
        self._rows: dict[tuple[UnitId, Checksum], int] = {}
        self._uids: dict[UnitId, int] = {}
        self._uid_of: list[int] = []  # row -> index of its unit id (one per unit id)
        self._uid_array: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._uid_filled = 0
        self.sets: list[frozenset[ContextSig]] = []
        self._set_rows: dict[frozenset[ContextSig], int] = {}
        self.sigs: dict[ContextSig, int] = {}  # signature -> its number (for set keys)
        self.sig_names: list[ContextSig] = []
        # Sorted signature numbers of a set as little-endian uint32 bytes -> its row.
        self.set_keys: dict[bytes, int] = {}
        # Sets of at most two signatures by one integer key (small_set_keys) -> row,
        # and the same as sorted arrays, for lookups of many keys at once.
        self._small: dict[int, int] = {}
        self._small_keys: npt.NDArray[np.uint64] = np.zeros(0, np.uint64)
        self._small_rows: npt.NDArray[np.int64] = np.zeros(0, np.int64)

    def row(self, uid: UnitId, checksum: Checksum) -> int:
        """The row of the version ``(uid, checksum)`` (added when new)."""
        key = (uid, checksum)
        got = self._rows.get(key)
        if got is None:
            got = self._rows[key] = len(self.keys)
            self.keys.append(key)
            self._uid_of.append(self._uids.setdefault(uid, len(self._uids)))
        return got

    def set_row(self, sigs: frozenset[ContextSig]) -> int:
        """The row of the context set ``sigs`` (added when new)."""
        got = self._set_rows.get(sigs)
        if got is None:
            got = self._set_rows[sigs] = len(self.sets)
            self.sets.append(sigs)
        return got

    def sig_numbers(self, sigs: Sequence[ContextSig]) -> npt.NDArray[np.uint32]:
        """The numbers of ``sigs`` (numbered when new), in their order."""
        got = list(map(self.sigs.get, sigs))
        if None in got:
            for i, (sig, n) in enumerate(zip(sigs, got)):
                if n is None:
                    n = self.sigs.get(sig)
                    if n is None:
                        n = self.sigs[sig] = len(self.sig_names)
                        self.sig_names.append(sig)
                    got[i] = n
        return np.array(got, dtype=np.uint32)

    def keyed_sets(self, keys: Sequence[bytes]) -> list[int]:
        """The rows of the context sets ``keys`` name (each the ascending numbers of its
        signatures as little-endian uint32), added when new."""
        got = list(map(self.set_keys.get, keys))
        if None in got:
            names = self.sig_names
            for i, (key, row) in enumerate(zip(keys, got)):
                if row is None:
                    row = self.set_row(frozenset(
                        names[n] for n in np.frombuffer(key, dtype="<u4").tolist()))
                    got[i] = self.set_keys[key] = row
        return got  # type: ignore[return-value]

    def small_sets(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The rows of the context sets of at most two signatures that ``keys`` name
        (:func:`small_set_keys`), added when new: one sorted-array lookup for all."""
        at = np.searchsorted(self._small_keys, keys)
        at[at == len(self._small_keys)] = 0
        out = np.zeros(len(keys), dtype=np.int64)
        hit = self._small_keys[at] == keys if len(self._small_keys) else \
            np.zeros(len(keys), dtype=bool)
        out[hit] = self._small_rows[at[hit]]
        missing = np.flatnonzero(~hit)
        if len(missing):
            known = self._small
            names = self.sig_names
            for key in keys[missing].tolist():
                if key not in known:
                    if key == EMPTY_SET:
                        sigs: frozenset[ContextSig] = frozenset()
                    else:
                        sigs = frozenset((names[key >> 32], names[key & 0xFFFFFFFF]))
                    known[key] = self.set_row(sigs)
            out[missing] = [known[k] for k in keys[missing].tolist()]
            self._small_keys = np.fromiter(known, dtype=np.uint64, count=len(known))
            order = np.argsort(self._small_keys)
            self._small_keys = self._small_keys[order]
            self._small_rows = np.fromiter(known.values(), dtype=np.int64, count=len(known))[order]
        return out

    def uid_index(self, rows: Rows) -> npt.NDArray[np.int64]:
        """The index of each row's unit id (rows of one unit id share it)."""
        have, want = self._uid_filled, len(self._uid_of)
        if have < want:  # grown by doubling: rows come a few at a time
            if want > len(self._uid_array):
                grown = np.zeros(max(want, 2 * len(self._uid_array)), np.int64)
                grown[:have] = self._uid_array[:have]
                self._uid_array = grown
            self._uid_array[have:want] = self._uid_of[have:want]
            self._uid_filled = want
        out: npt.NDArray[np.int64] = self._uid_array[rows]
        return out

    def columns(self, units: Mapping[UnitId, UnitValue]) -> "UnitColumns":
        """``units`` (a dict as :class:`~fastci.evidence.store.db.RunEvidence` takes) as columns."""
        rows = [self.row(uid, checksum) for uid, (checksum, _) in units.items()]
        sets = [self.set_row(sigs) for _, sigs in units.values()]
        return UnitColumns(self, np.array(rows, dtype=np.uint32), np.array(sets, dtype=np.uint32))

    def merge(self, parts: Sequence[tuple[Rows, Rows]]) -> "UnitColumns":
        """One run's units from ``parts`` (rows and set rows of its files, its processes,
        its shared segments), as one dict filled part after part would hold them: a unit
        in several parts keeps the first non-empty checksum and the union of its
        contexts."""
        if not parts:
            return UnitColumns(self, np.zeros(0, np.uint32), np.zeros(0, np.uint32))
        rows = np.concatenate([r for r, _ in parts]).astype(np.uint32)
        sets = np.concatenate([s for _, s in parts]).astype(np.uint32)
        uids = self.uid_index(rows)
        order = np.argsort(uids, kind="stable")
        ranked = uids[order]
        dup = np.flatnonzero(ranked[1:] == ranked[:-1])
        if not len(dup):
            return UnitColumns(self, rows, sets)
        # The few units several parts name (a module both a process and a collection
        # segment ran): merged one by one, in the order the parts name them.
        firsts: dict[int, int] = {}  # first position of a repeated unit id -> its others
        extra: dict[int, list[int]] = {}
        for i in dup.tolist():
            head = firsts.setdefault(int(ranked[i]), int(order[i]))
            extra.setdefault(head, []).append(int(order[i + 1]))
        keep = np.ones(len(rows), dtype=bool)
        for head, others in extra.items():
            uid, checksum = self.keys[int(rows[head])]
            sigs = set(self.sets[int(sets[head])])
            for o in others:
                keep[o] = False
                checksum = checksum or self.keys[int(rows[o])][1]
                sigs |= self.sets[int(sets[o])]
            rows[head] = self.row(uid, checksum)
            sets[head] = self.set_row(frozenset(sigs))
        return UnitColumns(self, rows[keep], sets[keep])


class MirrorTable(UnitTable):
    """The rows of another process's :class:`UnitTable`, as it sends what it added: the
    same rows in the same order, so its :class:`UnitColumns` read the same here. Only
    appended to (:meth:`extend`); rows are never looked up by key here."""

    def extend(self, keys: Sequence[tuple[UnitId, Checksum]],
               sets: Sequence[frozenset[ContextSig]]) -> None:
        """Append ``keys`` and ``sets`` as the next rows, in order."""
        self.keys.extend(keys)
        self.sets.extend(sets)

    def row(self, uid: UnitId, checksum: Checksum) -> int:
        raise TypeError("a mirror table only takes the rows its source sends")

    def set_row(self, sigs: frozenset[ContextSig]) -> int:
        raise TypeError("a mirror table only takes the rows its source sends")


class UnitColumns(Mapping[UnitId, UnitValue]):
    """A run's units: ``rows[i]`` and ``sets[i]`` are unit i's version and context set
    in ``table``; each unit id once."""

    __slots__ = ("table", "rows", "sets", "_dict")

    def __init__(self, table: UnitTable, rows: Rows, sets: Rows) -> None:
        self.table = table
        self.rows = rows
        self.sets = sets
        self._dict: dict[UnitId, UnitValue] | None = None

    def _map(self) -> dict[UnitId, UnitValue]:
        if self._dict is None:
            keys, sets = self.table.keys, self.table.sets
            self._dict = {keys[r][0]: (keys[r][1], sets[s])
                          for r, s in zip(self.rows.tolist(), self.sets.tolist())}
        return self._dict

    def __getitem__(self, uid: UnitId) -> UnitValue:
        return self._map()[uid]

    def __iter__(self) -> Iterator[UnitId]:
        return iter(self._map())

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"UnitColumns({self._map()!r})"
