"""A top-k mixture of experts under tp=2 with sequence parallelism matches a single rank.

Catches: the router's replicated gradient wrongly summed over TP ranks, tokens routed
differently on different ranks, the sequence gather for routing paired with the wrong
backward, the load-balancing loss gradient scaled by the wrong microbatch count.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "moe_parity_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, tp=1, moe_aux_loss_coeff=0.05), return_state=True)
    got = train(harness.config(w, sequence_parallel=True, moe_aux_loss_coeff=0.05), return_state=True)
    harness.assert_close("loss", got.losses, ref.losses, rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm", got.grad_norms, ref.grad_norms, rtol=1e-4)
    harness.assert_states_close(got.state, ref.state, atol=2e-4)


def test_moe_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
