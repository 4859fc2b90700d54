"""tp=2 x pp=2 x dp=2 with sequence parallelism and ZeRO-1 matches a single-rank reference.

Catches interactions the one-dimensional parity tests miss: groups built over the wrong ranks,
the gradient norm reduced over the wrong groups, pipeline p2p shapes under sequence parallelism.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "parallel_3d_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, tp=1, pp=1, dp=1), return_state=True)
    got = train(harness.config(w, sequence_parallel=True, zero1=True), return_state=True)
    harness.assert_close("loss", got.losses, ref.losses, rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm", got.grad_norms, ref.grad_norms, rtol=1e-4)
    harness.assert_states_close(got.state, ref.state, atol=2e-4)


def test_parallel_3d(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
