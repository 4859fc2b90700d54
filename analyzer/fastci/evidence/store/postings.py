"""Packed id arrays for the evidence store (schema version 4).

The store keeps ``(test, unit)`` evidence as arrays of integer ids, never one row
per pair: per test the sorted ids of the *unit versions* it executed and, in
parallel, the ids of the context sets it ran them in; per unit version the sorted
ids of the tests that executed it (its posting list). Arrays are held as blobs:

* byte 0, the tag: the element width in bytes (1, 2 or 4) in the low bits,
  :data:`DELTA` when the array holds the gaps of a sorted one (the first element
  as is, then each element minus its predecessor: small numbers for the
  clustered ids of one test, so a narrow width), :data:`ZLIB` when the rest is
  zlib-compressed (only when that is smaller);
* then the elements, little-endian unsigned, of that width.

The empty array is the empty blob. Ids are below 2**32 (SQLite rowids of the
store's own tables).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

LOG = logging.getLogger(__name__)

#: An array of ids as the codecs take and give them.
Ids = npt.NDArray[np.uint32]

DELTA = 0x10
ZLIB = 0x80
_WIDTH = 0x07
#: zlib's fastest level: ingest writes every touched blob, and level 6 saves little
#: more on arrays of small gaps (measured on the synthetic store).
_LEVEL = 1
#: Shorter arrays are left raw: zlib's set-up costs ~20 us a call, more than it saves
#: on a posting list of a hundred tests (measured on the synthetic store's ingest).
_ZLIB_FROM = 512
_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}

EMPTY: Ids = np.zeros(0, dtype=np.uint32)


def as_ids(values: object) -> Ids:
    """``values`` (a sequence of non-negative ints) as a uint32 array."""
    return np.asarray(values, dtype=np.uint32)


def _pack(values: npt.NDArray[np.uint32], tag: int) -> bytes:
    top = int(values.max())
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4
    raw: bytes = values.astype(_DTYPES[width]).tobytes()
    if len(raw) >= _ZLIB_FROM:
        packed = zlib.compress(raw, _LEVEL)
        if len(packed) < len(raw):
            return bytes((tag | width | ZLIB,)) + packed
    return bytes((tag | width,)) + raw


#: The most one stored id array may expand to (16M ids of 4 bytes: far above any real
#: posting list). A row over it is corrupt, not a reason to spend gigabytes.
MAX_UNPACKED_BYTES = 64 << 20


class CorruptBlob(ValueError):
    """A stored id array that cannot be unpacked (corrupt, or past its cap)."""


def inflate(data: bytes, cap: int, what: str = "an id array") -> bytes:
    """``zlib.decompress(data)``, refused (:class:`CorruptBlob`) when it would expand past
    ``cap`` bytes, before it does: a stored blob is data a bad import or an edit can write."""
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data, cap)
    except zlib.error as exc:
        raise CorruptBlob(f"corrupt {what} ({exc})") from exc
    if inflater.unconsumed_tail:
        raise CorruptBlob(f"{what} expands past {cap >> 20} MiB: corrupt")
    return body


def _unpack(blob: bytes) -> tuple[int, npt.NDArray[np.uint32]]:
    tag = blob[0]
    body = inflate(blob[1:], MAX_UNPACKED_BYTES) if tag & ZLIB else blob[1:]
    values = np.frombuffer(body, dtype=_DTYPES[tag & _WIDTH]).astype(np.uint32)
    return tag, values


def encode_sorted(ids: Ids) -> bytes:
    """Pack strictly increasing ids (gaps, then the narrowest width)."""
    if len(ids) == 0:
        return b""
    gaps = np.empty(len(ids), dtype=np.uint32)
    gaps[0] = ids[0]
    np.subtract(ids[1:], ids[:-1], out=gaps[1:])
    return _pack(gaps, DELTA)


def encode_ids(ids: Ids) -> bytes:
    """Pack ids in their order (no gaps: the parallel context-set ids are not sorted)."""
    if len(ids) == 0:
        return b""
    return _pack(ids, 0)


def decode(blob: bytes | None) -> Ids:
    """Inverse of :func:`encode_sorted` and :func:`encode_ids` (the tag says which)."""
    if not blob:
        return EMPTY
    tag, values = _unpack(blob)
    if tag & DELTA:
        return np.cumsum(values, dtype=np.uint32)
    return values


def _spans(starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The indexes ``starts[i] .. starts[i] + lens[i] - 1`` of every span, concatenated."""
    total = int(lens.sum())
    if not total:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    out: npt.NDArray[np.int64] = np.arange(total, dtype=np.int64) + np.repeat(
        starts - (ends - lens), lens)
    return out


#: Elements (bytes, when decoding) per piece of :func:`decode_many` and
#: :func:`encode_sorted_many`: their temporaries stay small enough for the allocator to
#: reuse and the caches to hold (arrays of hundreds of MB are mapped fresh each time,
#: and page faults then cost more than the work). Measured on 505,000 lists of 100 ids:
#: 2**17 decodes them in 0.45 s and encodes them in 0.55 s (one at a time: 1.7 s each);
#: 2**22 took 0.6 s and 1.5 s, everything in one piece 2.1 s and 7.0 s.
_PIECE = 1 << 17


