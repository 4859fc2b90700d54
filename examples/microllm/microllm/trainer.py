"""The training loop: step, clip, schedule, evaluate, checkpoint, exit, report metrics.

:func:`train` launches one :func:`rank_main` per rank (threads or gloo processes) and merges
their results into a :class:`TrainResult`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from microllm import checkpoint
from microllm.config import Config
from microllm.data import SyntheticDataset, eval_batches, make_sampler, microbatches
from microllm.model.gpt import GPTStage, gather_full, init_full_state, load_full
from microllm.model.routing import RoutingTrace, load_replay, save_traces
from microllm.model.transformer import MoE, RankRng
from microllm.optim import LossScaler, build_optimizer, clip_grads, finalize_sequence_parallel_grads, lr_at
from microllm.parallel.comm import ParallelContext, launch
from microllm.parallel.pipeline import forward_backward, forward_only

LOG = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run reports (from the last pipeline stage, TP rank 0, DP rank 0)."""

    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)  # a fingerprint of each global batch's sample ids
    eval_losses: dict[int, float] = field(default_factory=dict)
    start_iteration: int = 0
    iteration: int = 0
    tokens_per_s: float = 0.0
    sampler_state: dict[str, int] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    loss_scale: float = 1.0
    loss_scales: list[float] = field(default_factory=list)  # the scale each iteration ran with
    routing_decisions: int = 0  # routed tokens, summed over every rank and MoE layer (traced runs)
    routing_mismatches: list[float] = field(default_factory=list)  # replay: reference margins where
    # this run's own top-k differed from the replayed decision, over every rank

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "state"}


def evaluate(stage: GPTStage, ctx: ParallelContext, cfg: Config, rng: RankRng, dataset: SyntheticDataset) -> float:
    """Mean validation loss over the fixed eval batches (0.0 on ranks without the loss)."""
    stage.eval()
    losses: list[float] = []
    for indices in eval_batches(cfg, dataset):
        mbs = microbatches(dataset, indices, ctx.dp_rank, ctx.dp, cfg.training.micro_batch_size)
        losses.extend(forward_only(stage, mbs, ctx, rng))
    stage.train()
    if not ctx.is_last_stage:
        return 0.0
    mean = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=ctx.device)
    return float(ctx.dp_group.all_reduce(mean) / ctx.dp)


def attach_routing_traces(stage: GPTStage, ctx: ParallelContext, cfg: Config) -> list[RoutingTrace]:
    """Give every MoE layer a trace when the run records or replays routing (else none)."""
    t = cfg.training
    if not (t.routing_record or t.routing_replay):
        return []
    replay = load_replay(t.routing_replay, ctx.dp_rank) if t.routing_replay else None
    traces = []
    for module in stage.modules():
        if isinstance(module, MoE):
            module.trace = RoutingTrace(module.layer_number,
                                        replay=None if replay is None else replay.get(module.layer_number, []))
            traces.append(module.trace)
    return traces


