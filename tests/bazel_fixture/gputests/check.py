"""Shared body of the fixture's trivial gpu_tests: checks what the launcher passed."""

import argparse
import json
import os
import sys
import time


def run() -> None:
    workload = json.loads(os.environ["FASTCI_WORKLOAD"])
    parser = argparse.ArgumentParser()
    for dim in workload:
        parser.add_argument("--" + dim, required=True)
    flags, rest = parser.parse_known_args()
    # Flags and FASTCI_WORKLOAD agree (bools are rendered true/false).
    for dim, value in workload.items():
        expected = ("true" if value else "false") if isinstance(value, bool) else str(value)
        assert getattr(flags, dim) == expected, (dim, getattr(flags, dim), expected)
    assert "CUDA_VISIBLE_DEVICES" in os.environ
    out = os.environ["TEST_UNDECLARED_OUTPUTS_DIR"]
    start = time.time()
    time.sleep(float(os.environ.get("FIXTURE_SLEEP_S", "0")))
    with open(os.path.join(out, "fixture_run.json"), "w") as f:
        json.dump({"start": start, "end": time.time(), "argv": sys.argv[1:], "rest": rest,
                   "cuda": os.environ["CUDA_VISIBLE_DEVICES"]}, f)
    print("fixture test ran with", sys.argv[1:])
