from __future__ import annotations

import torch

from microllm.config import DataConfig
from microllm.data import ResumableSampler, SyntheticDataset


def test_samples_are_deterministic_and_learnable() -> None:
    data = SyntheticDataset(DataConfig(noise=0.0), vocab_size=50, seq_length=16)
    a, b = data[3], data[3]
    assert torch.equal(a, b) and a.shape == (17,)
    stride = (a[1] - a[0]) % 50
    assert torch.equal((a[1:] - a[:-1]) % 50, torch.full((16,), int(stride)))
    valid = SyntheticDataset(DataConfig(noise=0.0), vocab_size=50, seq_length=16, split="valid")
    assert not torch.equal(valid[3], a)


def test_sampler_resume_across_epoch_boundary() -> None:
    straight = ResumableSampler(num_samples=10, global_batch_size=4, seed=3)
    batches = [straight.next_batch() for _ in range(6)]
    assert sorted(batches[0] + batches[1] + batches[2][:2]) == list(range(10))
    first = ResumableSampler(num_samples=10, global_batch_size=4, seed=3)
    for _ in range(3):
        first.next_batch()
    resumed = ResumableSampler(num_samples=10, global_batch_size=4, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert [resumed.next_batch() for _ in range(3)] == batches[3:]
    assert resumed.state_dict() == straight.state_dict()
