"""What keeping autograd on the recording thread costs (issue 32 item 1).

``python -m bench.autograd_switch [--rounds 3] [--test convergence_test]`` trains one
microllm test's model (its declared workload) in a fresh process per measurement, three
ways, alternating, best of ``--rounds``:

* ``plain``: no recorder;
* ``recorded``: FastCI's recorder, autograd multithreading off (what records now);
* ``no-switch``: the recorder with :class:`~fastci.evidence.record.autograd.AutogradSwitch`
  made a no-op (what recorded before).

The time is the test's body (recorder start to stop included), not the interpreter's
start: wall seconds (the cost percentages) and the process's CPU seconds (steadier on a
shared machine). On CPU autograd runs backward on the calling thread either way, so the last two
should match; on CUDA the switch moves backward off torch's device threads, which is the
number that matters (``make gpu-check`` runs this with ``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICROLLM = ROOT / "examples" / "microllm"

# One measurement: argv = mode, test name, device, trace dir. Prints wall and CPU seconds.
_BODY = '''
import importlib, sys, time
from pathlib import Path
mode, name, device, out = sys.argv[1:5]
import harness
import torch
from fastci.evidence.record import autograd as _switch
if mode == "no-switch":
    _switch.AutogradSwitch.start = lambda self: None
    _switch.AutogradSwitch.on_import = lambda self: None
mod = importlib.import_module(name)
w = harness.resolve(name)
if device != "cpu":
    torch.set_default_device(device)
t0, c0 = time.perf_counter(), time.process_time()
rec = None
if mode != "plain":
    from fastci.evidence.record.recorder import Recorder
    rec = Recorder(name, Path(out), repo_root=Path.cwd().parents[1], workload=w, gpus=0)
    rec.start()
mod.check(w)
if device != "cpu":
    torch.cuda.synchronize()
if rec is not None:
    rec.stop("passed")
print(time.perf_counter() - t0, time.process_time() - c0)
'''

MODES = ("plain", "recorded", "no-switch")


def measure(mode: str, test: str, device: str, out: str) -> tuple[float, float]:
    """Wall and CPU seconds one fresh process spends in the test body under ``mode``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(MICROLLM / "tests"), str(MICROLLM), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    res = subprocess.run([sys.executable, "-c", _BODY, mode, test, device, out],
                         cwd=MICROLLM / "tests", env=env, capture_output=True, text=True,
                         timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{mode} run failed: {res.stderr.strip().splitlines()[-1:]}")
    wall, cpu = res.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main(argv: list[str] | None = None) -> int:
    """Print the best of ``--rounds`` per mode, and the switch's cost, as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--test", default="convergence_test")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    best = {m: float("inf") for m in MODES}
    cpu = {m: float("inf") for m in MODES}
    with tempfile.TemporaryDirectory(prefix="fastci-switch-") as out:
        for _ in range(args.rounds):
            for mode in MODES:
                wall, used = measure(mode, args.test, args.device, out)
                best[mode], cpu[mode] = min(best[mode], wall), min(cpu[mode], used)
    report = {"test": args.test, "device": args.device, "rounds": args.rounds,
              "best_wall_s": {m: round(v, 3) for m, v in best.items()},
              "best_cpu_s": {m: round(v, 3) for m, v in cpu.items()},
              "switch_cost_pct": round(100 * (best["recorded"] / best["no-switch"] - 1), 1),
              "recording_cost_pct": round(100 * (best["recorded"] / best["plain"] - 1), 1)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
