from __future__ import annotations

import pytest
import torch

from microllm import MicroLLMError
from microllm.config import ParallelConfig
from microllm.parallel.comm import ParallelContext, coords, group_ranks, launch


def _collectives(ctx: ParallelContext) -> dict[str, torch.Tensor]:
    r = ctx.tp_rank
    x = torch.tensor([float(r + 1), 10.0 * (r + 1)])
    return {
        "sum": ctx.tp_group.all_reduce(x),
        "max": ctx.tp_group.all_reduce(x, op="max"),
        "gather": ctx.tp_group.all_gather(x.view(1, 2), 0),
        "scatter": ctx.tp_group.reduce_scatter(torch.arange(4.0) * (r + 1), 0),
    }


def test_simulated_collectives() -> None:
    out = launch(_collectives, ParallelConfig(tp=2))
    for r, res in enumerate(out):
        assert res["sum"].tolist() == [3.0, 30.0]
        assert res["max"].tolist() == [2.0, 20.0]
        assert res["gather"].tolist() == [[1.0, 10.0], [2.0, 20.0]]
        assert res["scatter"].tolist() == ([0.0, 3.0] if r == 0 else [6.0, 9.0])


def _p2p(ctx: ParallelContext) -> list[float]:
    if ctx.pp_rank == 0:
        ctx.pp_group.send(torch.tensor([7.0, 8.0]), 1)
        return []
    return ctx.pp_group.recv(0, (2,), torch.float32).tolist()


def test_simulated_p2p() -> None:
    assert launch(_p2p, ParallelConfig(pp=2)) == [[], [7.0, 8.0]]


def _fail_on_rank1(ctx: ParallelContext) -> None:
    if ctx.global_rank == 1:
        raise MicroLLMError("boom on rank 1")
    ctx.tp_group.all_reduce(torch.ones(1))  # would wait forever without the abort


def test_error_on_one_rank_aborts_the_others() -> None:
    with pytest.raises(MicroLLMError, match="boom on rank 1"):
        launch(_fail_on_rank1, ParallelConfig(tp=2))


def test_rank_layout_is_megatron_order() -> None:
    p = ParallelConfig(tp=2, pp=2, dp=2)
    assert coords(5, p) == (1, 0, 1)  # tp fastest, then dp, then pp
    groups = group_ranks(p)
    assert groups["tp"][0] == (0, 1)
    assert groups["dp"][0] == (0, 2)
    assert groups["pp"][0] == (0, 4)
    assert sorted(r for g in groups["tp"] for r in g) == list(range(8))


def _role(ctx: ParallelContext) -> str:
    return ctx.role


def test_gloo_backend_runs_two_processes() -> None:
    out = launch(_role, ParallelConfig(tp=2, backend="gloo"))
    assert out == ["tp0/2 pp0/1 dp0/1", "tp1/2 pp0/1 dp0/1"]
