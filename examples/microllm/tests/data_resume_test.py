"""The data loader resumes exactly: after save/exit/resume (dp=2) the same global batches
follow, across an epoch boundary that falls inside a batch; every epoch visits each sample
once; data-parallel ranks split each global batch without overlap.

Catches: sampler position not saved, epoch reshuffle seeded from wall-clock or iteration
count, a batch lost or repeated at the epoch boundary, ranks reading the same samples.
"""

from __future__ import annotations

import sys
import tempfile

import torch

import harness
from microllm.data import SyntheticDataset, make_sampler, microbatches
from microllm.trainer import train

NAME = "data_resume_test"


def check_sampler(w: harness.Workload) -> None:
    cfg = harness.config(w)
    sampler = make_sampler(cfg)
    seen: list[int] = []
    data = SyntheticDataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_length)
    for _ in range(w["train_iters"]):
        batch = sampler.next_batch()
        seen.extend(batch)
        parts = [microbatches(data, batch, r, w["dp"], w["micro_batch_size"]) for r in range(w["dp"])]
        rows = torch.cat([mb.tokens for rank in parts for mb in rank])
        assert torch.equal(rows, torch.stack([data[i][:-1] for i in batch])), "DP slices do not tile the batch"
    n = w["num_samples"]
    for epoch_start in range(0, len(seen) - n + 1, n):
        assert sorted(seen[epoch_start:epoch_start + n]) == list(range(n)), "an epoch is not a permutation"


def check(w: harness.Workload) -> None:
    check_sampler(w)
    s = w["save_interval"]
    straight = train(harness.config(w))
    with tempfile.TemporaryDirectory(prefix="microllm-data-") as ckpt:
        first = train(harness.config(w, save=ckpt, exit_interval=s))
        resumed = train(harness.config(w, load=ckpt))
    assert first.batches == straight.batches[:s]
    assert resumed.batches == straight.batches[s:], "resumed run reads different batches"
    assert resumed.sampler_state == straight.sampler_state
    assert resumed.losses == straight.losses[s:]


def test_data_resume(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