def _pieces(counts: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Consecutive ranges of items whose counts add up to about :data:`_PIECE` each."""
    total = np.cumsum(counts)
    marks = np.arange(_PIECE, int(total[-1]) if len(total) else 0, _PIECE)
    cuts = sorted({0, len(counts), *np.searchsorted(total, marks, side="right").tolist()})
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def decode_many(blobs: list[bytes]) -> tuple[Ids, npt.NDArray[np.int64]]:
    """:func:`decode` of every blob, as one array of their ids concatenated in order and
    each blob's count (see :func:`_decode_piece`)."""
    sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    parts = [_decode_piece(blobs[lo:hi], sizes[lo:hi]) for lo, hi in _pieces(sizes)]
    if not parts:
        return EMPTY, np.zeros(0, np.int64)
    return (np.concatenate([v for v, _ in parts]).astype(np.uint32, copy=False),
            np.concatenate([c for _, c in parts]))


def _decode_piece(blobs: list[bytes], sizes: npt.NDArray[np.int64]
                  ) -> tuple[Ids, npt.NDArray[np.int64]]:
    """:func:`decode_many` of a few thousand blobs (``sizes``: their lengths).

    The raw gap arrays of :func:`encode_sorted` (the common case: a posting list of a
    few hundred tests) are decoded together, with array operations over all of them; a
    compressed or unsorted blob goes through :func:`decode`. Ingest decodes every
    touched posting list: 505,000 of them at 100,000 tests.
    """
    n = len(blobs)
    buf = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    offsets = np.cumsum(sizes) - sizes
    nonempty = sizes > 0
    tags = np.zeros(n, dtype=np.int64)
    tags[nonempty] = buf[offsets[nonempty]]
    widths = tags & _WIDTH
    fast = nonempty & (tags & DELTA != 0) & (tags & ZLIB == 0) & np.isin(widths, (1, 2, 4))
    widths[~fast] = 0
    counts = np.zeros(n, dtype=np.int64)
    counts[fast] = (sizes[fast] - 1) // widths[fast]
    decoded = {i: decode(blobs[i]) for i in np.flatnonzero(nonempty & ~fast).tolist()}
    for i, values in decoded.items():
        counts[i] = len(values)
    out = np.empty(int(counts.sum()), dtype=np.uint32)
    # Each byte's width (0: a tag byte, or a blob decoded apart), each element's too.
    byte_width = np.repeat(widths.astype(np.uint8), sizes)
    byte_width[offsets[nonempty]] = 0
    elem_width = np.repeat(widths.astype(np.uint8), counts)
    for width in (1, 2, 4):
        members = fast & (widths == width)
        if not members.any():
            continue
        gaps = buf[byte_width == width].view(_DTYPES[width]).astype(np.int64)
        n_of = counts[members]
        firsts = np.cumsum(n_of) - n_of
        # One running sum over all the blobs: each blob's first gap (its first id) is
        # lowered by the previous blob's last id, so every blob starts from zero.
        ends = np.add.reduceat(gaps, firsts)
        gaps[firsts[1:]] -= ends[:-1]
        out[elem_width == width] = np.cumsum(gaps).astype(np.uint32)
    at = np.cumsum(counts) - counts
    for i, values in decoded.items():
        out[at[i]:at[i] + len(values)] = values
    return out, counts


def encode_sorted_many(ids: Ids, starts: npt.NDArray[np.int64],
                       ends: npt.NDArray[np.int64]) -> list[bytes]:
    """``[encode_sorted(ids[a:b]) for a, b in zip(starts, ends)]``, byte for byte, with
    array operations over many spans at a time: each span strictly increasing. A span
    whose raw encoding would reach the compression threshold goes through
    :func:`encode_sorted`."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    out: list[bytes] = []
    for lo, hi in _pieces(ends - starts):
        out += _encode_piece(ids, starts[lo:hi], ends[lo:hi])
    return out


def _encode_piece(ids: Ids, starts: npt.NDArray[np.int64],
                  ends: npt.NDArray[np.int64]) -> list[bytes]:
    counts = ends - starts
    out: list[bytes] = [b""] * len(starts)
    live = np.flatnonzero(counts > 0)
    if not len(live):
        return out
    where = _spans(starts[live], counts[live])
    values = ids[where].astype(np.int64)
    firsts = np.cumsum(counts[live]) - counts[live]
    gaps = np.empty_like(values)
    gaps[0] = values[0]
    gaps[1:] = values[1:] - values[:-1]
    gaps[firsts] = values[firsts]
    top = np.maximum.reduceat(gaps, firsts)
    width = np.where(top < 1 << 8, 1, np.where(top < 1 << 16, 2, 4))
    raw = counts[live] * width
    for j in np.flatnonzero(raw >= _ZLIB_FROM).tolist():
        i = int(live[j])
        out[i] = encode_sorted(ids[int(starts[i]):int(ends[i])])
    for w in (1, 2, 4):
        group = np.flatnonzero((width == w) & (raw < _ZLIB_FROM))
        if not len(group):
            continue
        n_of = counts[live[group]]
        body = gaps[_spans(firsts[group], n_of)].astype(_DTYPES[w]).view(np.uint8)
        size = 1 + n_of * w
        blob_at = np.cumsum(size) - size
        packed = np.empty(int(size.sum()), dtype=np.uint8)
        packed[blob_at] = DELTA | w
        packed[_spans(blob_at + 1, n_of * w)] = body
        data = packed.tobytes()
        for i, a, b in zip(live[group].tolist(), blob_at.tolist(), (blob_at + size).tolist()):
            out[i] = data[a:b]
    return out
