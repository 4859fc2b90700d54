"""Sequence parallelism (tp=2, SwiGLU) matches both plain tp=2 and a single-rank reference.

Catches: a wrong all-gather / reduce-scatter pairing, a missing all-reduce of the norm weights'
partial gradients (each rank only sees part of the sequence), sharded-activation dropout
streams, wrong p2p shapes.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "sp_parity_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, tp=1, activation="swiglu"), return_state=True)
    tp_only = train(harness.config(w, activation="swiglu"), return_state=True)
    sp = train(harness.config(w, activation="swiglu", sequence_parallel=True), return_state=True)
    for name, run in (("tp", tp_only), ("tp+sp", sp)):
        harness.assert_close(f"{name} loss", run.losses, ref.losses, rtol=1e-5, atol=1e-6)
        harness.assert_close(f"{name} grad_norm", run.grad_norms, ref.grad_norms, rtol=1e-4)
        harness.assert_states_close(run.state, ref.state, atol=2e-4)


def test_sp_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
