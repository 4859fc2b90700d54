"""Process groups, the parallel context of one rank, and the launcher.

Two collective back ends share one interface:

* :class:`SimulatedGroup` — ranks are threads of one process; a collective is a rendezvous on a
  barrier where every rank reduces the same list of tensors in rank order, so results are
  deterministic and identical on every rank.
* :class:`DistGroup` — real ``torch.distributed`` processes: NCCL when every process has a GPU
  of its own, gloo otherwise (CUDA tensors then travel through host memory).

Every rank computes on the device :mod:`microllm.device` gives it (``ParallelContext.device``):
CPU, or one of the visible GPUs, which simulated ranks share round-robin.

Model code is written once, SPMD style, against :class:`Group`.
"""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from microllm import MicroLLMError, device as devices
from microllm.config import ParallelConfig

TIMEOUT_S = 60.0  # a rank that waits longer than this is deadlocked: fail, do not hang


class Group:
    """A set of ranks that run collectives together; ``rank`` is the index inside the group."""

    kind: str
    rank: int
    size: int
    global_ranks: tuple[int, ...]

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor: ...
    def all_gather(self, t: torch.Tensor, dim: int) -> torch.Tensor: ...
    def reduce_scatter(self, t: torch.Tensor, dim: int) -> torch.Tensor: ...
    def send(self, t: torch.Tensor, dst: int) -> None: ...
    def recv(self, src: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor: ...
    def flush(self) -> None: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind}, rank={self.rank}/{self.size})"


def _reduce(vals: list[torch.Tensor], op: str) -> torch.Tensor:
    out = vals[0].clone()
    for v in vals[1:]:
        out = out + v if op == "sum" else torch.maximum(out, v)
    return out


