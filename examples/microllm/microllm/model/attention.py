"""Causal self-attention: rotary positions, three kernels, tensor parallelism and a KV cache.

Kernels (``ModelConfig.attention_impl``):

* ``math`` — explicit fp32 softmax; the only kernel with attention dropout.
* ``sdpa`` — ``torch.nn.functional.scaled_dot_product_attention``.
* ``chunked`` — blockwise online softmax over key chunks (the FlashAttention recurrence).

All kernels use a bottom-right aligned causal mask: query ``i`` sits at absolute position
``q_offset + i`` and sees keys ``0 .. q_offset + i``, which is what cached decoding needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from microllm.config import ModelConfig
from microllm.parallel.comm import ParallelContext
from microllm.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear


def rotary_tables(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[seq, head_dim]`` for the given absolute positions."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.float().unsqueeze(-1) * inv_freq.unsqueeze(0)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [b, heads, seq, head_dim]`` by position (rotate-half convention)."""
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.device), sin.to(x.device)  # tables are built in host memory (a no-op on CPU)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def causal_mask(sq: int, sk: int, q_offset: int) -> torch.Tensor:
    """Boolean ``[sq, sk]``, True where query may attend (bottom-right aligned)."""
    q_pos = torch.arange(sq).unsqueeze(-1) + q_offset
    return torch.arange(sk).unsqueeze(0) <= q_pos


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int,
                   dropout_p: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q_offset).to(q.device), float("-inf"))
    probs = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        keep = torch.rand(probs.shape, generator=generator, device=probs.device) >= dropout_p
        probs = probs * keep / (1.0 - dropout_p)
    return (probs.to(v.dtype) @ v).to(q.dtype)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
    if q.shape[-2] == k.shape[-2] and q_offset == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # is_causal aligns the mask top-left; cached decoding needs bottom-right.
    mask = causal_mask(q.shape[-2], k.shape[-2], q_offset).to(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, chunk: int) -> torch.Tensor:
    """Online-softmax attention over key blocks of ``chunk`` keys (fp32 accumulators)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    qf = q.float() * scale
    sq, sk = q.shape[-2], k.shape[-2]
    running_max = torch.full(q.shape[:-1], float("-inf"), device=q.device)
    running_sum = torch.zeros(q.shape[:-1], device=q.device)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), device=q.device)
    for start in range(0, sk, chunk):
        kb, vb = k[..., start:start + chunk, :].float(), v[..., start:start + chunk, :].float()
        scores = qf @ kb.transpose(-1, -2)
        allowed = causal_mask(sq, sk, q_offset).to(q.device)[:, start:start + chunk]
        scores = scores.masked_fill(~allowed, float("-inf"))
        new_max = torch.maximum(running_max, scores.max(dim=-1).values)
        safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        correction = torch.exp(running_max - safe_max)
        p = torch.exp(scores - safe_max.unsqueeze(-1))
        running_sum = running_sum * correction + p.sum(dim=-1)
        acc = acc * correction.unsqueeze(-1) + p @ vb
        running_max = new_max
    return (acc / running_sum.unsqueeze(-1)).to(q.dtype)


@dataclass
class KVCache:
    """Keys and values seen so far by one layer (``[b, local_heads, seq, head_dim]``)."""

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    length: int = 0
    history: list[int] = field(default_factory=list)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        self.length = self.k.shape[-2]
        self.history.append(k.shape[-2])
        return self.k, self.v


class Attention(nn.Module):
    """Head-parallel attention: fused QKV is column-parallel, the output projection row-parallel."""

    def __init__(self, cfg: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.cfg, self.ctx = cfg, ctx
        self.local_heads = cfg.num_heads // ctx.tp
        # Fused rows are laid out (head, {q,k,v}, head_dim) so a row split keeps whole heads.
        self.qkv = ColumnParallelLinear(cfg.hidden_size, 3 * cfg.hidden_size, ctx.tp_group,
                                        sequence_parallel=ctx.sequence_parallel)
        self.out = RowParallelLinear(cfg.hidden_size, cfg.hidden_size, ctx.tp_group,
                                     sequence_parallel=ctx.sequence_parallel)

    def forward(self, x: torch.Tensor, impl: str, q_offset: int = 0, cache: KVCache | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        b = x.shape[0]
        qkv = self.qkv(x)
        s = qkv.shape[1]
        qkv = qkv.view(b, s, self.local_heads, 3, self.cfg.head_dim).permute(3, 0, 2, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        cos, sin = rotary_tables(torch.arange(q_offset, q_offset + s), self.cfg.head_dim, self.cfg.rotary_base)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.append(k, v)
        dropout = self.cfg.attention_dropout if self.training else 0.0
        if impl == "math" or dropout > 0.0:
            ctx_layer = math_attention(q, k, v, q_offset, dropout, generator)
        elif impl == "sdpa":
            ctx_layer = sdpa_attention(q, k, v, q_offset)
        else:
            ctx_layer = chunked_attention(q, k, v, q_offset, self.cfg.attention_chunk)
        ctx_layer = ctx_layer.transpose(1, 2).reshape(b, s, self.local_heads * self.cfg.head_dim)
        return self.out(ctx_layer)
