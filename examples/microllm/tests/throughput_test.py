"""Training throughput stays above ``min_tokens_per_s`` (a performance floor; never reduced).

The floor is set well below what this workload reaches on one CPU core so that a noisy shared
machine passes, while a real slowdown (e.g. recomputing everything, a quadratic loop, an
accidental fp64 path) fails.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "throughput_test"


def check(w: harness.Workload) -> None:
    train(harness.config(w, train_iters=2))  # warm up allocator and kernels
    run = train(harness.config(w))
    print(f"throughput: {run.tokens_per_s:.0f} tokens/s (floor {w['min_tokens_per_s']:.0f})")
    assert run.tokens_per_s >= w["min_tokens_per_s"], f"{run.tokens_per_s:.0f} tokens/s < {w['min_tokens_per_s']}"


def test_throughput(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