class _Hub:
    """Shared state of one simulated group: a barrier and one slot per rank."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=TIMEOUT_S)
        self.slots: list[Any] = [None] * size


class _World:
    """Everything the simulated ranks share: hubs, point-to-point queues, the abort flag."""

    def __init__(self) -> None:
        self.hubs: dict[tuple[str, tuple[int, ...]], _Hub] = {}
        self.queues: dict[tuple[int, int], queue.Queue[torch.Tensor]] = {}
        self.lock = threading.Lock()
        self.aborted = threading.Event()

    def hub(self, kind: str, ranks: tuple[int, ...]) -> _Hub:
        with self.lock:
            return self.hubs.setdefault((kind, ranks), _Hub(len(ranks)))

    def channel(self, src: int, dst: int) -> "queue.Queue[torch.Tensor]":
        with self.lock:
            return self.queues.setdefault((src, dst), queue.Queue())

    def abort(self) -> None:
        self.aborted.set()
        for hub in list(self.hubs.values()):
            hub.barrier.abort()


class SimulatedGroup(Group):
    """A group of thread-ranks; collectives reduce in rank order (deterministic)."""

    def __init__(self, world: _World, kind: str, ranks: tuple[int, ...], rank: int,
                 device: torch.device | None = None) -> None:
        self.world, self.kind, self.global_ranks, self.rank = world, kind, ranks, rank
        self.size = len(ranks)
        self.device = device if device is not None else torch.device("cpu")
        self._hub = world.hub(kind, ranks)

    def _exchange(self, t: torch.Tensor, combine: Callable[[list[torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        if self.size == 1:
            return combine([t.detach()])
        self._hub.slots[self.rank] = t.detach()
        self._hub.barrier.wait()
        # Ranks may sit on different GPUs: each reduces every slot on its own device, in rank order.
        out = combine([v.to(t.device) for v in self._hub.slots])
        self._hub.barrier.wait()  # nobody may overwrite a slot before every rank has read it
        return out

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return self._exchange(t, lambda vals: _reduce(vals, op))

    def all_gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return self._exchange(t, lambda vals: torch.cat(vals, dim=dim))

    def reduce_scatter(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return self._exchange(t, lambda vals: _reduce(vals, "sum").chunk(self.size, dim=dim)[self.rank].clone())

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.world.channel(self.global_ranks[self.rank], self.global_ranks[dst]).put(t.detach().clone())

    def recv(self, src: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        chan = self.world.channel(self.global_ranks[src], self.global_ranks[self.rank])
        waited = 0.0
        while True:
            try:
                t = chan.get(timeout=0.5)
                break
            except queue.Empty:
                waited += 0.5
                if self.world.aborted.is_set() or waited > TIMEOUT_S:
                    raise MicroLLMError(f"recv from pipeline rank {src} aborted") from None
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise MicroLLMError(f"p2p mismatch: got {tuple(t.shape)}/{t.dtype}, want {tuple(shape)}/{dtype}")
        return t.to(self.device)

    def flush(self) -> None:
        return None


class DistGroup(Group):
    """A group backed by ``torch.distributed``; ``wire`` is the device its transport reads
    (the rank's GPU for NCCL, host memory for gloo)."""

    def __init__(self, kind: str, ranks: tuple[int, ...], rank: int, handle: Any,
                 device: torch.device | None = None, wire: torch.device | None = None) -> None:
        self.kind, self.global_ranks, self.rank, self.handle = kind, ranks, rank, handle
        self.size = len(ranks)
        self.device = device if device is not None else torch.device("cpu")
        self.wire = wire if wire is not None else torch.device("cpu")
        self._pending: list[tuple[Any, torch.Tensor]] = []

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        out = t.detach().to(self.wire, copy=True)
        if self.size > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.handle)
        return out.to(t.device)

    def all_gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        if self.size == 1:
            return t.detach().clone()
        mine = t.detach().to(self.wire).contiguous()
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.handle)
        return torch.cat(parts, dim=dim).to(t.device)

    def reduce_scatter(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        # gloo has no reduce_scatter; all_reduce + local chunk has the same result.
        return self.all_reduce(t).chunk(self.size, dim=dim)[self.rank].clone()

    def send(self, t: torch.Tensor, dst: int) -> None:
        buf = t.detach().to(self.wire, copy=True).contiguous()
        self._pending.append((dist.isend(buf, dst=self.global_ranks[dst]), buf))

    def recv(self, src: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        buf = torch.empty(tuple(shape), dtype=dtype, device=self.wire)
        dist.recv(buf, src=self.global_ranks[src])
        return buf.to(self.device)

    def flush(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()


@dataclass
class ParallelContext:
    """Where one rank sits: degrees, coordinates and its three groups (plain attributes)."""

    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    global_rank: int
    sequence_parallel: bool
    tp_group: Group
    pp_group: Group
    dp_group: Group
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this rank computes

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def role(self) -> str:
        """A short description of the rank's role, e.g. ``tp0/2 pp1/2 dp0/1``."""
        return f"tp{self.tp_rank}/{self.tp} pp{self.pp_rank}/{self.pp} dp{self.dp_rank}/{self.dp}"


def coords(rank: int, p: ParallelConfig) -> tuple[int, int, int]:
    """Megatron rank order: tp fastest, then dp, then pp. Returns (tp_rank, dp_rank, pp_rank)."""
    return rank % p.tp, (rank // p.tp) % p.dp, rank // (p.tp * p.dp)


def group_ranks(p: ParallelConfig) -> dict[str, list[tuple[int, ...]]]:
    """Every group of each kind, as tuples of global ranks (same order on every process)."""
    def rank_of(t: int, d: int, s: int) -> int:
        return s * p.tp * p.dp + d * p.tp + t
    return {
        "tp": [tuple(rank_of(t, d, s) for t in range(p.tp)) for s in range(p.pp) for d in range(p.dp)],
        "dp": [tuple(rank_of(t, d, s) for d in range(p.dp)) for s in range(p.pp) for t in range(p.tp)],
        "pp": [tuple(rank_of(t, d, s) for s in range(p.pp)) for d in range(p.dp) for t in range(p.tp)],
    }


def _context(rank: int, p: ParallelConfig, make: Callable[[str, tuple[int, ...]], Group],
             device: torch.device) -> ParallelContext:
    t, d, s = coords(rank, p)
    groups: dict[str, Group] = {}
    for kind, all_ranks in group_ranks(p).items():
        for ranks in all_ranks:
            g = make(kind, ranks)  # gloo requires every process to create every group
            if rank in ranks:
                groups[kind] = g
    return ParallelContext(p.tp, p.pp, p.dp, t, s, d, rank, p.sequence_parallel,
                           groups["tp"], groups["pp"], groups["dp"], device)


def launch(fn: Callable[..., Any], parallel: ParallelConfig, *args: Any) -> list[Any]:
    """Run ``fn(ctx, *args)`` on every rank; return the per-rank results by global rank."""
    kind = devices.resolve(parallel.device)
    devices.prepare(kind)
    if parallel.backend == "gloo":
        return _launch_gloo(fn, parallel, args)
    world, n = _World(), parallel.world_size
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(rank: int) -> None:
        device = devices.rank_device(kind, rank)

        def make(kind: str, ranks: tuple[int, ...]) -> Group:
            return SimulatedGroup(world, kind, ranks, ranks.index(rank) if rank in ranks else -1, device)

        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # per thread: kernels of this rank go to its GPU
            # Backward on this rank's own thread (thread-local switch). By default autograd runs
            # CUDA backward on one worker thread per device: ranks sharing a GPU would queue their
            # backward passes there, and a collective inside one (a TP all-reduce in a custom
            # autograd.Function) would wait forever for a rank queued behind it.
            with torch.autograd.set_multithreading_enabled(False):
                results[rank] = fn(_context(rank, parallel, make, device), *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after every rank stops
            errors[rank] = exc
            world.abort()

    if n == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}") for r in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    # Report the rank that failed first, not the ranks its abort broke out of a barrier.
    primary = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    secondary = [e for e in errors if e is not None]
    if primary or secondary:
        raise (primary or secondary)[0]
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gloo_entry(rank: int, fn: Callable[..., Any], parallel: ParallelConfig, args: tuple[Any, ...],
                port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    kind = devices.resolve(parallel.device)
    devices.prepare(kind)
    device = devices.rank_device(kind, rank)
    transport = devices.process_transport(kind, parallel.world_size)
    wire = device if transport == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(transport, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=parallel.world_size)
    try:
        def make(kind: str, ranks: tuple[int, ...]) -> Group:
            handle = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            return DistGroup(kind, ranks, ranks.index(rank) if rank in ranks else -1, handle, device, wire)

        result = fn(_context(rank, parallel, make, device), *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _launch_gloo(fn: Callable[..., Any], parallel: ParallelConfig, args: tuple[Any, ...]) -> list[Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="microllm-gloo-") as out_dir:
        mp.start_processes(_gloo_entry, args=(fn, parallel, args, _free_port(), out_dir),
                           nprocs=parallel.world_size, join=True, start_method="spawn")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False, map_location="cpu")
                for r in range(parallel.world_size)]
