"""Tensor and sequence parallelism: conjugate communication ops and the parallel layers.

The four Megatron operators come in conjugate pairs (forward / backward):
``copy_to_tp`` (identity / all-reduce), ``reduce_from_tp`` (all-reduce / identity),
``gather_from_seq`` (all-gather / reduce-scatter), ``reduce_scatter_to_seq`` (reduce-scatter /
all-gather). Activations are ``[batch, seq, hidden]``; sequence parallelism shards dim 1.

Every parameter carries ``tp_split_dim`` (0, 1 or None = replicated) and ``vocab_padded``, so
checkpoints can be gathered and resharded to another tensor-parallel size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from microllm.parallel.comm import Group

SEQ_DIM = 1


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return ctx.group.all_reduce(grad), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        return group.all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


class _GatherFromSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return group.all_gather(x, SEQ_DIM)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return ctx.group.reduce_scatter(grad, SEQ_DIM), None


class _ReduceScatterToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return group.reduce_scatter(x, SEQ_DIM)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return ctx.group.all_gather(grad, SEQ_DIM), None


class _ScatterToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.chunk(group.size, dim=SEQ_DIM)[group.rank].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return ctx.group.all_gather(grad, SEQ_DIM), None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromTP.apply(x, group)


def gather_from_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromSeq.apply(x, group)


def reduce_scatter_to_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceScatterToSeq.apply(x, group)


def scatter_to_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToSeq.apply(x, group)


def _param(shape: tuple[int, ...], split_dim: int | None, vocab_padded: bool = False) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(shape))
    p.tp_split_dim = split_dim  # type: ignore[attr-defined]
    p.vocab_padded = vocab_padded  # type: ignore[attr-defined]
    return p


class ColumnParallelLinear(nn.Module):
    """``y = x W^T`` with W split by output rows; input replicated (or sequence-sharded)."""

    def __init__(self, in_features: int, out_features: int, group: Group, *,
                 sequence_parallel: bool = False, vocab_padded: bool = False) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _param((out_features // group.size, in_features), 0, vocab_padded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = gather_from_seq(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)
        return F.linear(x, self.weight.to(x.dtype))


class RowParallelLinear(nn.Module):
    """``y = sum_r x_r W_r^T`` with W split by input columns; output all-reduced (or
    reduce-scattered along the sequence with sequence parallelism)."""

    def __init__(self, in_features: int, out_features: int, group: Group, *,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _param((out_features, in_features // group.size), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight.to(x.dtype))
        if self.sequence_parallel:
            return reduce_scatter_to_seq(partial, self.group)
        return reduce_from_tp(partial, self.group)


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by (padded) vocabulary rows across the tensor-parallel group."""

    def __init__(self, padded_vocab: int, hidden: int, group: Group, *, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = _param((padded_vocab // group.size, hidden), 0, vocab_padded=True)

    def forward(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        local = self.weight.shape[0]
        start = self.group.rank * local
        outside = (ids < start) | (ids >= start + local)
        out = F.embedding((ids - start).masked_fill(outside, 0), self.weight.to(dtype))
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_seq(out, self.group)
        return reduce_from_tp(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Group, vocab_size: int) -> torch.Tensor:
        local = logits.shape[-1]
        start = group.rank * local
        x = logits.float()
        padded = torch.arange(start, start + local, device=logits.device) >= vocab_size
        x = x.masked_fill(padded, float("-inf"))
        x = x - group.all_reduce(x.max(dim=-1).values, op="max").unsqueeze(-1)
        in_range = (target >= start) & (target < start + local)
        local_t = (target - start).clamp(0, local - 1)
        predicted = x.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(~in_range, 0.0)
        predicted = group.all_reduce(predicted)
        exp = x.exp()
        sum_exp = group.all_reduce(exp.sum(dim=-1))
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), in_range, local_t)
        ctx.in_dtype = logits.dtype
        return sum_exp.log() - predicted

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        softmax, in_range, local_t = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local_t.unsqueeze(-1), -in_range.unsqueeze(-1).to(g.dtype))
        return (g * grad.unsqueeze(-1)).to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: Group,
                                 vocab_size: int) -> torch.Tensor:
    """Per-token loss from vocab-sharded logits; padded vocabulary columns are masked out."""
    return _VocabParallelCrossEntropy.apply(logits, target, group, vocab_size)


def gather_vocab_logits(logits: torch.Tensor, group: Group, vocab_size: int) -> torch.Tensor:
    """Full (unpadded) logits from vocab shards, for decoding (no gradient)."""
    return group.all_gather(logits.detach(), dim=-1)[..., :vocab_size]


def shard(full: torch.Tensor, split_dim: int | None, vocab_padded: bool, rank: int, size: int,
          padded_vocab: int) -> torch.Tensor:
    """Slice this rank's shard out of an unpadded full tensor (padding rows are zero)."""
    if vocab_padded:
        pad = torch.zeros((padded_vocab - full.shape[0],) + tuple(full.shape[1:]), dtype=full.dtype,
                          device=full.device)
        full = torch.cat([full, pad], dim=0)
    if split_dim is None:
        return full.clone()
    return full.chunk(size, dim=split_dim)[rank].clone()


def unshard(parts: list[torch.Tensor], split_dim: int | None, vocab_padded: bool, vocab_size: int) -> torch.Tensor:
    """Inverse of :func:`shard`: concatenate shards and trim vocabulary padding."""
    full = parts[0].clone() if split_dim is None else torch.cat(parts, dim=split_dim)
    return full[:vocab_size].clone() if vocab_padded else full
