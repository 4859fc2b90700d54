"""The GPT model as one pipeline stage of tensor-parallel shards, plus full-state helpers.

A *full state* is the unsharded, unpadded parameter dict with global layer numbers
(``layers.3.attn.qkv.weight``). It is what initialization produces, what resharding goes
through, and what parity tests compare.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from microllm.config import Config
from microllm.device import compute_dtype_name
from microllm.model.attention import KVCache
from microllm.model.transformer import RankRng, RMSNorm, TransformerLayer
from microllm.parallel.comm import ParallelContext, SimulatedGroup, _World
from microllm.parallel.tensor_parallel import (
    ColumnParallelLinear, VocabParallelEmbedding, shard, unshard, vocab_parallel_cross_entropy,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_LAYER = re.compile(r"^layers\.(\d+)\.")


class GPTStage(nn.Module):
    """The layers one pipeline stage owns; the first embeds tokens, the last computes the loss."""

    def __init__(self, cfg: Config, ctx: ParallelContext) -> None:
        super().__init__()
        m = cfg.model
        self.cfg, self.ctx = cfg, ctx
        self.compute_dtype = DTYPES[compute_dtype_name(cfg.precision.dtype, ctx.device.type)]
        per_stage = m.num_layers // ctx.pp
        self.layer_offset = ctx.pp_rank * per_stage
        sp = ctx.sequence_parallel
        if ctx.is_first_stage:
            self.embedding = VocabParallelEmbedding(cfg.padded_vocab_size, m.hidden_size, ctx.tp_group,
                                                    sequence_parallel=sp)
        self.layers = nn.ModuleList(TransformerLayer(m, ctx, self.layer_offset + i) for i in range(per_stage))
        if ctx.is_last_stage:
            self.final_norm = RMSNorm(m.hidden_size, m.norm_eps, sp)
            self.output = ColumnParallelLinear(m.hidden_size, cfg.padded_vocab_size, ctx.tp_group,
                                               sequence_parallel=sp, vocab_padded=True)
        # Built on CPU, then moved: the Parameter objects (and their TP split attributes) stay.
        self.to(ctx.device)

    def forward(self, inp: torch.Tensor, rng: RankRng, labels: torch.Tensor | None = None,
                q_offset: int = 0, caches: list[KVCache] | None = None) -> torch.Tensor:
        """Token ids (first stage) or hidden states in; hidden states, logits or per-token loss out."""
        x = self.embedding(inp, self.compute_dtype) if self.ctx.is_first_stage else inp
        for i, layer in enumerate(self.layers):
            x = layer(x, rng, q_offset, caches[i] if caches is not None else None)
        if not self.ctx.is_last_stage:
            return x
        logits = self.output(self.final_norm(x))
        if labels is None:
            return logits
        return vocab_parallel_cross_entropy(logits, labels, self.ctx.tp_group, self.cfg.model.vocab_size)

    def set_aux_grad_scale(self, scale: float) -> None:
        for module in self.modules():
            if hasattr(module, "aux_grad_scale"):
                module.aux_grad_scale = scale

    def global_name(self, local: str) -> str:
        match = _LAYER.match(local)
        if not match:
            return local
        return f"layers.{int(match.group(1)) + self.layer_offset}." + local[match.end():]

    def named_global_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(self.global_name(n), p) for n, p in self.named_parameters()]


def split_meta(p: torch.Tensor) -> tuple[int | None, bool]:
    return getattr(p, "tp_split_dim", None), getattr(p, "vocab_padded", False)


def gather_full(stage: GPTStage, tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Gather this stage's shards over the TP group (a collective) into a full state, on CPU.

    ``tensors`` maps global names to per-rank tensors shaped like the parameters (e.g. Adam
    moments); by default the parameters themselves are gathered. The result lives in host
    memory whatever the rank's device, so states of runs on different devices (or processes)
    compare, save and load alike.
    """
    out: dict[str, torch.Tensor] = {}
    group = stage.ctx.tp_group
    for name, p in stage.named_global_parameters():
        local = p.detach() if tensors is None else tensors[name]
        split, padded = split_meta(p)
        parts = [local] if split is None else list(group.all_gather(local, split).chunk(group.size, dim=split))
        out[name] = unshard(parts, split, padded, stage.cfg.model.vocab_size).cpu()
    return out


def shard_full(stage: GPTStage, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's shards (by global name) of the full-state tensors its stage owns."""
    ctx = stage.ctx
    out = {}
    for name, p in stage.named_global_parameters():
        split, padded = split_meta(p)
        out[name] = shard(full[name], split, padded, ctx.tp_rank, ctx.tp, stage.cfg.padded_vocab_size)
    return out


def load_full(stage: GPTStage, full: dict[str, torch.Tensor]) -> None:
    """Copy this rank's shards of ``full`` into the stage's parameters."""
    shards = shard_full(stage, full)
    with torch.no_grad():
        for name, p in stage.named_global_parameters():
            p.copy_(shards[name])


def single_context() -> ParallelContext:
    """A one-rank context (tp = pp = dp = 1) for reference models and initialization."""
    world = _World()
    g = {kind: SimulatedGroup(world, kind, (0,), 0) for kind in ("tp", "pp", "dp")}
    return ParallelContext(1, 1, 1, 0, 0, 0, 0, False, g["tp"], g["pp"], g["dp"])


def init_full_state(cfg: Config) -> dict[str, torch.Tensor]:
    """Deterministic initialization of the unsharded model from ``training.seed``.

    Independent of the parallel layout, so every layout starts from the same weights.
    """
    from dataclasses import replace

    ref_cfg = replace(cfg, parallel=replace(cfg.parallel, tp=1, pp=1, dp=1, sequence_parallel=False))
    model = GPTStage(ref_cfg, single_context())
    gen = torch.Generator().manual_seed(cfg.training.seed)
    std = cfg.model.init_std
    out_std = std / math.sqrt(2.0 * cfg.model.num_layers)
    full = {}
    for name, p in model.named_global_parameters():
        if p.dim() == 1:
            full[name] = torch.ones_like(p)
            continue
        t = torch.empty(p.shape).normal_(0.0, out_std if name.endswith(("out.weight", "fc2.weight")) else std,
                                         generator=gen)
        full[name] = t[: cfg.model.vocab_size].clone() if getattr(p, "vocab_padded", False) else t
    return full
