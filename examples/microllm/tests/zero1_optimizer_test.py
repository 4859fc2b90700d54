"""The ZeRO-1 sharded optimizer (dp=2) matches plain data-parallel AdamW.

Catches: shard offsets or padding off by one, a missing parameter all-gather, gradients not
averaged in the reduce-scatter, weight decay applied to the wrong elements of the flat buffer,
the global norm not summed over the data-parallel shards.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "zero1_optimizer_test"


def check(w: harness.Workload) -> None:
    plain = train(harness.config(w, zero1=False, weight_decay=0.1), return_state=True)
    zero = train(harness.config(w, zero1=True, weight_decay=0.1), return_state=True)
    harness.assert_close("loss", zero.losses, plain.losses, rtol=1e-6, atol=1e-7)
    harness.assert_close("grad_norm", zero.grad_norms, plain.grad_norms, rtol=1e-5)
    harness.assert_states_close(zero.state, plain.state, atol=1e-5)


def test_zero1_optimizer(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
