from __future__ import annotations

import math

import torch

from microllm.config import OptimizerConfig, PrecisionConfig
from microllm.optim import LossScaler, adamw_math, lr_at

OPT = OptimizerConfig(lr=1e-2, min_lr=1e-3, warmup_iters=4, weight_decay=0.1)


def test_lr_schedule_shape() -> None:
    assert lr_at(0, OPT, 20) == 1e-2 / 4
    assert lr_at(3, OPT, 20) == 1e-2
    assert math.isclose(lr_at(12, OPT, 20), (1e-2 + 1e-3) / 2)
    assert lr_at(20, OPT, 20) == 1e-3 and lr_at(50, OPT, 20) == 1e-3
    assert lr_at(10, OptimizerConfig(lr_decay_style="constant", warmup_iters=0), 20) == OptimizerConfig().lr


def test_adamw_math_matches_torch_adamw() -> None:
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(5, 3, generator=gen)
    grads = [torch.randn(5, 3, generator=gen) for _ in range(3)]
    ref = p0.clone().requires_grad_()
    torch_opt = torch.optim.AdamW([ref], lr=1e-2, betas=(OPT.beta1, OPT.beta2), eps=OPT.eps, weight_decay=0.1)
    mine, m, v = p0.clone(), torch.zeros(5, 3), torch.zeros(5, 3)
    for step, g in enumerate(grads, start=1):
        ref.grad = g.clone()
        torch_opt.step()
        adamw_math(mine, g, m, v, step, 1e-2, 1.0 - 1e-2 * 0.1, OPT)
    assert torch.allclose(mine, ref.detach(), atol=1e-6)


def test_flat_tensor_decay_equals_scalar_decay_bitwise() -> None:
    gen = torch.Generator().manual_seed(1)
    p, g = torch.randn(64, generator=gen), torch.randn(64, generator=gen)
    a, b = p.clone(), p.clone()
    ma, va, mb, vb = (torch.zeros(64) for _ in range(4))
    decay = 1.0 - 3e-3 * 0.1
    adamw_math(a, g, ma, va, 1, 3e-3, decay, OPT)
    adamw_math(b, g, mb, vb, 1, 3e-3, torch.full((64,), decay), OPT)
    assert torch.equal(a, b)


def test_dynamic_loss_scaler() -> None:
    scaler = LossScaler.create(PrecisionConfig(dtype="fp16", initial_loss_scale=1024.0, loss_scale_window=2))
    assert scaler.dynamic and scaler.scale == 1024.0
    scaler.update(found_inf=True)
    assert scaler.scale == 512.0
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 1024.0
    assert LossScaler.create(PrecisionConfig(dtype="bf16")).scale == 1.0
    assert LossScaler.create(PrecisionConfig(dtype="fp32", loss_scale=8.0)).scale == 8.0


def test_fp16_training_scales_the_loss_and_learns() -> None:
    from microllm.config import Config
    from microllm.trainer import train

    cfg = Config.from_flat(dtype="fp16", train_iters=16, num_layers=1, hidden_size=32, num_heads=2, seq_length=16,
                           vocab_size=50, micro_batch_size=2, global_batch_size=4, initial_loss_scale=2.0**24)
    run = train(cfg)
    assert run.skipped[0], "a 2**24 scale must overflow fp16 on the first step"
    assert run.loss_scale < 2.0**24 and not run.skipped[-1]
    assert all(math.isfinite(x) for x in run.losses)
