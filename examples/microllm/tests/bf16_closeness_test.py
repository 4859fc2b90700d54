"""bf16 compute (fp32 master weights, fp32 softmax/norm/loss) tracks fp32 training closely.

Catches: master weights or gradients kept in bf16 (updates underflow), softmax or the loss
computed in bf16, the compute dtype silently ignored (the runs must differ a little).
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "bf16_closeness_test"


def check(w: harness.Workload) -> None:
    fp32 = train(harness.config(w, dtype="fp32"), return_state=True)
    low = train(harness.config(w), return_state=True)
    assert low.losses != fp32.losses, f"{w['dtype']} run is bitwise fp32: the dtype is not applied"
    harness.assert_close("loss", low.losses, fp32.losses, rtol=0.02)
    mean_rel = sum(abs(a - b) / b for a, b in zip(low.losses, fp32.losses)) / len(fp32.losses)
    assert mean_rel < 0.005, f"mean relative loss gap {mean_rel:.4f}"
    assert all(t.dtype.is_floating_point and t.element_size() == 4 for t in low.state.values()), "master weights not fp32"


def test_bf16_closeness(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
