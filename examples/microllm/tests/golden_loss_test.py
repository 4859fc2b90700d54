"""The loss curve (tp=2) matches the recorded golden curve step by step.

Absolute: the golden was recorded at the full workload. ``train_iters`` may shrink (the
prefix is compared) because the schedule is anchored at ``lr_decay_iters``; every other
dimension is frozen and checked against the golden's. Regenerate with
``MICROLLM_REGEN_GOLDEN=1`` after an intended numerical change.

Per device: the golden of the device the test runs on (``harness.reference_path``:
``golden/golden_loss_test.json`` on CPU, ``golden/golden_loss_test.cuda.json`` on CUDA). A
device without one fails with the command that records it there; it never falls back to
another device's curve.
Catches: any numerical change to the model, data, init or optimizer.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

import harness
from microllm.trainer import train

NAME = "golden_loss_test"
RTOL = 1e-3  # thread counts and kernel choices change the last bits; a real change is larger


def regen_refusal(env: Mapping[str, str] | None = None) -> str | None:
    """Why ``MICROLLM_REGEN_GOLDEN=1`` is refused here (``harness.regen_refusal``), or None."""
    return harness.regen_refusal(NAME, env)


def check(w: harness.Workload) -> None:
    refused = regen_refusal()
    if refused:
        raise SystemExit(refused)
    kind = harness.device_kind()
    path = harness.reference_path(NAME, kind)
    regen = os.environ.get("MICROLLM_REGEN_GOLDEN") == "1"
    assert regen or path.is_file(), harness.missing_reference(NAME, path, kind)
    run = train(harness.config(w))
    if regen:
        path.write_text(json.dumps({"workload": w, "device": kind, "losses": run.losses}, indent=1) + "\n",
                        encoding="utf-8")
        print(f"wrote {path}")
        return
    golden = json.loads(path.read_text(encoding="utf-8"))
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
