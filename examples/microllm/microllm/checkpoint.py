"""Checkpoints: one file per (tensor, pipeline) rank, loadable into another layout.

Layout on disk::

    <save>/latest_checkpointed_iteration.txt
    <save>/iter_0000010/mp_rank_{tp:02d}_{pp:03d}.pt   # model shard, Adam moments, RNG, sampler
    <save>/iter_0000010/complete.json                  # the shard list, written after every shard

Data-parallel rank 0 of each model-parallel rank writes (ZeRO-1 moments are gathered first).
A save is crash consistent: each file is written to ``.tmp`` and renamed; after a barrier (every
shard is on disk) global rank 0 writes ``complete.json``, then the ``latest`` marker, each
atomically. A save interrupted anywhere leaves the marker on the previous complete iteration,
and the loader refuses an iteration whose manifest is missing or whose shards are not all there
(it never treats whatever shards happen to exist as a checkpoint).
Loading into a different tensor- or pipeline-parallel size goes through the full, unpadded
state; dropout RNG state is only restored when the layout is unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

from microllm import CheckpointError
from microllm.config import Config
from microllm.model.gpt import GPTStage, split_meta
from microllm.parallel.comm import ParallelContext
from microllm.parallel.tensor_parallel import shard, unshard

LATEST = "latest_checkpointed_iteration.txt"
MANIFEST = "complete.json"
_FILE = re.compile(r"^mp_rank_(\d{2})_(\d{3})\.pt$")


@dataclass
class Loaded:
    """What a load restored besides the model weights."""

    iteration: int
    exp_avg: dict[str, torch.Tensor] | None
    exp_avg_sq: dict[str, torch.Tensor] | None
    optim_step: int
    rng: Any
    scaler: dict[str, Any] | None
    sampler: dict[str, int]
    resharded: bool


def _barrier(ctx: ParallelContext) -> None:
    for group in (ctx.tp_group, ctx.pp_group, ctx.dp_group):
        group.all_reduce(torch.zeros(1, device=ctx.device))


def save(directory: str, iteration: int, stage: GPTStage, optimizer: Any, rng: Any, scaler: Any,
         sampler_state: dict[str, int], ctx: ParallelContext, cfg: Config) -> str:
    """Write this rank's shard for ``iteration`` (a collective over all ranks); return the dir."""
    exp_avg, exp_avg_sq = optimizer.moments()
    out_dir = os.path.join(directory, f"iter_{iteration:07d}")
    stale = os.path.join(out_dir, MANIFEST)
    if ctx.global_rank == 0 and os.path.exists(stale):
        os.remove(stale)  # re-saving an iteration: it is incomplete until every new shard is written
    _barrier(ctx)
    if ctx.dp_rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        state = {
            "iteration": iteration,
            "layout": {"tp": ctx.tp, "pp": ctx.pp, "dp": ctx.dp},
            "model_config": dataclasses.asdict(cfg.model),
            # Host memory on disk: a checkpoint loads on any device (and reshards through CPU).
            "model": {n: p.detach().cpu().clone() for n, p in stage.named_global_parameters()},
            "optim": {"exp_avg": _host(exp_avg), "exp_avg_sq": _host(exp_avg_sq), "step": optimizer.step_count},
            "rng": rng.get_state(),
            "scaler": dataclasses.asdict(scaler),
            "sampler": sampler_state,
        }
        path = os.path.join(out_dir, shard_name(ctx.tp_rank, ctx.pp_rank))
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    _barrier(ctx)  # every shard of this iteration is on disk before it is declared complete
    if ctx.global_rank == 0:
        publish(directory, iteration, ctx)
    _barrier(ctx)
    return out_dir


def _host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu() for name, t in tensors.items()}


def shard_name(tp_rank: int, pp_rank: int) -> str:
    return f"mp_rank_{tp_rank:02d}_{pp_rank:03d}.pt"


def _write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def publish(directory: str, iteration: int, ctx: ParallelContext) -> None:
    """Declare ``iteration`` complete, then make it the latest (in this order, each atomic)."""
    shards = [shard_name(t, p) for p in range(ctx.pp) for t in range(ctx.tp)]
    manifest = {"iteration": iteration, "layout": {"tp": ctx.tp, "pp": ctx.pp, "dp": ctx.dp}, "shards": shards}
    _write_atomic(os.path.join(directory, f"iter_{iteration:07d}", MANIFEST), json.dumps(manifest, indent=1))
    _write_atomic(os.path.join(directory, LATEST), str(iteration))


