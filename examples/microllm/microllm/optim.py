"""AdamW, the learning-rate schedule, global gradient clipping and the loss scaler.

Parameters, gradients and optimizer moments are fp32 whatever the compute dtype. The schedule
decays towards ``lr_decay_iters`` (not ``train_iters``), so a shortened run follows the same
learning-rate curve as the full run for the steps it does take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from microllm.config import Config, OptimizerConfig, PrecisionConfig
from microllm.parallel.comm import ParallelContext


def lr_at(iteration: int, opt: OptimizerConfig, decay_iters: int) -> float:
    """Learning rate for 0-based ``iteration``: linear warmup, then cosine to ``min_lr``."""
    if opt.warmup_iters > 0 and iteration < opt.warmup_iters:
        return opt.lr * (iteration + 1) / opt.warmup_iters
    if opt.lr_decay_style == "constant":
        return opt.lr
    if iteration >= decay_iters:
        return opt.min_lr
    span = max(1, decay_iters - opt.warmup_iters)
    ratio = (iteration - opt.warmup_iters) / span
    return opt.min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (opt.lr - opt.min_lr)


def adamw_math(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int, lr: float,
               decay: torch.Tensor | float, opt: OptimizerConfig) -> None:
    """One in-place AdamW update; elementwise, so a flat shard and a tensor agree bitwise."""
    m.mul_(opt.beta1).add_(g, alpha=1.0 - opt.beta1)
    v.mul_(opt.beta2).addcmul_(g, g, value=1.0 - opt.beta2)
    bc1 = 1.0 - opt.beta1**step
    bc2 = 1.0 - opt.beta2**step
    denom = (v / bc2).sqrt_().add_(opt.eps)
    p.mul_(decay)
    p.addcdiv_(m, denom, value=-lr / bc1)


def decays(p: torch.Tensor) -> bool:
    """Weight decay applies to matrices, not to norm gains."""
    return p.dim() > 1


def counts_for_norm(p: torch.Tensor, ctx: ParallelContext) -> bool:
    """Count a replicated parameter once per TP group (on TP rank 0), a sharded one everywhere."""
    return getattr(p, "tp_split_dim", None) is not None or ctx.tp_rank == 0


def finalize_sequence_parallel_grads(model: nn.Module, ctx: ParallelContext) -> None:
    """Sum the partial gradients of norm weights over the TP group (sequence parallelism)."""
    if not ctx.sequence_parallel or ctx.tp == 1:
        return
    params = [p for p in model.parameters() if getattr(p, "sequence_parallel_grad", False) and p.grad is not None]
    if params:
        flat = ctx.tp_group.all_reduce(torch.cat([p.grad.reshape(-1) for p in params]))
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))


class AdamW:
    """Plain data-parallel AdamW: all-reduce (average) gradients, every rank updates everything."""

    norm_groups: tuple[str, ...] = ("tp", "pp")

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], opt: OptimizerConfig, ctx: ParallelContext) -> None:
        self.named, self.opt, self.ctx = named_params, opt, ctx
        self.step_count = 0
        self.exp_avg = {n: torch.zeros_like(p) for n, p in named_params}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in named_params}

    def reduce_grads(self) -> list[torch.Tensor]:
        """Average gradients over the data-parallel group; return the gradients this rank owns."""
        for _, p in self.named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for _, p in self.named]
        if self.ctx.dp > 1:
            flat = self.ctx.dp_group.all_reduce(torch.cat([g.reshape(-1) for g in grads])) / self.ctx.dp
            for g, new in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(new.view_as(g))
        return grads

    def local_norm_sq(self) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        for _, p in self.named:
            if counts_for_norm(p, self.ctx):
                total += p.grad.double().pow(2).sum()
        return total

    def owned_grads(self) -> list[torch.Tensor]:
        return [p.grad for _, p in self.named]

    def step(self, lr: float) -> None:
        self.step_count += 1
        decay = 1.0 - lr * self.opt.weight_decay
        with torch.no_grad():
            for name, p in self.named:
                adamw_math(p.data, p.grad, self.exp_avg[name], self.exp_avg_sq[name], self.step_count, lr,
                           decay if decays(p) else 1.0, self.opt)

    def zero_grad(self) -> None:
        for _, p in self.named:
            p.grad = None

    def moments(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Param-shaped first and second moments (by global name)."""
        return self.exp_avg, self.exp_avg_sq

    def load_moments(self, exp_avg: dict[str, torch.Tensor], exp_avg_sq: dict[str, torch.Tensor], step: int) -> None:
        for name, _ in self.named:
            self.exp_avg[name].copy_(exp_avg[name])
            self.exp_avg_sq[name].copy_(exp_avg_sq[name])
        self.step_count = step


def clip_grads(optimizer: "AdamW", ctx: ParallelContext, max_norm: float) -> float:
    """Clip the global gradient norm (over TP, PP and, for sharded optimizers, DP); return it."""
    sq = optimizer.local_norm_sq()
    for kind in optimizer.norm_groups:
        sq = getattr(ctx, f"{kind}_group").all_reduce(sq)
    norm = float(sq.sqrt())
    if max_norm > 0 and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for g in optimizer.owned_grads():
            g.mul_(coef)
    return norm


@dataclass
class LossScaler:
    """Static or dynamic loss scaling; dynamic halves on overflow, doubles after a clean window."""

    scale: float = 1.0
    dynamic: bool = False
    window: int = 100
    clean_steps: int = 0

    @classmethod
    def create(cls, prec: PrecisionConfig) -> "LossScaler":
        if prec.loss_scale > 0:
            return cls(scale=prec.loss_scale)
        if prec.dtype == "fp16":
            return cls(scale=prec.initial_loss_scale, dynamic=True, window=prec.loss_scale_window)
        return cls()

    def unscale_and_check(self, grads: list[torch.Tensor], ctx: ParallelContext) -> bool:
        """Divide gradients by the scale; return True if any rank saw inf/nan."""
        found = torch.zeros((), device=ctx.device)
        for g in grads:
            if self.scale != 1.0:
                g.div_(self.scale)
            if not torch.isfinite(g).all():
                found.fill_(1.0)
        for group in (ctx.tp_group, ctx.pp_group, ctx.dp_group):
            found = group.all_reduce(found, op="max")
        return bool(found.item() > 0)

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        if found_inf:
            self.scale = max(self.scale / 2.0, 1.0)
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.window:
            self.scale *= 2.0
            self.clean_steps = 0


def build_optimizer(named: list[tuple[str, nn.Parameter]], cfg: Config, ctx: ParallelContext) -> AdamW:
    """Plain AdamW, or the ZeRO-1 sharded AdamW when ``optimizer.zero1`` is set."""
    if cfg.optimizer.zero1:
        from microllm.parallel.zero import ZeroAdamW

        return ZeroAdamW(named, cfg.optimizer, ctx)
    return AdamW(named, cfg.optimizer, ctx)
