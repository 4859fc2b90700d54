from __future__ import annotations

import torch
import torch.nn.functional as F

from microllm.config import ParallelConfig
from microllm.parallel.comm import ParallelContext, launch
from microllm.parallel.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, shard, unshard,
    vocab_parallel_cross_entropy,
)

GEN = torch.Generator().manual_seed(0)
X = torch.randn(2, 4, 8, generator=GEN)
W1 = torch.randn(12, 8, generator=GEN)
W2 = torch.randn(8, 12, generator=GEN)


def _mlp(ctx: ParallelContext, sequence_parallel: bool) -> dict[str, torch.Tensor]:
    g = ctx.tp_group
    col = ColumnParallelLinear(8, 12, g, sequence_parallel=sequence_parallel)
    row = RowParallelLinear(12, 8, g, sequence_parallel=sequence_parallel)
    with torch.no_grad():
        col.weight.copy_(W1.chunk(g.size, 0)[g.rank])
        row.weight.copy_(W2.chunk(g.size, 1)[g.rank])
    x = X.chunk(g.size, 1)[g.rank] if sequence_parallel else X
    x = x.clone().requires_grad_()
    y = row(torch.tanh(col(x)))
    y.pow(2).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dw1": col.weight.grad, "dw2": row.weight.grad}


def _reference() -> dict[str, torch.Tensor]:
    x = X.clone().requires_grad_()
    w1, w2 = W1.clone().requires_grad_(), W2.clone().requires_grad_()
    y = F.linear(torch.tanh(F.linear(x, w1)), w2)
    y.pow(2).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dw1": w1.grad, "dw2": w2.grad}


def test_column_row_parallel_matches_dense() -> None:
    ref = _reference()
    out = launch(_mlp, ParallelConfig(tp=2), False)
    for r in out:
        assert torch.allclose(r["y"], ref["y"], atol=1e-5)
        assert torch.allclose(r["dx"], ref["dx"], atol=1e-5)
    assert torch.allclose(torch.cat([r["dw1"] for r in out], 0), ref["dw1"], atol=1e-5)
    assert torch.allclose(torch.cat([r["dw2"] for r in out], 1), ref["dw2"], atol=1e-5)


def test_sequence_parallel_matches_dense() -> None:
    ref = _reference()
    out = launch(_mlp, ParallelConfig(tp=2, sequence_parallel=True), True)
    assert torch.allclose(torch.cat([r["y"] for r in out], 1), ref["y"], atol=1e-5)
    assert torch.allclose(torch.cat([r["dx"] for r in out], 1), ref["dx"], atol=1e-5)
    assert torch.allclose(torch.cat([r["dw1"] for r in out], 0), ref["dw1"], atol=1e-5)


LOGITS = torch.randn(2, 3, 10, generator=GEN)
TARGET = torch.randint(10, (2, 3), generator=GEN)


def _ce(ctx: ParallelContext) -> tuple[torch.Tensor, torch.Tensor]:
    padded = torch.cat([LOGITS, torch.full((2, 3, 6), 50.0)], dim=-1)  # padding must be ignored
    local = padded.chunk(ctx.tp, -1)[ctx.tp_rank].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(local, TARGET, ctx.tp_group, 10)
    loss.mean().backward()
    return loss.detach(), local.grad


def test_vocab_parallel_cross_entropy_matches_dense_and_masks_padding() -> None:
    logits = LOGITS.clone().requires_grad_()
    want = F.cross_entropy(logits.view(-1, 10), TARGET.view(-1), reduction="none").view(2, 3)
    want.mean().backward()
    out = launch(_ce, ParallelConfig(tp=2))
    assert torch.allclose(out[0][0], want, atol=1e-5)
    grad = torch.cat([g for _, g in out], -1)
    assert torch.allclose(grad[..., :10], logits.grad, atol=1e-6)
    assert torch.all(grad[..., 10:] == 0)


def _embed(ctx: ParallelContext) -> torch.Tensor:
    table = torch.arange(16 * 4, dtype=torch.float32).view(16, 4)
    emb = VocabParallelEmbedding(16, 4, ctx.tp_group)
    with torch.no_grad():
        emb.weight.copy_(table.chunk(ctx.tp, 0)[ctx.tp_rank])
    return emb(torch.tensor([[0, 9, 15]]), torch.float32).detach()


def test_vocab_parallel_embedding() -> None:
    table = torch.arange(16 * 4, dtype=torch.float32).view(16, 4)
    for r in launch(_embed, ParallelConfig(tp=2)):
        assert torch.equal(r, table[[0, 9, 15]].unsqueeze(0))


def test_shard_unshard_round_trip_with_vocab_padding() -> None:
    full = torch.randn(10, 4, generator=GEN)
    parts = [shard(full, 0, True, r, 4, 16) for r in range(4)]
    assert all(p.shape == (4, 4) for p in parts)
    assert torch.equal(unshard(parts, 0, True, 10), full)
    cols = [shard(full, 1, False, r, 2, 16) for r in range(2)]
    assert torch.equal(unshard(cols, 1, False, 10), full)
