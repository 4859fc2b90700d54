"""Save at ``save_interval``, exit, resume: the resumed run continues bitwise exactly like an
uninterrupted one (tp=2 x pp=2, dropout on, one shard file per model-parallel rank).

Catches: optimizer moments or step count not restored, dropout RNG or sampler position lost,
the wrong iteration resumed, shards written by the wrong rank.
"""

from __future__ import annotations

import os
import sys
import tempfile

import harness
from microllm.checkpoint import latest_iteration
from microllm.trainer import train

NAME = "checkpoint_resume_test"
DROPOUT = {"hidden_dropout": 0.1, "attention_dropout": 0.1}


def check(w: harness.Workload) -> None:
    s = w["save_interval"]
    straight = train(harness.config(w, **DROPOUT), return_state=True)
    with tempfile.TemporaryDirectory(prefix="microllm-ckpt-") as ckpt:
        first = train(harness.config(w, save=ckpt, exit_interval=s, **DROPOUT))
        assert first.iteration == s and latest_iteration(ckpt) == s
        shards = [f for f in os.listdir(os.path.join(ckpt, f"iter_{s:07d}")) if f.endswith(".pt")]
        assert len(shards) == w["tp"] * w["pp"], f"expected one shard per model-parallel rank: {shards}"
        resumed = train(harness.config(w, load=ckpt, **DROPOUT), return_state=True)
    assert first.losses == straight.losses[:s], "losses before the checkpoint differ"
    assert resumed.start_iteration == s and resumed.iteration == w["train_iters"]
    assert resumed.losses == straight.losses[s:], f"resumed {resumed.losses} vs {straight.losses[s:]}"
    assert resumed.grad_norms == straight.grad_norms[s:], "grad norms differ after resume"
    harness.assert_states_equal(resumed.state, straight.state)


def test_checkpoint_resume(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
