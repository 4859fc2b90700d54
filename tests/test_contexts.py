"""Context signatures distinguish dtype, parallel degree and caller — never tensor values."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import pytest
import torch

from fastci.evidence import contexts
from fastci.evidence.contexts import ContextProfiler, abstract, annotate
from fastci.evidence.covplugin import make_coverage
from fastci.evidence.files import PathMapper

SOURCE = '''
import dataclasses

@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"

def kernel(x, cfg=None, mode="fast"):
    return x * 2

def via_a(x):
    return kernel(x)

def via_b(x):
    return kernel(x)

def scalar(n):
    return n + 1

import torch

class Block(torch.nn.Module):
    def forward(self, x):
        return x
'''


@pytest.fixture
def mod(tmp_path: Path) -> Iterator[ModuleType]:
    name = f"ctxmod_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def profile(root: Path, body: Callable[[], object]) -> dict[tuple[str, str], tuple[set[str], int]]:
    """Run ``body`` the way the recorder does: coverage + the context plug-in."""
    prof = ContextProfiler(PathMapper(root, extra_roots=[]))
    cov = make_coverage([str(root)], [], contexts=True)
    prof.start()
    cov.start()
    try:
        body()
    finally:
        cov.stop()
        out = prof.stop()
    return out


def collect(root: Path, body: Callable[[], object]) -> dict[str, set[str]]:
    return {qual: sigs for (_, qual), (sigs, _) in profile(root, body).items()}


def test_dtype_distinguishes_but_values_do_not(mod: ModuleType, tmp_path: Path) -> None:
    def body() -> None:
        mod.kernel(torch.zeros(4, 4))
        mod.kernel(torch.randn(4, 4) * 1000)  # other values, same dtype/shape class
        mod.kernel(torch.ones(3, 5))  # other exact shape, same class
    one = collect(tmp_path, body)["kernel"]
    assert len(one) == 1
    (sig,) = one
    assert "T(f32,2d,cpu,s)" in sig and "1000" not in sig
    two = collect(tmp_path, lambda: (mod.kernel(torch.zeros(4)),
                                     mod.kernel(torch.zeros(4, dtype=torch.bfloat16))))["kernel"]
    assert len(two) == 2
    assert any("bf16" in s for s in two) and any("f32" in s for s in two)


def test_tp_degree_from_config_distinguishes(mod: ModuleType, tmp_path: Path) -> None:
    x = torch.zeros(2)
    sigs = collect(tmp_path, lambda: [mod.kernel(x, mod.ParallelConfig(tp=tp)) for tp in (1, 2, 2)])
    assert len(sigs["kernel"]) == 2
    assert any("ParallelConfig(tp=2,pp=1,dtype='bf16')" in s for s in sigs["kernel"])


def test_caller_distinguishes(mod: ModuleType, tmp_path: Path) -> None:
    x = torch.zeros(2)
    sigs = collect(tmp_path, lambda: (mod.via_a(x), mod.via_b(x), mod.via_a(x)))["kernel"]
    callers = {s.split("caller=")[1].split("|")[0] for s in sigs}
    assert callers == {f"{mod.__name__}.py::via_a", f"{mod.__name__}.py::via_b"}


def test_scalars_and_short_strings_by_value(mod: ModuleType, tmp_path: Path) -> None:
    sigs = collect(tmp_path, lambda: (mod.kernel(1, mode="fast"), mod.kernel(1, mode="slow")))
    assert {s.split("|")[0] for s in sigs["kernel"]} == {
        "args(x=1;cfg=None;mode='fast')", "args(x=1;cfg=None;mode='slow')"}


def test_hot_loops_are_capped(mod: ModuleType, tmp_path: Path) -> None:
    out = profile(tmp_path, lambda: [mod.scalar(i) for i in range(5000)])
    ((sigs, calls),) = [v for (_, q), v in out.items() if q == "scalar"]
    assert len(sigs) == contexts.MAX_CONTEXTS  # capped, then no more inspection
    assert calls <= 5000


def test_annotations_and_module_phase(mod: ModuleType, tmp_path: Path) -> None:
    block = mod.Block()

    def body() -> None:
        with annotate(phase="eval", role="pp_last"):
            mod.kernel(1)
        block(1)
        block.eval()
        block(1)
    out = collect(tmp_path, body)
    sigs = out["kernel"]
    assert any("phase=eval" in s and "role=pp_last" in s for s in sigs)
    assert {s.split(";")[0] for s in out["Block.forward"]} == {
        "args(self=Block[train=1]", "args(self=Block[train=0]"}
    assert not contexts._labels  # restored after the block
    with torch.no_grad():
        nograd = collect(tmp_path, lambda: mod.kernel(1))["kernel"]
    assert all("grad=0" in s for s in nograd)


def test_abstract_never_leaks_values() -> None:
    t = torch.full((300, 300), 7.0, dtype=torch.float16)
    assert abstract(t) == "T(f16,2d,cpu,l)"
    assert abstract(torch.zeros(0)) == "T(f32,1d,cpu,e)"
    assert abstract("x" * 100) == "str[s]"
    assert abstract((1, 2)) == "tuple(1,2)"
    assert abstract(list(range(100))) == "list[l]"
    assert abstract(torch.bfloat16) == "bfloat16"
    assert abstract(abstract) == "fn:abstract"


def test_self_configs_carry_parallel_degrees(mod: ModuleType, tmp_path: Path) -> None:
    block = mod.Block()
    block.ctx = mod.ParallelConfig(tp=4)  # how microllm keeps its ParallelContext
    sigs = collect(tmp_path, lambda: block(1))["Block.forward"]
    assert any("self=Block[train=1]:ctx=ParallelConfig(tp=4,pp=1,dtype='bf16')" in s for s in sigs)