def verify_complete(iter_dir: str, iteration: int) -> None:
    """Raise CheckpointError unless ``iter_dir`` holds a complete save of ``iteration``."""
    path = os.path.join(iter_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"incomplete checkpoint {iter_dir}: no {MANIFEST} (the save did not finish)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"corrupt {path}: {exc}") from exc
    layout = manifest.get("layout", {})
    shards = manifest.get("shards", [])
    expected = {shard_name(t, p) for p in range(layout.get("pp", 0)) for t in range(layout.get("tp", 0))}
    if manifest.get("iteration") != iteration or not shards or set(shards) != expected:
        raise CheckpointError(f"corrupt {path}: does not describe a tp x pp save of iteration {iteration}")
    missing = [name for name in shards if not os.path.isfile(os.path.join(iter_dir, name))]
    if missing:
        raise CheckpointError(f"incomplete checkpoint {iter_dir}: missing {', '.join(missing)}")


def latest_iteration(directory: str) -> int | None:
    path = os.path.join(directory, LATEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip())
    except ValueError as exc:
        raise CheckpointError(f"corrupt {path}") from exc


def _read_all(iter_dir: str) -> dict[tuple[int, int], dict[str, Any]]:
    files: dict[tuple[int, int], dict[str, Any]] = {}
    for name in sorted(os.listdir(iter_dir)):
        match = _FILE.match(name)
        if match:
            files[(int(match.group(1)), int(match.group(2)))] = torch.load(os.path.join(iter_dir, name), weights_only=False,
                                                                            map_location="cpu")
    if not files:
        raise CheckpointError(f"no shards in {iter_dir}")
    return files


def _reshard(files: dict[tuple[int, int], dict[str, Any]], key: tuple[str, ...], stage: GPTStage,
             ctx: ParallelContext) -> dict[str, torch.Tensor]:
    """This rank's shards of one tensor family (``("model",)`` or ``("optim", "exp_avg")``)."""
    saved_tp = max(t for t, _ in files) + 1
    out = {}
    for name, p in stage.named_global_parameters():
        parts = []
        for t in range(saved_tp):
            holder = next((f for (ft, _), f in files.items() if ft == t and name in f["model"]), None)
            if holder is None:
                raise CheckpointError(f"checkpoint has no tensor {name} for tp rank {t}")
            value: Any = holder
            for k in key:
                value = value[k]
            parts.append(value[name])
        split, padded = split_meta(p)
        full = unshard(parts, split, padded, stage.cfg.model.vocab_size)
        out[name] = shard(full, split, padded, ctx.tp_rank, ctx.tp, stage.cfg.padded_vocab_size)
    return out


def load(directory: str, stage: GPTStage, ctx: ParallelContext, cfg: Config) -> Loaded:
    """Load the latest checkpoint under ``directory`` into ``stage`` (resharding if needed)."""
    iteration = latest_iteration(directory)
    if iteration is None:
        raise CheckpointError(f"no checkpoint in {directory}")
    iter_dir = os.path.join(directory, f"iter_{iteration:07d}")
    own = os.path.join(iter_dir, shard_name(ctx.tp_rank, ctx.pp_rank))
    verify_complete(iter_dir, iteration)
    files = _read_all(iter_dir)
    any_file = next(iter(files.values()))
    saved_model = any_file["model_config"]
    for key in ("num_layers", "hidden_size", "num_heads", "vocab_size", "activation", "num_experts"):
        if saved_model[key] != getattr(cfg.model, key):
            raise CheckpointError(f"checkpoint {key}={saved_model[key]} != configured {getattr(cfg.model, key)}")
    same_layout = any_file["layout"]["tp"] == ctx.tp and any_file["layout"]["pp"] == ctx.pp and os.path.exists(own)
    if same_layout:
        mine = files[(ctx.tp_rank, ctx.pp_rank)]
        weights = mine["model"]
        exp_avg, exp_avg_sq = mine["optim"]["exp_avg"], mine["optim"]["exp_avg_sq"]
    else:
        weights = _reshard(files, ("model",), stage, ctx)
        exp_avg = _reshard(files, ("optim", "exp_avg"), stage, ctx)
        exp_avg_sq = _reshard(files, ("optim", "exp_avg_sq"), stage, ctx)
        mine = any_file
    with torch.no_grad():
        for name, p in stage.named_global_parameters():
            if weights[name].shape != p.shape:
                raise CheckpointError(f"shape mismatch for {name}: {tuple(weights[name].shape)} vs {tuple(p.shape)}")
            p.copy_(weights[name])
    load_optim = not cfg.checkpoint.no_load_optim
    return Loaded(
        iteration=iteration,
        exp_avg=exp_avg if load_optim else None,
        exp_avg_sq=exp_avg_sq if load_optim else None,
        optim_step=mine["optim"]["step"] if load_optim else 0,
        rng=mine["rng"] if same_layout and not cfg.checkpoint.no_load_rng else None,
        scaler=mine["scaler"] if load_optim else None,
        sampler=mine["sampler"],
        resharded=not same_layout,
    )
