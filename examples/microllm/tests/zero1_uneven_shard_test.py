"""ZeRO-1 over a data-parallel size that does not divide the parameter count matches plain
data-parallel AdamW: the flat buffer is padded to a multiple of dp and the remainder is
optimized like every other element (dp=3).

The constraint keeps the element count (2*V*h + h + L*(2h + 12h^2) for a GELU model with an
untied, unpadded vocabulary of V = vocab_size, a multiple of 8) off a multiple of dp, and the
vocabulary unpadded, so the tail of the flat buffer holds real output weights, not padding rows
that would hide a dropped remainder. The test recounts the parameters to make sure.

Catches: shards of ``numel // dp`` that drop the remainder, padding leaking into parameters or
moments, the gathered moments (what a checkpoint stores) misaligned or not trimmed, the global
norm counting padding or missing the last shard.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

import harness
from microllm.model.gpt import GPTStage, single_context
from microllm.trainer import train

NAME = "zero1_uneven_shard_test"


def _moments(directory: str, iteration: int) -> dict[str, dict[str, torch.Tensor]]:
    state = torch.load(os.path.join(directory, f"iter_{iteration:07d}", "mp_rank_00_000.pt"), weights_only=False)
    return {"exp_avg": state["optim"]["exp_avg"], "exp_avg_sq": state["optim"]["exp_avg_sq"]}


def check(w: harness.Workload) -> None:
    one_rank = harness.config(w, dp=1)
    params = list(GPTStage(one_rank, single_context()).parameters())
    numel = sum(p.numel() for p in params)
    assert numel % w["dp"] != 0, f"{numel} parameters divide evenly by dp={w['dp']}: nothing to check"
    assert not getattr(params[-1], "vocab_padded", False) or one_rank.padded_vocab_size == w["vocab_size"], \
        "the flat buffer ends in vocabulary padding, which would hide a dropped remainder"
    n = w["train_iters"]
    with tempfile.TemporaryDirectory(prefix="zero-uneven-") as root:
        plain_dir, zero_dir = os.path.join(root, "plain"), os.path.join(root, "zero")
        plain = train(harness.config(w, zero1=False, weight_decay=0.1, save=plain_dir, save_interval=n),
                      return_state=True)
        zero = train(harness.config(w, zero1=True, weight_decay=0.1, save=zero_dir, save_interval=n),
                     return_state=True)
        want, got = _moments(plain_dir, n), _moments(zero_dir, n)
    harness.assert_close("loss", zero.losses, plain.losses, rtol=1e-6, atol=1e-7)
    harness.assert_close("grad_norm", zero.grad_norms, plain.grad_norms, rtol=1e-5)
    harness.assert_states_close(zero.state, plain.state, atol=1e-5)
    for kind in ("exp_avg", "exp_avg_sq"):
        scale = max(float(t.abs().max()) for t in want[kind].values())
        harness.assert_states_close(got[kind], want[kind], atol=1e-5 * scale)


def test_zero1_uneven_shard(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
