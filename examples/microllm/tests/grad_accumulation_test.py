"""Gradient accumulation over microbatches equals one big batch.

Catches: each microbatch's loss not divided by the number of microbatches, gradients zeroed
between microbatches, the last microbatch dropped.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "grad_accumulation_test"


def check(w: harness.Workload) -> None:
    whole = train(harness.config(w, micro_batch_size=w["global_batch_size"]), return_state=True)
    accumulated = train(harness.config(w), return_state=True)
    harness.assert_close("loss", accumulated.losses, whole.losses, rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm", accumulated.grad_norms, whole.grad_norms, rtol=1e-4)
    harness.assert_states_close(accumulated.state, whole.state, atol=2e-4)


def test_grad_accumulation(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
