from __future__ import annotations

import torch

from microllm.model.attention import (
    KVCache, apply_rotary, causal_mask, chunked_attention, math_attention, rotary_tables, sdpa_attention,
)

GEN = torch.Generator().manual_seed(0)


def test_causal_mask_is_bottom_right_aligned() -> None:
    mask = causal_mask(2, 5, q_offset=3)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_rotary_scores_depend_only_on_relative_position() -> None:
    q, k = torch.randn(1, 1, 1, 8, generator=GEN), torch.randn(1, 1, 1, 8, generator=GEN)

    def score(pq: int, pk: int) -> float:
        cq, sq = rotary_tables(torch.tensor([pq]), 8, 10000.0)
        ck, sk = rotary_tables(torch.tensor([pk]), 8, 10000.0)
        return float((apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum())

    assert abs(score(5, 2) - score(13, 10)) < 1e-5
    assert abs(score(5, 2) - score(5, 4)) > 1e-4


def test_kernels_agree_with_offsets_and_ragged_chunks() -> None:
    q, k, v = (torch.randn(2, 3, 11, 8, generator=GEN) for _ in range(3))
    for off, qq in ((0, q), (8, q[..., 8:, :])):
        want = math_attention(qq, k, v, off)
        assert torch.allclose(sdpa_attention(qq, k, v, off), want, atol=1e-5)
        assert torch.allclose(chunked_attention(qq, k, v, off, 4), want, atol=1e-5)


def test_kv_cache_appends_along_sequence() -> None:
    cache = KVCache()
    k1, v1 = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4)
    cache.append(k1, v1)
    k, v = cache.append(torch.zeros(1, 2, 1, 4), torch.ones(1, 2, 1, 4))
    assert k.shape == (1, 2, 4, 4) and cache.length == 4 and cache.history == [3, 1]
