"""ZeRO-1: AdamW whose moments and fp32 update are sharded over the data-parallel group.

Gradients are reduce-scattered (each rank receives the averaged slice it owns), each rank
updates its slice of the flattened parameters, and an all-gather puts the parameters back
together. Moments can be gathered into parameter-shaped tensors for checkpoints, so a ZeRO-1
checkpoint loads into any layout.
"""

from __future__ import annotations

import torch
from torch import nn

from microllm.config import OptimizerConfig
from microllm.optim import AdamW, adamw_math, counts_for_norm, decays
from microllm.parallel.comm import ParallelContext


class ZeroAdamW(AdamW):
    """Sharded AdamW with the same update math as :class:`AdamW`."""

    norm_groups = ("tp", "pp", "dp")

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], opt: OptimizerConfig, ctx: ParallelContext) -> None:
        self.named, self.opt, self.ctx = named_params, opt, ctx
        self.step_count = 0
        self.sizes = [p.numel() for _, p in named_params]
        total = sum(self.sizes)
        self.shard_size = -(-total // ctx.dp)
        self.padded = self.shard_size * ctx.dp
        self.start = ctx.dp_rank * self.shard_size
        own = slice(self.start, self.start + self.shard_size)
        self.decay_mask = self._flat_mask([decays(p) for _, p in named_params])[own]
        self.norm_mask = self._flat_mask([counts_for_norm(p, ctx) for _, p in named_params])[own].double()
        self.param_shard = self._flatten([p.detach() for _, p in named_params])[own].clone()
        self.exp_avg_shard = torch.zeros(self.shard_size, device=ctx.device)
        self.exp_avg_sq_shard = torch.zeros(self.shard_size, device=ctx.device)
        self.grad_shard = torch.zeros(self.shard_size, device=ctx.device)

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        # Everything flat lives on the rank's device (loaded moments may come from host memory).
        flat = torch.cat([t.reshape(-1).float().to(self.ctx.device) for t in tensors])
        return torch.cat([flat, torch.zeros(self.padded - flat.numel(), device=flat.device)])

    def _flat_mask(self, flags: list[bool]) -> torch.Tensor:
        return self._flatten([torch.full((n,), float(f)) for n, f in zip(self.sizes, flags)]).bool()

    def _unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = flat[: sum(self.sizes)].split(self.sizes)
        return {n: part.view_as(p).clone() for (n, p), part in zip(self.named, parts)}

    def reduce_grads(self) -> list[torch.Tensor]:
        flat = self._flatten([p.grad if p.grad is not None else torch.zeros_like(p) for _, p in self.named])
        self.grad_shard = self.ctx.dp_group.reduce_scatter(flat, 0) / self.ctx.dp
        return [self.grad_shard]

    def local_norm_sq(self) -> torch.Tensor:
        return (self.grad_shard.double().pow(2) * self.norm_mask).sum()

    def owned_grads(self) -> list[torch.Tensor]:
        return [self.grad_shard]

    def step(self, lr: float) -> None:
        self.step_count += 1
        dev = self.ctx.device
        decay = torch.where(self.decay_mask, torch.tensor(1.0 - lr * self.opt.weight_decay, device=dev),
                            torch.tensor(1.0, device=dev))
        adamw_math(self.param_shard, self.grad_shard, self.exp_avg_shard, self.exp_avg_sq_shard,
                   self.step_count, lr, decay, self.opt)
        full = self._unflatten(self.ctx.dp_group.all_gather(self.param_shard, 0))
        with torch.no_grad():
            for name, p in self.named:
                p.copy_(full[name])

    def moments(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        gather = self.ctx.dp_group.all_gather
        return self._unflatten(gather(self.exp_avg_shard, 0)), self._unflatten(gather(self.exp_avg_sq_shard, 0))

    def load_moments(self, exp_avg: dict[str, torch.Tensor], exp_avg_sq: dict[str, torch.Tensor], step: int) -> None:
        own = slice(self.start, self.start + self.shard_size)
        self.exp_avg_shard = self._flatten([exp_avg[n] for n, _ in self.named])[own].clone()
        self.exp_avg_sq_shard = self._flatten([exp_avg_sq[n] for n, _ in self.named])[own].clone()
        self.param_shard = self._flatten([p.detach() for _, p in self.named])[own].clone()
        self.step_count = step
