"""The math, SDPA and chunked (online-softmax) attention kernels agree, forward and backward,
for full causal attention and for decode-shaped queries with an offset, and in training.

The sequence is longer than two chunks and not a multiple of the chunk size, so the chunked
kernel's running-max rescaling and its ragged last block are exercised.
Catches: a missing rescale of the accumulator, a top-left aligned causal mask, a wrong scale.
"""

from __future__ import annotations

import sys

import torch

import harness
from microllm.model.attention import chunked_attention, math_attention, sdpa_attention
from microllm.trainer import train

NAME = "attention_impl_parity_test"


def _kernels(chunk: int) -> dict[str, object]:
    return {
        "sdpa": lambda q, k, v, off: sdpa_attention(q, k, v, off),
        "chunked": lambda q, k, v, off: chunked_attention(q, k, v, off, chunk),
    }


def check_kernels(w: harness.Workload) -> None:
    gen = torch.Generator().manual_seed(0)
    heads, seq = w["num_heads"], w["seq_length"]
    shape = (w["micro_batch_size"], heads, seq, w["hidden_size"] // heads)
    dev = harness.device()  # drawn in host memory (same values on every device), checked on the device
    q, k, v = (torch.randn(shape, generator=gen).to(dev) for _ in range(3))
    upstream = torch.randn(shape, generator=gen).to(dev)
    for q_len in (seq, 5):  # full causal, then decode-shaped (last 5 queries, all keys)
        off = seq - q_len
        inputs = [t.clone().requires_grad_() for t in (q[..., off:, :], k, v)]
        want = math_attention(*inputs, off)
        want.backward(upstream[..., off:, :])
        want_grads = [t.grad for t in inputs]
        for name, fn in _kernels(w["attention_chunk"]).items():
            mine = [t.detach().clone().requires_grad_() for t in inputs]
            got = fn(*mine, off)
            got.backward(upstream[..., off:, :])
            assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), f"{name} forward (q_len={q_len})"
            for label, a, b in zip("qkv", mine, want_grads):
                assert torch.allclose(a.grad, b, atol=2e-5, rtol=1e-4), f"{name} d{label} (q_len={q_len})"


def check(w: harness.Workload) -> None:
    check_kernels(w)
    runs = {impl: train(harness.config(w, attention_impl=impl)) for impl in ("math", "sdpa", "chunked")}
    for impl in ("sdpa", "chunked"):
        harness.assert_close(f"{impl} loss", runs[impl].losses, runs["math"].losses, rtol=1e-5, atol=1e-6)
        harness.assert_close(f"{impl} grad_norm", runs[impl].grad_norms, runs["math"].grad_norms, rtol=1e-4)


def test_attention_impl_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
