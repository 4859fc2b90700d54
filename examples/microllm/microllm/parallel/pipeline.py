"""Pipeline schedules: GPipe (all forwards, then all backwards) and 1F1B.

Each stage runs the same schedule function; activations travel forward and their gradients
backward over the pipeline group's point-to-point channel. With ``pp == 1`` both schedules
degenerate to gradient accumulation over microbatches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from microllm.model.gpt import GPTStage
from microllm.model.transformer import RankRng
from microllm.parallel.comm import ParallelContext


@dataclass(frozen=True)
class Microbatch:
    """Input tokens and next-token labels, ``[micro_batch, seq]`` each."""

    tokens: torch.Tensor
    labels: torch.Tensor


class _Stage:
    """One stage's view of a schedule: forward/backward steps and the p2p edges."""

    def __init__(self, stage: GPTStage, ctx: ParallelContext, rng: RankRng, num_micro: int, loss_scale: float) -> None:
        self.stage, self.ctx, self.rng = stage, ctx, rng
        self.num_micro, self.loss_scale = num_micro, loss_scale
        self.losses: list[torch.Tensor] = []

    def _shape(self, mb: Microbatch) -> tuple[int, int, int]:
        seq = mb.tokens.shape[1] // (self.ctx.tp if self.ctx.sequence_parallel else 1)
        return (mb.tokens.shape[0], seq, self.stage.cfg.model.hidden_size)

    def recv_forward(self, mb: Microbatch) -> torch.Tensor | None:
        if self.ctx.is_first_stage:
            return None
        t = self.ctx.pp_group.recv(self.ctx.pp_rank - 1, self._shape(mb), self.stage.compute_dtype)
        return t.requires_grad_(torch.is_grad_enabled())

    def send_forward(self, out: torch.Tensor) -> None:
        if not self.ctx.is_last_stage:
            self.ctx.pp_group.send(out, self.ctx.pp_rank + 1)

    def recv_backward(self, mb: Microbatch) -> torch.Tensor | None:
        if self.ctx.is_last_stage:
            return None
        return self.ctx.pp_group.recv(self.ctx.pp_rank + 1, self._shape(mb), self.stage.compute_dtype)

    def send_backward(self, grad: torch.Tensor | None) -> None:
        if not self.ctx.is_first_stage:
            assert grad is not None
            self.ctx.pp_group.send(grad, self.ctx.pp_rank - 1)

    def forward(self, mb: Microbatch, inp: torch.Tensor | None) -> torch.Tensor:
        dev = self.ctx.device  # the data is made in host memory; a no-op on CPU
        labels = mb.labels.to(dev) if self.ctx.is_last_stage else None
        out = self.stage(mb.tokens.to(dev) if inp is None else inp, self.rng, labels=labels)
        if not self.ctx.is_last_stage:
            return out
        loss = out.float().mean()
        self.losses.append(loss.detach())
        return loss * (self.loss_scale / self.num_micro)

    @staticmethod
    def backward(inp: torch.Tensor | None, out: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor | None:
        torch.autograd.backward(out, grad_tensors=grad)
        return None if inp is None else inp.grad


def gpipe(st: _Stage, mbs: list[Microbatch]) -> None:
    stash = []
    for mb in mbs:
        inp = st.recv_forward(mb)
        out = st.forward(mb, inp)
        st.send_forward(out)
        stash.append((inp, out))
    for mb, (inp, out) in zip(mbs, stash):
        st.send_backward(st.backward(inp, out, st.recv_backward(mb)))


def one_f_one_b(st: _Stage, mbs: list[Microbatch]) -> None:
    n = len(mbs)
    warmup = min(st.ctx.pp - st.ctx.pp_rank - 1, n)
    stash: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    for mb in mbs[:warmup]:
        inp = st.recv_forward(mb)
        out = st.forward(mb, inp)
        st.send_forward(out)
        stash.append((inp, out))
    done = 0
    for i, mb in enumerate(mbs[warmup:]):
        inp = st.recv_forward(mb)
        out = st.forward(mb, inp)
        st.send_forward(out)
        stash.append((inp, out))
        old_inp, old_out = stash.pop(0)
        st.send_backward(st.backward(old_inp, old_out, st.recv_backward(mbs[done])))
        done += 1
    while stash:
        old_inp, old_out = stash.pop(0)
        st.send_backward(st.backward(old_inp, old_out, st.recv_backward(mbs[done])))
        done += 1


def forward_backward(stage: GPTStage, microbatches: list[Microbatch], ctx: ParallelContext, rng: RankRng, *,
                     schedule: str = "1f1b", loss_scale: float = 1.0) -> list[float]:
    """Run one training step's forwards and backwards; return per-microbatch losses (last stage)."""
    stage.set_aux_grad_scale(loss_scale / len(microbatches))
    st = _Stage(stage, ctx, rng, len(microbatches), loss_scale)
    (gpipe if schedule == "gpipe" else one_f_one_b)(st, microbatches)
    ctx.pp_group.flush()
    return [float(x) for x in st.losses]


@torch.no_grad()
def forward_only(stage: GPTStage, microbatches: list[Microbatch], ctx: ParallelContext, rng: RankRng) -> list[float]:
    """Evaluation: forwards only, no gradients; return per-microbatch losses (last stage)."""
    st = _Stage(stage, ctx, rng, len(microbatches), 1.0)
    for mb in microbatches:
        st.send_forward(st.forward(mb, st.recv_forward(mb)))
    ctx.pp_group.flush()
    return [float(x) for x in st.losses]
