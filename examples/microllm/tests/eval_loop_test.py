"""The evaluation loop (pp=2) runs every ``eval_interval`` iterations, leaves training
bitwise untouched, and reports the same loss as a run that stops at that iteration.

Catches: eval consuming training samples or dropout RNG, eval left in train mode or with
gradients, evaluation at the wrong iterations.
"""

from __future__ import annotations

import math
import sys

import harness
from microllm.trainer import train

NAME = "eval_loop_test"
# The decay anchor is pinned so the short run below follows the same LR schedule.
FIXED = {"hidden_dropout": 0.1}


def check(w: harness.Workload) -> None:
    k, n = w["eval_interval"], w["train_iters"]
    DROPOUT = {**FIXED, "lr_decay_iters": n}
    with_eval = train(harness.config(w, **DROPOUT), return_state=True)
    without = train(harness.config(w, eval_interval=0, **DROPOUT), return_state=True)
    assert sorted(with_eval.eval_losses) == list(range(k, n + 1, k)), f"eval at {sorted(with_eval.eval_losses)}"
    assert all(math.isfinite(v) and v > 0 for v in with_eval.eval_losses.values())
    assert with_eval.losses == without.losses, "evaluation perturbed training"
    harness.assert_states_equal(with_eval.state, without.state)
    short = train(harness.config(w, train_iters=k, **DROPOUT))
    assert short.eval_losses[k] == with_eval.eval_losses[k], "eval loss depends on what follows it"


def test_eval_loop(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
