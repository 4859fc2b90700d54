"""Greedy decoding with a KV cache picks the same tokens (and near-identical logits) as
re-running the full prefix every step, on a trained model, tensor-parallel and single-rank.

Catches: rotary positions not offset for cached tokens, a top-left aligned causal mask for
queries shorter than keys, cache concatenated on the wrong axis, per-rank head caches mixed up.
"""

from __future__ import annotations

import sys

import torch

import harness
from microllm.data import SyntheticDataset
from microllm.generate import generate
from microllm.trainer import train

NAME = "kv_cache_decode_test"
# A wider init than training's default makes attention position-sensitive from the first
# step, so a position bug moves the logits by ~1 even at floors (at 0.02 it is ~5e-4).
SHARP = {"init_std": 0.2}
LOGIT_ATOL = 1e-4  # legitimate cached/uncached differences are ~1e-6 in fp32


def check(w: harness.Workload) -> None:
    cfg = harness.config(w, **SHARP)
    state = train(cfg, return_state=True).state
    data = SyntheticDataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_length, "valid")
    prompt = torch.stack([data[i][: cfg.model.seq_length] for i in range(w["micro_batch_size"])])
    n = w["decode_tokens"]
    full = generate(cfg, state, prompt, n, use_cache=False)
    cached = generate(cfg, state, prompt, n, use_cache=True)
    single = generate(harness.config(w, tp=1, **SHARP), state, prompt, n, use_cache=True)
    assert full.tokens.shape == (prompt.shape[0], prompt.shape[1] + n)
    for label, run in (("cached tp", cached), ("cached tp=1", single)):
        for step, (a, b) in enumerate(zip(run.step_logits, full.step_logits)):
            diff = float((a - b).abs().max())
            assert diff < LOGIT_ATOL, f"{label}: step {step} logits differ by {diff:.3g}"
        assert torch.equal(run.tokens, full.tokens), f"{label}: tokens differ from uncached decoding"


def test_kv_cache_decode(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
