"""Greedy decoding, with or without a per-layer KV cache, on any tensor-parallel size.

The cached path feeds one token at a time at absolute position ``q_offset``; the uncached path
re-runs the whole prefix. Both must pick the same tokens — the KV-cache test checks exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from microllm import ConfigError
from microllm.config import Config
from microllm.model.attention import KVCache
from microllm.model.gpt import GPTStage, load_full
from microllm.model.transformer import RankRng
from microllm.parallel.comm import ParallelContext, launch
from microllm.parallel.tensor_parallel import gather_vocab_logits


@dataclass
class Generation:
    """Generated token ids ``[b, prompt + new]`` and the logits that chose each new token."""

    tokens: torch.Tensor
    step_logits: list[torch.Tensor]


@torch.no_grad()
def greedy(stage: GPTStage, ctx: ParallelContext, prompt: torch.Tensor, max_new_tokens: int,
           use_cache: bool = True) -> Generation:
    """Decode ``max_new_tokens`` tokens greedily after ``prompt [b, s]`` (SPMD over TP ranks)."""
    stage.eval()
    rng = RankRng.create(0, ctx)
    vocab = stage.cfg.model.vocab_size
    caches = [KVCache() for _ in stage.layers] if use_cache else None
    tokens = prompt.to(ctx.device)  # never changed in place: decoding concatenates
    step_logits: list[torch.Tensor] = []
    logits = stage(tokens, rng, caches=caches)
    for _ in range(max_new_tokens):
        last = gather_vocab_logits(logits[:, -1:, :], ctx.tp_group, vocab)[:, 0].float()
        step_logits.append(last)
        nxt = last.argmax(dim=-1, keepdim=True)
        if caches is not None:
            logits = stage(nxt, rng, q_offset=tokens.shape[1], caches=caches)
        tokens = torch.cat([tokens, nxt], dim=1)
        if caches is None:
            logits = stage(tokens, rng)
    # Host memory out: a caller compares generations made on different devices and layouts.
    return Generation(tokens.cpu(), [x.cpu() for x in step_logits])


def _rank_generate(ctx: ParallelContext, cfg: Config, state: dict[str, torch.Tensor], prompt: torch.Tensor,
                   max_new_tokens: int, use_cache: bool) -> Generation:
    stage = GPTStage(cfg, ctx)
    load_full(stage, state)
    return greedy(stage, ctx, prompt, max_new_tokens, use_cache)


def generate(cfg: Config, state: dict[str, torch.Tensor], prompt: torch.Tensor, max_new_tokens: int,
             use_cache: bool = True) -> Generation:
    """Load a full state into ``cfg``'s layout and decode; pipeline and sequence parallelism
    are training-only here."""
    if cfg.parallel.pp != 1 or cfg.parallel.dp != 1 or cfg.parallel.sequence_parallel:
        raise ConfigError("invalid configuration: generation needs pp == 1, dp == 1, no sequence_parallel")
    cfg.validate()
    return launch(_rank_generate, cfg.parallel, cfg, state, prompt, max_new_tokens, use_cache)[0]
