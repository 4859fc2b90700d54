"""A checkpoint saved at tp x pp loads into load_tp x load_pp (weights and Adam moments
resharded, vocabulary padding re-cut) and training continues as if never interrupted.

Catches: shards concatenated in the wrong order or on the wrong axis, vocabulary padding kept
from the old layout, optimizer moments not resharded with their parameters, layers renumbered
wrongly across pipeline stages.
"""

from __future__ import annotations

import sys
import tempfile

import harness
from microllm.trainer import train

NAME = "checkpoint_reshard_test"


def check(w: harness.Workload) -> None:
    s = w["save_interval"]
    straight = train(harness.config(w), return_state=True)
    with tempfile.TemporaryDirectory(prefix="microllm-reshard-") as ckpt:
        train(harness.config(w, save=ckpt, exit_interval=s))
        target = harness.config(w, tp=w["load_tp"], pp=w["load_pp"], load=ckpt)
        resumed = train(target, return_state=True)
    assert resumed.start_iteration == s
    harness.assert_close("loss after reshard", resumed.losses, straight.losses[s:], rtol=1e-5, atol=1e-6)
    harness.assert_close("grad_norm after reshard", resumed.grad_norms, straight.grad_norms[s:], rtol=1e-4)
    harness.assert_states_close(resumed.state, straight.state, atol=2e-4)


def test_checkpoint_reshard(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
