"""Tensor parallelism (tp=2, GELU MLP, padded vocabulary) matches a single-rank reference.

Catches: a missing/extra all-reduce in column/row-parallel linears or the vocab-parallel
embedding, a wrong QKV head split, vocab-padding leaking into the softmax, replicated norm
weights double-counted in the global gradient norm (grad norms are compared).
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "tp_parity_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, tp=1, activation="gelu"), return_state=True)
    got = train(harness.config(w, activation="gelu"), return_state=True)
    harness.assert_close("loss", got.losses, ref.losses, rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm", got.grad_norms, ref.grad_norms, rtol=1e-4)
    harness.assert_states_close(got.state, ref.state, atol=2e-4)


def test_tp_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
