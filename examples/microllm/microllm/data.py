"""A learnable synthetic dataset and a resumable global-batch sampler.

Sample ``i`` is an arithmetic progression modulo the vocabulary with a per-sample stride and a
little token noise: a model must read the context to infer the stride, so the loss falls from
``ln(vocab)`` towards the noise floor as it learns. Samples are a pure function of
``(data_seed, split, i)``, and the sampler's position is two integers, so resumption is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from microllm.config import Config, DataConfig
from microllm.parallel.pipeline import Microbatch


class SyntheticDataset:
    """``num_samples`` token sequences of ``seq_length + 1`` tokens."""

    def __init__(self, cfg: DataConfig, vocab_size: int, seq_length: int, split: str = "train") -> None:
        self.cfg, self.vocab_size, self.seq_length = cfg, vocab_size, seq_length
        self.split_offset = {"train": 0, "valid": 1}[split]

    def __len__(self) -> int:
        return self.cfg.num_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        seed = (self.cfg.data_seed * 1_000_003 + index) * 2 + self.split_offset
        gen = torch.Generator().manual_seed(seed)
        start = int(torch.randint(self.vocab_size, (1,), generator=gen))
        stride = int(torch.randint(1, self.cfg.max_stride + 1, (1,), generator=gen))
        tokens = (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size
        noisy = torch.rand(self.seq_length + 1, generator=gen) < self.cfg.noise
        random_tokens = torch.randint(self.vocab_size, (self.seq_length + 1,), generator=gen)
        return torch.where(noisy, random_tokens, tokens)


@dataclass
class ResumableSampler:
    """Walks a per-epoch shuffled order of sample indices, one global batch at a time."""

    num_samples: int
    global_batch_size: int
    seed: int
    epoch: int = 0
    position: int = 0
    consumed: int = 0

    def _order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))

    def next_batch(self) -> list[int]:
        """The next ``global_batch_size`` indices; crosses epoch boundaries seamlessly."""
        out: list[int] = []
        while len(out) < self.global_batch_size:
            order = self._order(self.epoch)
            take = min(self.global_batch_size - len(out), self.num_samples - self.position)
            out.extend(int(i) for i in order[self.position:self.position + take])
            self.position += take
            if self.position == self.num_samples:
                self.epoch, self.position = self.epoch + 1, 0
        self.consumed += len(out)
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.consumed = state["epoch"], state["position"], state["consumed"]


def make_sampler(cfg: Config) -> ResumableSampler:
    return ResumableSampler(cfg.data.num_samples, cfg.training.global_batch_size, cfg.data.data_seed)


def microbatches(dataset: SyntheticDataset, indices: list[int], dp_rank: int, dp: int,
                 micro_batch_size: int) -> list[Microbatch]:
    """This data-parallel rank's contiguous slice of a global batch, split into microbatches."""
    per_rank = len(indices) // dp
    mine = indices[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    samples = torch.stack([dataset[i] for i in mine])
    return [Microbatch(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
            for chunk in samples.split(micro_batch_size)]


def eval_batches(cfg: Config, dataset: SyntheticDataset) -> list[list[int]]:
    """The fixed validation batches every evaluation uses."""
    gbs = cfg.training.global_batch_size
    return [[(k * gbs + j) % len(dataset) for j in range(gbs)] for k in range(cfg.training.eval_iters)]
