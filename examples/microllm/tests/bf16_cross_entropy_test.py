"""The vocab-parallel cross entropy on bf16 logits matches an fp64 reference, at tp=1 and tp=2.

The logits are bf16 with a large offset and spread (``logit_scale``), the regime of real
language-model heads late in training: an fp32 ``exp`` without subtracting the row maximum
overflows, and bf16 arithmetic (8 significant bits) loses the loss in its third digit. The
reference is float64 log-softmax of the *same* bf16 values, so only the kernel's own
arithmetic is judged. Checks, per token: the loss within fp32 rounding (rtol 1e-5); the
gradient (returned in bf16) within bf16 rounding of the reference plus fp32 noise; padded
vocabulary columns get exactly zero gradient; tp=2 (vocabulary split across ranks, maxima and
sums all-reduced) meets the same bounds.

Catches: the loss or softmax computed in the logits' dtype (bf16), a missing max subtraction,
the max or the sum not all-reduced over the vocabulary shards, padded columns not masked,
the gradient not scaled by the incoming gradient.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import harness
from microllm.parallel.comm import ParallelContext, launch
from microllm.parallel.tensor_parallel import vocab_parallel_cross_entropy

NAME = "bf16_cross_entropy_test"
OFFSET = 120.0  # exp(120) overflows fp32: only a max-subtracted softmax survives


def _kernel(ctx: ParallelContext, logits: torch.Tensor, target: torch.Tensor, upstream: torch.Tensor,
            vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's per-token loss and its vocabulary slice of the logits' gradient."""
    dev = ctx.device  # the inputs are made in host memory; the kernel runs on the rank's device
    local = logits.chunk(ctx.tp, dim=-1)[ctx.tp_rank].to(dev, copy=True).requires_grad_(True)
    loss = vocab_parallel_cross_entropy(local, target.to(dev), ctx.tp_group, vocab)
    loss.backward(upstream.to(dev))
    assert local.grad is not None and local.grad.dtype == torch.bfloat16, "gradient not in the logits' dtype"
    return loss.detach().cpu(), local.grad.cpu()


def check(w: harness.Workload) -> None:
    cfg = harness.config(w)
    vocab, padded = w["vocab_size"], cfg.padded_vocab_size
    gen = torch.Generator().manual_seed(11)
    shape = (w["micro_batch_size"], w["seq_length"])
    logits = (torch.randn(shape + (padded,), generator=gen) * w["logit_scale"] + OFFSET).to(torch.bfloat16)
    target = torch.randint(0, vocab, shape, generator=gen)
    upstream = torch.rand(shape, generator=gen) + 0.5
    # Reference: float64 on the same bf16 values, over the real vocabulary only.
    x = logits[..., :vocab].double()
    ref_loss = torch.logsumexp(x, dim=-1) - x.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    ref_grad = torch.softmax(x, dim=-1)
    ref_grad.scatter_add_(-1, target.unsqueeze(-1), -torch.ones(shape + (1,), dtype=torch.float64))
    ref_grad = ref_grad * upstream.double().unsqueeze(-1)
    grad_bound = 2.0**-8 * ref_grad.abs() + 1e-6 * float(ref_grad.abs().max())
    for tp in sorted({1, w["tp"]}):
        results: list[Any] = launch(_kernel, harness.config(w, tp=tp).parallel, logits, target, upstream, vocab)
        loss = results[0][0].double()
        grad = torch.cat([g for _, g in results], dim=-1).double()
        assert all(torch.equal(r[0], results[0][0]) for r in results), f"tp={tp}: ranks disagree on the loss"
        err = (loss - ref_loss).abs()
        worst = int(err.argmax())
        assert bool((err <= 1e-5 * ref_loss.abs() + 1e-6).all()), \
            f"tp={tp}: loss {float(loss.flatten()[worst])!r} vs fp64 {float(ref_loss.flatten()[worst])!r}"
        assert bool((grad[..., vocab:] == 0).all()), f"tp={tp}: padded vocabulary columns got a gradient"
        gerr = (grad[..., :vocab] - ref_grad).abs()
        assert bool((gerr <= grad_bound).all()), \
            f"tp={tp}: gradient off by {float(gerr.max()):.3g} (bound {float(grad_bound.flatten()[int(gerr.argmax())]):.3g})"


def test_bf16_cross_entropy(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
