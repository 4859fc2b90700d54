"""Data parallelism (dp=2) matches dp=1 on the same global batches.

Catches: gradients summed instead of averaged, ranks reading the same slice of the batch,
a missing gradient all-reduce (replicas drift apart), loss reported from one replica only.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "dp_parity_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, dp=1), return_state=True)
    got = train(harness.config(w), return_state=True)
    harness.assert_close("loss", got.losses, ref.losses, rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm", got.grad_norms, ref.grad_norms, rtol=1e-4)
    harness.assert_states_close(got.state, ref.state, atol=2e-4)


def test_dp_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
