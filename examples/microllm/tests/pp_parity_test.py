"""Pipeline parallelism (pp=2, 1F1B) matches a single-stage reference.

Catches: activations or gradients sent to the wrong stage or microbatch, a layer assigned to
two stages or none, loss scaling by the wrong number of microbatches, norms summed per stage.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "pp_parity_test"


def check(w: harness.Workload) -> None:
    ref = train(harness.config(w, pp=1), return_state=True)
    got = train(harness.config(w, pipeline_schedule="1f1b"), return_state=True)
    harness.assert_close("loss", got.losses, ref.losses, rtol=1e-6, atol=1e-7)
    harness.assert_close("grad_norm", got.grad_norms, ref.grad_norms, rtol=1e-5)
    harness.assert_states_close(got.state, ref.state, atol=1e-5)


def test_pp_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
