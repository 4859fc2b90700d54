"""The loss curve (tp=2) matches the recorded golden curve step by step.

Absolute: the golden was recorded at the full workload. ``train_iters`` may shrink (the
prefix is compared) because the schedule is anchored at ``lr_decay_iters``; every other
dimension is frozen and checked against the golden's. Regenerate with
``MICROLLM_REGEN_GOLDEN=1`` after an intended numerical change.
Catches: any numerical change to the model, data, init or optimizer.
"""

from __future__ import annotations

import json
import os
import sys

import harness
from microllm.trainer import train

NAME = "golden_loss_test"
GOLDEN = harness.GOLDEN_DIR / "golden_loss_test.json"
RTOL = 1e-3  # CPU kernels and CUDA kernels differ in the last bits; a real change is larger


def check(w: harness.Workload) -> None:
    run = train(harness.config(w))
    if os.environ.get("MICROLLM_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({"workload": w, "losses": run.losses}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN}")
        return
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    frozen = {k: v for k, v in golden["workload"].items() if k != "train_iters"}
    mismatched = {k: (w[k], v) for k, v in frozen.items() if w.get(k) != v}
    assert not mismatched, f"golden was recorded at another workload: {mismatched}"
    n = w["train_iters"]
    assert n <= len(golden["losses"]), f"golden has only {len(golden['losses'])} steps"
    harness.assert_close("loss vs golden", run.losses, golden["losses"][:n], rtol=RTOL)


def test_golden_loss(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
