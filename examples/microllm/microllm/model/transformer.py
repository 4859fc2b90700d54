"""Transformer building blocks: RMSNorm, dropout, MLP (GELU / SwiGLU), MoE and the layer.

Dropout draws from explicit generators (never the global RNG), so simulated ranks running as
threads stay deterministic, and activation recomputation can replay the same masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from microllm.config import ModelConfig
from microllm.model.attention import Attention, KVCache
from microllm.model.routing import RoutingTrace
from microllm.parallel.comm import Group, ParallelContext
from microllm.parallel.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, _param, scatter_to_seq,
)


@dataclass
class RankRng:
    """A rank's dropout generators: ``replicated`` is equal across tensor-parallel ranks (for
    replicated activations), ``tp_region`` differs per tensor-parallel rank (sharded ones)."""

    replicated: torch.Generator
    tp_region: torch.Generator

    @classmethod
    def create(cls, seed: int, ctx: ParallelContext) -> "RankRng":
        base = seed + 100 * ctx.pp_rank
        # On the rank's device: masks are drawn where they are used (a CUDA run's masks differ
        # from a CPU run's, and every comparison in the suite is between runs on one device).
        return cls(torch.Generator(device=ctx.device).manual_seed(base),
                   torch.Generator(device=ctx.device).manual_seed(base + 2718 + ctx.tp_rank))

    def get_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.replicated.get_state(), self.tp_region.get_state()

    def set_state(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.replicated.set_state(state[0])
        self.tp_region.set_state(state[1])


def dropout(x: torch.Tensor, p: float, generator: torch.Generator, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


class RMSNorm(nn.Module):
    """Root-mean-square norm in fp32. With sequence parallelism each rank sees part of the
    sequence, so the weight's gradient is partial and must be summed over the TP group."""

    def __init__(self, hidden: int, eps: float, sequence_parallel: bool) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param((hidden,), None)
        self.weight.data.fill_(1.0)
        self.weight.sequence_parallel_grad = sequence_parallel  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


class MLP(nn.Module):
    """Column-parallel up projection(s), activation, row-parallel down projection."""

    def __init__(self, cfg: ModelConfig, group: Group, sequence_parallel: bool) -> None:
        super().__init__()
        self.activation = cfg.activation
        self.fc1 = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_size, group, sequence_parallel=sequence_parallel)
        if cfg.activation == "swiglu":
            self.gate = ColumnParallelLinear(cfg.hidden_size, cfg.ffn_size, group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear(cfg.ffn_size, cfg.hidden_size, group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            h = F.silu(self.gate(x)) * self.fc1(x)
        else:
            h = F.gelu(self.fc1(x))
        return self.fc2(h)


class _GatherSeqReplicated(torch.autograd.Function):
    """All-gather the sequence for replicated compute; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return group.all_gather(x, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad.chunk(ctx.group.size, dim=1)[ctx.group.rank].clone(), None


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on ``x`` whose backward also seeds ``aux``'s gradient with ``scale``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.aux_device, ctx.aux_dtype = scale, aux.device, aux.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, torch.tensor(ctx.scale, device=ctx.aux_device, dtype=ctx.aux_dtype), None


class MoE(nn.Module):
    """Top-k routed mixture of tensor-parallel expert MLPs with a load-balancing loss."""

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, layer_number: int = 0) -> None:
        super().__init__()
        self.cfg, self.ctx, self.layer_number = cfg, ctx, layer_number
        self.router = _param((cfg.num_experts, cfg.hidden_size), None)
        self.experts = nn.ModuleList(MLP(cfg, ctx.tp_group, False) for _ in range(cfg.num_experts))
        self.aux_grad_scale = 0.0
        self.last_aux_loss = 0.0
        self.trace: RoutingTrace | None = None  # set by the trainer to record or replay routing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ctx.sequence_parallel:
            x = _GatherSeqReplicated.apply(x, self.ctx.tp_group)
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        probs = F.linear(flat.float(), self.router).softmax(dim=-1)
        weights, chosen = probs.topk(self.cfg.moe_top_k, dim=-1)
        if self.trace is not None:
            routed = self.trace.route(probs, chosen, self.cfg.moe_top_k)
            if routed is not chosen:  # replaying another run's decisions
                chosen, weights = routed, probs.gather(-1, routed)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:  # routing is replicated, so every TP rank skips alike
                continue
            y = expert(flat[token].unsqueeze(0)).squeeze(0)
            out = out.index_add(0, token, y * weights[token, slot].unsqueeze(-1).to(y.dtype))
        fraction = F.one_hot(chosen[:, 0], self.cfg.num_experts).float().mean(dim=0)
        aux = self.cfg.num_experts * (fraction * probs.mean(dim=0)).sum()
        self.last_aux_loss = float(aux.detach())
        out = out.view(b, s, h)
        if self.training and self.cfg.moe_aux_loss_coeff > 0:
            out = _AttachAuxLoss.apply(out, aux, self.cfg.moe_aux_loss_coeff * self.aux_grad_scale)
        if self.ctx.sequence_parallel:
            out = scatter_to_seq(out, self.ctx.tp_group)
        return out


class TransformerLayer(nn.Module):
    """Pre-norm block: x + drop(attn(norm(x))), then x + drop(mlp(norm(x)))."""

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext, layer_number: int) -> None:
        super().__init__()
        self.cfg, self.ctx, self.layer_number = cfg, ctx, layer_number
        sp = ctx.sequence_parallel
        self.norm1 = RMSNorm(cfg.hidden_size, cfg.norm_eps, sp)
        self.attn = Attention(cfg, ctx)
        self.norm2 = RMSNorm(cfg.hidden_size, cfg.norm_eps, sp)
        self.mlp: nn.Module = MoE(cfg, ctx, layer_number) if cfg.num_experts else MLP(cfg, ctx.tp_group, sp)

    def _forward(self, x: torch.Tensor, rng: RankRng, q_offset: int, cache: KVCache | None) -> torch.Tensor:
        # Hidden activations are sharded across TP ranks under sequence parallelism.
        hidden_gen = rng.tp_region if self.ctx.sequence_parallel else rng.replicated
        a = self.attn(self.norm1(x), self.cfg.attention_impl, q_offset, cache, rng.tp_region)
        x = x + dropout(a, self.cfg.hidden_dropout, hidden_gen, self.training)
        m = self.mlp(self.norm2(x))
        return x + dropout(m, self.cfg.hidden_dropout, hidden_gen, self.training)

    def forward(self, x: torch.Tensor, rng: RankRng, q_offset: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        if not (self.cfg.recompute and self.training and torch.is_grad_enabled()):
            return self._forward(x, rng, q_offset, cache)
        start = rng.get_state()
        calls = [0]

        def replay(inp: torch.Tensor) -> torch.Tensor:
            # The recomputation rewinds the dropout generators so it draws the same masks,
            # then puts them back where the rest of the step left them. `finally`, because
            # non-reentrant checkpointing stops a recomputation early by raising.
            now = rng.get_state()
            rng.set_state(start)
            try:
                return self._forward(inp, rng, q_offset, None)
            finally:
                if calls[0]:
                    rng.set_state(now)
                calls[0] += 1

        return checkpoint(replay, x, use_reentrant=False)
