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


def _unpack(blob: bytes) -> tuple[int, npt.NDArray[np.uint32]]:
    tag = blob[0]
    body = zlib.decompress(blob[1:]) if tag & ZLIB else blob[1:]
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

