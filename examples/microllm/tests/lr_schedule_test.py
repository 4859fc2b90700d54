"""The learning-rate schedule the trainer applies: linear warmup, cosine decay anchored at
``lr_decay_iters``, so a shortened run follows the full run's curve instead of compressing it.

Catches: decay anchored at ``train_iters`` (the LR-schedule trap that breaks shortened golden
runs), warmup off by one, the schedule not reaching ``min_lr`` at the anchor.
"""

from __future__ import annotations

import math
import sys

import harness
from microllm.optim import lr_at
from microllm.trainer import train

NAME = "lr_schedule_test"


def check(w: harness.Workload) -> None:
    cfg = harness.config(w)
    opt, n, warmup, anchor = cfg.optimizer, w["train_iters"], w["warmup_iters"], w["lr_decay_iters"]
    full = train(cfg)
    assert full.lrs == [lr_at(i, opt, anchor) for i in range(n)]
    for i in range(warmup):
        assert math.isclose(full.lrs[i], opt.lr * (i + 1) / warmup), f"warmup lr[{i}] = {full.lrs[i]}"
    after = full.lrs[warmup - 1:]
    assert all(a >= b for a, b in zip(after, after[1:])), "lr increases after warmup"
    assert full.lrs[-1] > opt.min_lr, "decay finished before lr_decay_iters"
    assert lr_at(anchor, opt, anchor) == opt.min_lr
    midpoint = warmup + (anchor - warmup) / 2
    if midpoint.is_integer():
        assert math.isclose(lr_at(int(midpoint), opt, anchor), (opt.lr + opt.min_lr) / 2)
    half = n // 2
    short = train(harness.config(w, train_iters=half))
    assert short.lrs == full.lrs[:half], "a shorter run compresses the anchored schedule"
    assert short.losses == full.losses[:half]
    unanchored = train(harness.config(w, train_iters=half, lr_decay_iters=0))
    assert unanchored.lrs[-1] < short.lrs[-1], "without an anchor the schedule should compress"


def test_lr_schedule(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
