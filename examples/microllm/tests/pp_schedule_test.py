"""1F1B and GPipe schedules (pp=4, more microbatches than stages) train bitwise identically.

Both run the same per-microbatch computations in the same accumulation order, so any
difference is a schedule bug: warm-up / cool-down counts off by one, a backward paired with
the wrong microbatch's activations, a dropped microbatch.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "pp_schedule_test"


def check(w: harness.Workload) -> None:
    gpipe = train(harness.config(w, pipeline_schedule="gpipe"), return_state=True)
    ofob = train(harness.config(w, pipeline_schedule="1f1b"), return_state=True)
    harness.assert_runs_identical(ofob, gpipe)
    assert len(ofob.losses) == w["train_iters"]


def test_pp_schedule(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