def rank_main(ctx: ParallelContext, cfg: Config, return_state: bool = False) -> TrainResult:
    """Train on one rank; every rank runs this same function (SPMD)."""
    torch.use_deterministic_algorithms(cfg.training.deterministic)
    t, ck = cfg.training, cfg.checkpoint
    stage = GPTStage(cfg, ctx)
    load_full(stage, init_full_state(cfg))
    rng = RankRng.create(t.seed, ctx)
    sampler = make_sampler(cfg)
    scaler = LossScaler.create(cfg.precision)
    traces = attach_routing_traces(stage, ctx, cfg)
    loaded = checkpoint.load(ck.load, stage, ctx, cfg) if ck.load else None
    optimizer = build_optimizer(stage.named_global_parameters(), cfg, ctx)
    start = 0
    if loaded is not None:
        start = loaded.iteration
        sampler.load_state_dict(loaded.sampler)
        if loaded.exp_avg is not None and loaded.exp_avg_sq is not None:
            optimizer.load_moments(loaded.exp_avg, loaded.exp_avg_sq, loaded.optim_step)
        if loaded.rng is not None:
            rng.set_state(loaded.rng)
        if loaded.scaler is not None:
            scaler = LossScaler(**loaded.scaler)
    train_data = SyntheticDataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_length, "train")
    valid_data = SyntheticDataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_length, "valid")
    result = TrainResult(start_iteration=start, iteration=start)
    began = time.perf_counter()
    iteration = start
    while iteration < t.train_iters:
        indices = sampler.next_batch()
        result.batches.append(sum((k + 1) * i for k, i in enumerate(indices)) % 1_000_000_007)
        mbs = microbatches(train_data, indices, ctx.dp_rank, ctx.dp, t.micro_batch_size)
        result.loss_scales.append(scaler.scale)
        losses = forward_backward(stage, mbs, ctx, rng, schedule=cfg.parallel.pipeline_schedule,
                                  loss_scale=scaler.scale)
        finalize_sequence_parallel_grads(stage, ctx)
        grads = optimizer.reduce_grads()
        found_inf = scaler.unscale_and_check(grads, ctx)
        lr = lr_at(iteration, cfg.optimizer, cfg.lr_decay_iters)
        norm = float("nan")
        if not found_inf:
            norm = clip_grads(optimizer, ctx, cfg.optimizer.clip_grad)
            optimizer.step(lr)
        scaler.update(found_inf)
        optimizer.zero_grad()
        iteration += 1
        if ctx.is_last_stage:
            mean = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=ctx.device)
            result.losses.append(float(ctx.dp_group.all_reduce(mean) / ctx.dp))
        result.lrs.append(lr)
        result.grad_norms.append(norm)
        result.skipped.append(found_inf)
        if t.eval_interval and iteration % t.eval_interval == 0:
            result.eval_losses[iteration] = evaluate(stage, ctx, cfg, rng, valid_data)
        if ck.save and ck.save_interval and iteration % ck.save_interval == 0:
            checkpoint.save(ck.save, iteration, stage, optimizer, rng, scaler, sampler.state_dict(), ctx, cfg)
        if t.exit_interval and iteration % t.exit_interval == 0:
            break
    elapsed = time.perf_counter() - began
    done = iteration - start
    result.iteration = iteration
    result.tokens_per_s = done * t.global_batch_size * cfg.model.seq_length / max(elapsed, 1e-9)
    result.sampler_state = sampler.state_dict()
    result.loss_scale = scaler.scale
    if t.routing_record and ctx.tp_rank == 0:
        save_traces(traces, t.routing_record, ctx.dp_rank, ctx.pp_rank)
    result.routing_decisions = sum(trace.decisions for trace in traces)
    result.routing_mismatches = [m for trace in traces for m in trace.mismatch_margins]
    if return_state:
        result.state = gather_full(stage)
    return result


def train(cfg: Config, *, return_state: bool = False) -> TrainResult:
    """Validate ``cfg``, run every rank, merge: metrics from the loss rank, state from all stages."""
    cfg.validate()
    results = launch(rank_main, cfg.parallel, cfg, return_state)
    p = cfg.parallel
    reporter = results[(p.pp - 1) * p.tp * p.dp]  # last stage, tp 0, dp 0
    merged = TrainResult(**{**reporter.__dict__, "state": {}})
    # Routing is checked on every rank: a rank that routes unlike the others is the bug.
    merged.routing_decisions = sum(r.routing_decisions for r in results)
    merged.routing_mismatches = [m for r in results for m in r.routing_mismatches]
    if return_state:
        for s in range(p.pp):
            merged.state.update(results[s * p.tp * p.dp].state)
    if cfg.training.metrics_path:
        write_metrics(cfg.training.metrics_path, merged, cfg)
    LOG.info("trained %d iterations, last loss %.4f", merged.iteration - merged.start_iteration,
             merged.losses[-1] if merged.losses else float("nan"))
    return merged


def write_metrics(path: str, result: TrainResult, cfg: Config) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"config": cfg.to_dict(), **result.to_json(),
                   "eval_losses": {str(k): v for k, v in result.eval_losses.items()}}, f, indent=1)
