"""The packed id arrays of the store: the batch codecs give what the one-at-a-time
codecs give, byte for byte and id for id."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.evidence.store import postings

# Lists of distinct sorted ids: empty, single, short and long (long ones reach the zlib
# threshold), with gaps of every width (below 2**8, below 2**16, up to 2**32 - 1).
_ids = st.lists(st.integers(0, 2**32 - 1), max_size=40).map(
    lambda xs: np.unique(np.array(xs, dtype=np.uint32)))
_dense = st.tuples(st.integers(0, 2**32 - 5000), st.integers(0, 2000), st.integers(1, 3)).map(
    lambda t: np.arange(t[0], t[0] + t[1] * t[2], t[2], dtype=np.uint32))
_lists = st.lists(st.one_of(_ids, _dense), max_size=30)


@settings(max_examples=200, deadline=None)
@given(_lists, st.integers(4, 12))
def test_batch_codecs_equal_the_single_ones(lists: list[np.ndarray], piece: int) -> None:
    old = postings._PIECE
    postings._PIECE = 1 << piece  # small pieces: lists split across several
    try:
        flat = np.concatenate(lists) if lists else postings.EMPTY
        counts = np.array([len(v) for v in lists], dtype=np.int64)
        ends = np.cumsum(counts)
        got = postings.encode_sorted_many(flat, ends - counts, ends)
        assert got == [postings.encode_sorted(v) for v in lists]
        values, n = postings.decode_many(got)
        assert n.tolist() == counts.tolist()
        assert values.dtype == np.uint32 and values.tolist() == flat.tolist()
    finally:
        postings._PIECE = old


def test_decode_many_takes_unsorted_and_compressed_blobs_one_at_a_time() -> None:
    blobs = [postings.encode_ids(np.array([9, 3, 7], dtype=np.uint32)), b"",
             postings.encode_sorted(np.arange(0, 4000, 2, dtype=np.uint32)),  # zlib
             postings.encode_sorted(np.array([1, 300, 70000], dtype=np.uint32))]
    assert blobs[2][0] & postings.ZLIB
    values, counts = postings.decode_many(blobs)
    want = [postings.decode(b) for b in blobs]
    assert counts.tolist() == [len(w) for w in want]
    assert values.tolist() == np.concatenate(want).tolist()


def test_decode_many_refuses_a_blob_decode_refuses() -> None:
    with pytest.raises(Exception):
        postings.decode(bytes((0x03, 1, 2, 3)))
    with pytest.raises(Exception):
        postings.decode_many([postings.encode_sorted(np.array([4], np.uint32)),
                              bytes((0x03, 1, 2, 3))])
