"""A save interrupted between its shards and the "latest" marker is never loaded as complete:
resuming after the crash continues bitwise from the previous checkpoint (tp=2 x pp=2).

The second save (iteration 2 * save_interval) is killed after every shard is on disk but
before it is published (the manifest and the marker). Checks: the crashed iteration's shards
really are on disk; the marker still names the previous iteration; resuming from it continues
bitwise like an uninterrupted run (and re-saves the crashed iteration completely); a marker
pointing at the unpublished iteration (what a save that publishes first leaves after a crash)
is refused, and so is a published iteration with one pipeline stage's shards missing.

Catches: a loader that trusts the marker or whatever shard files exist, a save that publishes
before its shards are written, resuming from a half-written iteration.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import Any, Iterator

import harness
import microllm.checkpoint as checkpoint
from microllm import CheckpointError
from microllm.trainer import train

NAME = "checkpoint_crash_test"


class SimulatedCrash(Exception):
    """The process died here."""


@contextlib.contextmanager
def crash_before_publishing(iteration: int) -> Iterator[None]:
    """Kill the run when it is about to publish ``iteration`` (all shards already written)."""
    publish = checkpoint.publish

    def dying(directory: str, it: int, ctx: Any) -> None:
        if it == iteration:
            raise SimulatedCrash(f"killed before publishing iteration {it}")
        publish(directory, it, ctx)

    checkpoint.publish = dying
    try:
        yield
    finally:
        checkpoint.publish = publish


def _refused(w: harness.Workload, directory: str) -> bool:
    try:
        train(harness.config(w, load=directory))
    except CheckpointError:
        return True
    return False


def check(w: harness.Workload) -> None:
    s, n = w["save_interval"], w["train_iters"]
    crashed_at = 2 * s
    straight = train(harness.config(w), return_state=True)
    with tempfile.TemporaryDirectory(prefix="microllm-crash-") as root:
        ckpt = os.path.join(root, "ckpt")
        try:
            with crash_before_publishing(crashed_at):
                train(harness.config(w, save=ckpt, save_interval=s))
        except SimulatedCrash:
            pass
        else:
            raise AssertionError(f"the run never reached the save of iteration {crashed_at}")
        torn = os.path.join(ckpt, f"iter_{crashed_at:07d}")
        shards = sorted(f for f in os.listdir(torn) if f.endswith(".pt"))
        assert len(shards) == w["tp"] * w["pp"], f"the crash came before the shards were written: {shards}"
        assert checkpoint.latest_iteration(ckpt) == s, f"marker at {checkpoint.latest_iteration(ckpt)}, want {s}"

        # A marker that ran ahead of its checkpoint must be refused, not loaded.
        ahead = os.path.join(root, "ahead")
        shutil.copytree(ckpt, ahead)
        with open(os.path.join(ahead, checkpoint.LATEST), "w", encoding="utf-8") as f:
            f.write(str(crashed_at))
        assert _refused(w, ahead), f"loaded iteration {crashed_at}, which was never published"
        # So must a published iteration that lost one pipeline stage's shards.
        half = os.path.join(root, "half")
        shutil.copytree(ckpt, half)
        for t in range(w["tp"]):
            os.remove(os.path.join(half, f"iter_{s:07d}", checkpoint.shard_name(t, w["pp"] - 1)))
        assert _refused(w, half), f"loaded iteration {s} with the last stage's shards missing"

        resumed = train(harness.config(w, load=ckpt, save=ckpt, save_interval=s), return_state=True)
        checkpoint.verify_complete(torn, crashed_at)  # the re-save completed the torn iteration
    assert resumed.start_iteration == s and resumed.iteration == n
    assert resumed.losses == straight.losses[s:], f"resumed {resumed.losses} vs {straight.losses[s:]}"
    assert resumed.grad_norms == straight.grad_norms[s:], "grad norms differ after resume"
    harness.assert_states_equal(resumed.state, straight.state)


def test_checkpoint_crash(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
