"""Training throughput stays above its floor (a performance check; never reduced).

On CPU the floor is the declared ``min_tokens_per_s``; on another device it is that device's
recorded reference (``golden/throughput_test.<kind>.json``: 0.4 of the throughput measured
when it was recorded, ``MICROLLM_REGEN_GOLDEN=1`` on that device), and a device without one
fails with the command that records it.

The floor is set well below what this workload reaches on one CPU core so that a noisy shared
machine passes, while a real slowdown (e.g. recomputing everything, a quadratic loop, an
accidental fp64 path) fails.
"""

from __future__ import annotations

import json
import os
import sys

import harness
from microllm.trainer import train

NAME = "throughput_test"


#: A recorded floor is this fraction of the throughput measured when it was recorded (the CPU
#: floor, 2000, is about 0.4 of the ~5000 tokens/s one core reaches).
FLOOR_FRACTION = 0.4


def floor_for(w: harness.Workload, kind: str) -> float:
    """The floor on ``kind``: the declared ``min_tokens_per_s`` on CPU, the device's recorded
    reference elsewhere (a CPU floor says nothing about a GPU's speed)."""
    if kind == "cpu":
        return float(w["min_tokens_per_s"])
    path = harness.reference_path(NAME, kind)
    assert path.is_file(), harness.missing_reference(NAME, path, kind)
    ref = json.loads(path.read_text(encoding="utf-8"))
    frozen = {k: v for k, v in ref["workload"].items() if k != "min_tokens_per_s"}
    moved = {k: (w.get(k), v) for k, v in frozen.items() if w.get(k) != v}
    assert not moved, f"the {kind} floor was recorded at another workload: {moved}"
    return float(ref["min_tokens_per_s"])


def check(w: harness.Workload) -> None:
    refused = harness.regen_refusal(NAME)
    if refused:
        raise SystemExit(refused)
    kind = harness.device_kind()
    regen = os.environ.get("MICROLLM_REGEN_GOLDEN") == "1" and kind != "cpu"
    floor = 0.0 if regen else floor_for(w, kind)
    train(harness.config(w, train_iters=2))  # warm up allocator and kernels
    run = train(harness.config(w))
    if regen:
        path = harness.reference_path(NAME, kind)
        path.write_text(json.dumps({"workload": w, "device": kind, "measured_tokens_per_s": round(run.tokens_per_s),
                                    "min_tokens_per_s": round(FLOOR_FRACTION * run.tokens_per_s)}, indent=1) + "\n",
                        encoding="utf-8")
        print(f"wrote {path}")
        return
    print(f"throughput: {run.tokens_per_s:.0f} tokens/s (floor {floor:.0f} on {kind})")
    assert run.tokens_per_s >= floor, f"{run.tokens_per_s:.0f} tokens/s < {floor:.0f} on {kind}"


def test_throughput(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
