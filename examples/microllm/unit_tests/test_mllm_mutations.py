"""The suite is strong enough: each injected bug fails the test that exists for it, at floors.

Each case monkeypatches one real bug into microllm and runs the suite test's ``check`` at the
test's floors (in-process, well under a second each).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import harness
import microllm.checkpoint as checkpoint
import microllm.data as data_mod
import microllm.model.attention as attention
import microllm.model.transformer as transformer
import microllm.optim as optim
import microllm.parallel.pipeline as pipeline
import microllm.parallel.tensor_parallel as tp
import microllm.parallel.zero as zero
import microllm.trainer as trainer


def _row_parallel_without_all_reduce(self: Any, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.weight.to(x.dtype))


class _CopyWithoutBackwardAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


_rotary = attention.rotary_tables
_zero_reduce = zero.ZeroAdamW.reduce_grads
_forward = pipeline._Stage.forward


def _zero_sums(self: Any) -> list[torch.Tensor]:
    _zero_reduce(self)
    self.grad_shard.mul_(self.ctx.dp)
    return [self.grad_shard]


def _no_dp_all_reduce(self: Any) -> list[torch.Tensor]:
    for _, p in self.named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for _, p in self.named]


def _loss_not_divided(self: Any, mb: Any, inp: Any) -> torch.Tensor:
    out = _forward(self, mb, inp)
    return out * self.num_micro if self.ctx.is_last_stage else out


def _scaler_never_backs_off(self: Any, found_inf: bool) -> None:
    if not self.dynamic or found_inf:
        return
    self.clean_steps += 1
    if self.clean_steps >= self.window:
        self.scale *= 2.0
        self.clean_steps = 0


_flatten = zero.ZeroAdamW._flatten


def _flatten_drops_remainder(self: Any, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Shards cover numel - numel % dp elements: the remainder is replaced by padding."""
    flat = _flatten(self, tensors)
    cut = sum(self.sizes) - sum(self.sizes) % self.ctx.dp
    return torch.cat([flat[:cut], torch.zeros(flat.numel() - cut)])


class _CrossEntropyInLogitsDtype(torch.autograd.Function):
    """The vocab-parallel cross entropy without the fp32 upcast: bf16 logits stay bf16."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any, vocab_size: int) -> torch.Tensor:
        local = logits.shape[-1]
        start = group.rank * local
        x = logits.masked_fill(torch.arange(start, start + local) >= vocab_size, float("-inf"))
        x = x - group.all_reduce(x.max(dim=-1).values, op="max").unsqueeze(-1)
        in_range = (target >= start) & (target < start + local)
        local_t = (target - start).clamp(0, local - 1)
        predicted = group.all_reduce(x.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(~in_range, 0.0))
        exp = x.exp()
        sum_exp = group.all_reduce(exp.sum(dim=-1))
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), in_range, local_t)
        return sum_exp.log() - predicted

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        softmax, in_range, local_t = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local_t.unsqueeze(-1), -in_range.unsqueeze(-1).to(g.dtype))
        return g * grad.unsqueeze(-1).to(g.dtype), None, None, None


_moe_init = transformer.MoE.__init__


def _moe_router_grad_summed_over_tp(self: Any, cfg: Any, ctx: Any, layer_number: int = 0) -> None:
    """The replicated router is treated like a sequence-parallel norm: its gradient is summed over TP."""
    _moe_init(self, cfg, ctx, layer_number)
    self.router.sequence_parallel_grad = True


MUTATIONS: dict[str, tuple[str, Any, str, Callable[..., Any]]] = {
    "row-parallel output not all-reduced": ("tp_parity_test", tp.RowParallelLinear, "forward", _row_parallel_without_all_reduce),
    "copy_to_tp backward not all-reduced": ("tp_parity_test", tp, "_CopyToTP", _CopyWithoutBackwardAllReduce),
    "replicated params counted on every TP rank": ("tp_parity_test", optim, "counts_for_norm", lambda p, ctx: True),
    "SP norm gradients not summed": ("sp_parity_test", trainer, "finalize_sequence_parallel_grads", lambda m, c: None),
    "ZeRO gradients summed, not averaged": ("zero1_optimizer_test", zero.ZeroAdamW, "reduce_grads", _zero_sums),
    "DP gradients not all-reduced": ("dp_parity_test", optim.AdamW, "reduce_grads", _no_dp_all_reduce),
    "loss not divided by microbatches": ("grad_accumulation_test", pipeline._Stage, "forward", _loss_not_divided),
    "rotary ignores the cache offset": ("kv_cache_decode_test", attention, "rotary_tables",
                                        lambda pos, hd, base: _rotary(pos - pos[0], hd, base)),
    "dropout RNG not restored on resume": ("checkpoint_resume_test", transformer.RankRng, "set_state", lambda self, s: None),
    "sampler position not restored": ("data_resume_test", data_mod.ResumableSampler, "load_state_dict", lambda self, s: None),
    "MoE router gradient summed over TP": ("moe_parity_test", transformer.MoE, "__init__", _moe_router_grad_summed_over_tp),
    "loss scaler never backs off": ("fp16_loss_scaler_test", optim.LossScaler, "update", _scaler_never_backs_off),
    "ZeRO shards drop the remainder": ("zero1_uneven_shard_test", zero.ZeroAdamW, "_flatten", _flatten_drops_remainder),
    "cross entropy computed in bf16": ("bf16_cross_entropy_test", tp, "_VocabParallelCrossEntropy", _CrossEntropyInLogitsDtype),
    "loader accepts an unpublished checkpoint": ("checkpoint_crash_test", checkpoint, "verify_complete", lambda d, i: None),
}


@pytest.mark.parametrize("label", sorted(MUTATIONS))
def test_mutation_is_caught_at_floors(label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    test, owner, attr, replacement = MUTATIONS[label]
    module = importlib.import_module(test)
    workload = harness.resolve(test, env={}, at_floors=True)
    module.check(workload)  # passes without the bug
    monkeypatch.setattr(owner, attr, replacement)
    with pytest.raises(AssertionError):
        module.check(workload)
