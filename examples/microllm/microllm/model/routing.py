"""Routing traces: record a mixture-of-experts run's top-k decisions and replay them elsewhere.

Top-k routing is discontinuous: when two experts' probabilities are nearly tied at the k-th
place, a difference in the last bits of the router input (another tensor-parallel layout sums
its partial products in another order) picks the other expert. Two layouts trained for many
steps drift apart by such rounding (Adam turns tiny relative gradient differences into weight
differences of a fraction of the learning rate), so sooner or later a near-tied token flips and
the two loss curves part by a step, not by rounding. Comparing layouts is only well posed when
both route alike: the reference run records its decisions (with each token's *margin*, the
smallest gap between neighbouring sorted probabilities up to the k-th place), and the run under
test replays them while still computing its own. Wherever its own decision differs, the
reference margin is reported, so a test can require that only near-ties (margin below a stated
bound) ever differ — a real routing bug differs on clear decisions.

A trace is a directory with one file per (data-parallel, pipeline) rank, written by tensor
rank 0 (routing is replicated over the tensor-parallel group). Calls are matched in order per
layer, so record and replay need the same data-parallel size, microbatches and evaluation
cadence, and no activation recomputation (which runs a layer's forward twice).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

import torch

from microllm import MicroLLMError


def routing_margin(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Per token, the smallest gap between neighbouring sorted probabilities up to the k-th place.

    A decision (the ordered top-k) can only change under a perturbation of the probabilities
    larger than about half this margin. ``inf`` when there is no boundary (a single expert).
    """
    experts = probs.shape[-1]
    top = probs.detach().topk(min(k + 1, experts), dim=-1).values
    gaps = top[:, :-1] - top[:, 1:]
    if gaps.shape[-1] == 0:
        return torch.full(probs.shape[:1], float("inf"), device=probs.device)
    return gaps.min(dim=-1).values.float()


@dataclass
class RoutingTrace:
    """One MoE layer's routing on one rank: recorded calls, or calls to replay, in order."""

    layer_number: int
    replay: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    recorded: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    calls: int = 0
    decisions: int = 0
    mismatch_margins: list[float] = field(default_factory=list)

    def route(self, probs: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
        """Record ``chosen``, or return the replayed decision and note where ``chosen`` differs."""
        self.decisions += chosen.shape[0]
        if self.replay is None:
            # Kept in host memory: a trace is saved to disk and may be replayed on another device.
            self.recorded.append((chosen.detach().cpu(), routing_margin(probs, k).cpu()))
            return chosen
        if self.calls >= len(self.replay):
            raise MicroLLMError(f"routing replay: layer {self.layer_number} has only {len(self.replay)} recorded calls")
        forced, margin = self.replay[self.calls]
        forced = forced.to(chosen.device)
        self.calls += 1
        if forced.shape != chosen.shape:
            raise MicroLLMError(f"routing replay: layer {self.layer_number} call {self.calls}: "
                                f"recorded {tuple(forced.shape)} decisions, computed {tuple(chosen.shape)}")
        differs = (forced != chosen).any(dim=-1).to(margin.device)
        self.mismatch_margins.extend(float(m) for m in margin[differs])
        return forced


def trace_file(directory: str, dp_rank: int, pp_rank: int) -> str:
    return os.path.join(directory, f"routing_dp{dp_rank}_pp{pp_rank}.pt")


def save_traces(traces: list[RoutingTrace], directory: str, dp_rank: int, pp_rank: int) -> None:
    """Write one rank's recorded routing (call it on tensor-parallel rank 0 only)."""
    os.makedirs(directory, exist_ok=True)
    path = trace_file(directory, dp_rank, pp_rank)
    torch.save({t.layer_number: t.recorded for t in traces}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_replay(directory: str, dp_rank: int) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every layer's recorded calls for ``dp_rank`` (the recording may have had another pp)."""
    paths = sorted(glob.glob(os.path.join(directory, f"routing_dp{dp_rank}_pp*.pt")))
    if not paths:
        raise MicroLLMError(f"routing replay: no trace for data-parallel rank {dp_rank} in {directory}")
    layers: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for path in paths:
        layers.update(torch.load(path, weights_only=False, map_location="cpu"))
    return layers
