"""fp16 training with dynamic loss scaling: backoff on overflow, growth after a clean window,
overflowing steps skipped, over many steps (the scale oscillates around the overflow limit).

The run starts with a scale far above what fp16 gradients can hold, so it overflows, backs
off, grows again after every ``loss_scale_window`` clean steps, and overflows again. Checks:
the scale each iteration ran with follows the dynamic-scaling rule from the observed overflow
flags (halve on overflow, never below 1; double after a window of clean steps; the window
restarts on overflow); both backoff and growth really happened; a skipped step leaves weights
and optimizer bitwise untouched; losses and weights stay finite; clean steps' gradient norms
lie in the range of an fp32 run's (the scale was divided out).

Catches: a scaler that never backs off (every step overflows), grows on the wrong cadence or
forgets to restart its window, a step applied although its gradients overflowed (inf/nan
weights or a changed state), gradients left scaled (norms ~scale times too large).
"""

from __future__ import annotations

import math
import sys

import harness
from microllm.trainer import train

NAME = "fp16_loss_scaler_test"


def expected_scales(initial: float, window: int, skipped: list[bool]) -> list[float]:
    """The scale each iteration should run with, and the one after the last (the rule, restated)."""
    scales, scale, clean = [initial], initial, 0
    for overflow in skipped:
        if overflow:
            scale, clean = max(scale / 2.0, 1.0), 0
        else:
            clean += 1
            if clean == window:
                scale, clean = scale * 2.0, 0
        scales.append(scale)
    return scales


def check(w: harness.Workload) -> None:
    run = train(harness.config(w), return_state=True)
    n = w["train_iters"]
    assert len(run.loss_scales) == len(run.skipped) == n
    want = expected_scales(w["initial_loss_scale"], w["loss_scale_window"], run.skipped)
    assert run.loss_scales + [run.loss_scale] == want, f"scales {run.loss_scales + [run.loss_scale]} vs rule {want}"
    grew = [i for i in range(1, n) if run.loss_scales[i] > run.loss_scales[i - 1]]
    backed_off_after_growth = [i for i in range(n) if run.skipped[i] and any(g <= i for g in grew)]
    assert run.skipped[0], "the initial scale did not overflow: the workload exercises no backoff"
    assert grew and backed_off_after_growth, f"no growth-then-overflow cycle in {n} steps: {run.loss_scales}"
    assert not all(run.skipped), "every step overflowed"
    assert all(math.isfinite(x) for x in run.losses), f"non-finite loss: {run.losses}"
    assert all(math.isfinite(float(t.abs().max())) for t in run.state.values()), "non-finite weights"
    # Unscaled gradients look like fp32 ones: every clean step's norm lies within the range an
    # fp32 run of the same model sees (Adam would hide a scale left in the gradients).
    fp32 = train(harness.config(w, dtype="fp32"))
    low, high = min(fp32.grad_norms), max(fp32.grad_norms)
    norms = [g for g, s in zip(run.grad_norms, run.skipped) if not s]
    assert all(0.5 * low <= g <= 2.0 * high for g in norms), f"fp16 grad norms {norms} vs fp32 {low:.3g}..{high:.3g}"
    # A skipped step changes nothing but the scale: stopping just before it or just after it
    # gives the same weights (and the same Adam state, or the next step would differ).
    s = next((i for i in range(1, n) if run.skipped[i]), None)
    assert s is not None, "no overflow after the first step"
    before = train(harness.config(w, train_iters=s), return_state=True)
    after = train(harness.config(w, train_iters=s + 1), return_state=True)
    assert after.skipped[s] and after.loss_scale == before.loss_scale / 2.0
    harness.assert_states_equal(after.state, before.state)


def test_fp16_loss_scaler(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
