"""Real multi-process tensor parallelism (torch.distributed gloo, 2 processes on 127.0.0.1)
is bitwise identical to the in-process simulated ranks.

With two ranks an all-reduce is a single commutative addition, so both back ends must agree
exactly. Catches: gloo group construction, p2p/collective wrappers, state not shipped back.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "gloo_parity_test"


def check(w: harness.Workload) -> None:
    sim = train(harness.config(w, backend="sim"), return_state=True)
    real = train(harness.config(w, backend="gloo"), return_state=True)
    harness.assert_runs_identical(real, sim)


def test_gloo_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
