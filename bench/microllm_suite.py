"""Time the microllm suite at full workload and at floors, side by side.

Each test runs as its own process (``<venv python> examples/microllm/tests/<name>.py``, the
same main Bazel's gpu_test launcher runs) with ``OMP_NUM_THREADS=1``; floors are passed as
``--<dim>=<floor>`` flags. Budgets checked (this 2-core machine): each test 5-40 s at full
workload and under ~3 s at floors; the whole suite under 10 min at full and 2 min at floors
(serial sums here; Bazel runs tests side by side).

    python -m bench.microllm_suite [--floors-only] [--only NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "examples" / "microllm" / "tests"
PYTHON = ROOT / ".venv" / "bin" / "python"
FULL_RANGE_S = (5.0, 40.0)
FLOOR_MAX_S = 3.0
SUITE_FULL_MAX_S = 600.0
SUITE_FLOOR_MAX_S = 120.0


def load_suite() -> dict[str, dict]:
    tree = ast.parse((TESTS / "suite.bzl").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SUITE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("suite.bzl has no SUITE")


def flags(values: dict) -> list[str]:
    return [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(values.items())]


def run_one(name: str, values: dict) -> tuple[float, bool, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("FASTCI_WORKLOAD", None)
    python = str(PYTHON) if PYTHON.exists() else sys.executable
    began = time.perf_counter()
    proc = subprocess.run([python, str(TESTS / f"{name}.py"), *flags(values)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - began
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return elapsed, proc.returncode == 0, tail[0][:160]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.microllm_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--floors-only", action="store_true", help="time the floor runs only")
    parser.add_argument("--only", nargs="*", default=[], help="test names to time")
    parser.add_argument("--json", help="also write the measurements to this JSON file")
    args = parser.parse_args(argv)
    suite = load_suite()
    names = [n for n in suite if not args.only or n in args.only]
    rows = []
    print(f"{'test':32} {'gpus':>4} {'full_s':>8} {'floor_s':>8}  notes", flush=True)
    for name in names:
        spec = suite[name]
        full = None if args.floors_only else run_one(name, spec["workload"])
        floor = run_one(name, {**spec["workload"], **spec["floors"]})
        notes = []
        if full and not full[1]:
            notes.append(f"FULL FAILED: {full[2]}")
        if not floor[1]:
            notes.append(f"FLOOR FAILED: {floor[2]}")
        if full and not FULL_RANGE_S[0] <= full[0] <= FULL_RANGE_S[1]:
            notes.append(f"full outside {FULL_RANGE_S[0]:.0f}-{FULL_RANGE_S[1]:.0f}s")
        if floor[0] > FLOOR_MAX_S:
            notes.append("floor > 3s" + (" (never reduced)" if not spec["floors"] else ""))
        full_s = f"{full[0]:8.1f}" if full else f"{'-':>8}"
        print(f"{name:32} {spec['gpus']:>4} {full_s} {floor[0]:8.1f}  {'; '.join(notes)}", flush=True)
        rows.append({"test": name, "gpus": spec["gpus"], "full_s": full[0] if full else None,
                     "full_ok": full[1] if full else None, "floor_s": floor[0], "floor_ok": floor[1]})
    total_full = sum(r["full_s"] or 0.0 for r in rows)
    total_floor = sum(r["floor_s"] for r in rows)
    if not args.floors_only:
        print(f"{'TOTAL (serial)':32} {'':>4} {total_full:8.1f} {total_floor:8.1f}  "
              f"budget full <= {SUITE_FULL_MAX_S:.0f}s, floors <= {SUITE_FLOOR_MAX_S:.0f}s")
    else:
        print(f"{'TOTAL (serial)':32} {'':>4} {'-':>8} {total_floor:8.1f}  budget floors <= {SUITE_FLOOR_MAX_S:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "total_full_s": total_full,
                                               "total_floor_s": total_floor}, indent=1), encoding="utf-8")
    failed = any(r["full_ok"] is False or not r["floor_ok"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
