"""Training converges: within ``train_iters`` steps the loss falls from about ln(vocab) to
below ``loss_threshold`` (calibrated at this full workload; never reduced).

Catches: anything that silently stops learning — a detached residual, a wrong causal mask that
leaks or hides the context, labels not shifted, a broken optimizer update.
"""

from __future__ import annotations

import math
import sys

import harness
from microllm.trainer import train

NAME = "convergence_test"


def check(w: harness.Workload) -> None:
    run = train(harness.config(w, lr=0.01, min_lr=0.001, warmup_iters=5))
    start, end = run.losses[0], sum(run.losses[-5:]) / len(run.losses[-5:])
    assert start > 0.9 * math.log(w["vocab_size"]), f"initial loss {start:.3f} is not near ln(vocab)"
    assert end < w["loss_threshold"], f"mean loss of the last 5 steps {end:.3f} >= {w['loss_threshold']}"


def test_convergence(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
