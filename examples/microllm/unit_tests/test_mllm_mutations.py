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
