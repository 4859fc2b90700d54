"""``python -m microllm.train`` runs end to end: trains, evaluates, saves, exits at the exit
interval, resumes from the checkpoint, and writes the metrics JSON.

Catches: a flag that no longer reaches its config field, metrics not written, the CLI's
resume path (``--load``) broken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import harness
from microllm.train import main as cli_main

NAME = "train_cli_smoke_test"


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    # The child runs the microllm beside this suite too, installed or not (harness.PACKAGE_ROOT).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (harness.PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-m", "microllm.train", *args], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-800:]}"
    return proc


def check(w: harness.Workload) -> None:
    flags = [f"--{k}={v}" for k, v in w.items()]
    s, n = w["save_interval"], w["train_iters"]
    with tempfile.TemporaryDirectory(prefix="microllm-cli-") as tmp:
        ckpt, m1, m2 = os.path.join(tmp, "ckpt"), os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")
        out = _run(flags + [f"--save={ckpt}", f"--exit_interval={s}", f"--metrics_path={m1}"])
        assert f"iterations 0->{s}" in out.stdout, out.stdout
        # The resume goes through the same entry point in-process (one torch import fewer).
        assert cli_main(flags + [f"--load={ckpt}", f"--metrics_path={m2}", "--deterministic=true"]) == 0
        first, second = (json.loads(open(p, encoding="utf-8").read()) for p in (m1, m2))
    assert first["config"]["model"]["num_layers"] == w["num_layers"]
    assert first["config"]["parallel"]["tp"] == w["tp"]
    assert len(first["losses"]) == s and second["start_iteration"] == s and len(second["losses"]) == n - s
    assert all(loss > 0 for loss in first["losses"] + second["losses"])
    evals = sorted(int(k) for k in {**first["eval_losses"], **second["eval_losses"]})
    assert evals == list(range(w["eval_interval"], n + 1, w["eval_interval"])), evals


def test_train_cli_smoke(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
