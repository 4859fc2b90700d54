"""Context signatures distinguish dtype, parallel degree and caller — never tensor values."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import pytest
import torch

from fastci.evidence.record import contexts
from fastci.evidence.record.contexts import ContextProfiler, abstract, annotate
from fastci.evidence.record.covplugin import make_coverage
from fastci.evidence.record.files import PathMapper

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


def test_scratch_paths_lose_their_random_part(mod: ModuleType, tmp_path: Path) -> None:
    # mkdtemp names a folder at random: as a context the path would never match the same
    # call in another run. Its part under the scratch folder is set aside, the rest kept.
    import tempfile

    one, two = tempfile.mkdtemp(prefix="ckpt-"), tempfile.mkdtemp(prefix="ckpt-")
    try:
        assert abstract(one) == abstract(two) == "'<tmp>/*'"
        assert abstract(os.path.join(one, "iter_3")) == "'<tmp>/*/iter_3'"
        assert abstract(os.path.join(os.path.realpath(one), "a")) == "'<tmp>/*/a'"
        sigs = collect(tmp_path, lambda: (mod.kernel(1, mode=one), mod.kernel(1, mode=two)))
        assert {s.split("|")[0] for s in sigs["kernel"]} == {"args(x=1;cfg=None;mode='<tmp>/*')"}
    finally:
        os.rmdir(one)
        os.rmdir(two)
    # Anything else keeps its value: other folders, names that only start like /tmp.
    assert abstract("/data/ckpt-8rt1qzed") == "'/data/ckpt-8rt1qzed'"
    assert abstract("/tmpfoo/x") == "'/tmpfoo/x'" and abstract("/tmp") == "'/tmp'"
    long = "/tmp/" + "d" * 10 + "/" + "x" * 40
    assert abstract(long) == "str[s]"


def test_self_configs_carry_parallel_degrees(mod: ModuleType, tmp_path: Path) -> None:
    block = mod.Block()
    block.ctx = mod.ParallelConfig(tp=4)  # how microllm keeps its ParallelContext
    sigs = collect(tmp_path, lambda: block(1))["Block.forward"]
    assert any("self=Block[train=1]:ctx=ParallelConfig(tp=4,pp=1,dtype='bf16')" in s for s in sigs)


def test_subclassed_scalars_and_dataclass_classes_keep_their_tokens(mod: ModuleType) -> None:
    """The exact-type shortcuts in ``abstract`` answer as the general rules do."""
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    assert abstract(7) == "7" and abstract(True) == "True" and abstract(None) == "None"
    assert abstract(0.1 + 0.2) == "0.3" and abstract(Level.HIGH) == "3"
    assert abstract(Name("ab")) == "'ab'" and abstract("y" * 300) == "str[l]"
    # A dataclass instance by its fields, a dataclass class by its type's name.
    assert abstract(mod.ParallelConfig(tp=2)) == "ParallelConfig(tp=2,pp=1,dtype='bf16')"
    assert abstract(mod.ParallelConfig) == "fn:ParallelConfig"
    assert abstract([mod.ParallelConfig()]) == "list[s]"


def test_the_plugin_calls_the_active_profiler_directly(mod: ModuleType, tmp_path: Path) -> None:
    """``activate`` puts the profiler's bound method on the tracers; ``stop`` takes it off."""
    from fastci.evidence.record import active, covplugin

    prof = ContextProfiler(PathMapper(tmp_path, extra_roots=[]))
    prof.start()
    try:
        assert active.ACTIVE is prof
        assert covplugin._Tracer("f.py").dynamic_source_filename == prof.dynamic_source_filename
    finally:
        prof.stop()
    assert active.ACTIVE is None
    idle = covplugin._Tracer("f.py").dynamic_source_filename
    assert idle(None, sys._getframe()) is None and idle("f.py", sys._getframe()) == "f.py"
    # Through the real tracer: each call is inspected (the first ones all are).
    sigs = collect(tmp_path, lambda: [mod.scalar(n) for n in range(3)])
    assert {s.split("|")[0] for s in sigs["scalar"]} == {f"args(n={n})" for n in range(3)}


def test_rank_label_is_asked_again_for_a_new_default_group() -> None:
    class Group:
        pass

    class FakeDist:
        class distributed_c10d:  # noqa: N801 (torch's module name)
            class GroupMember:
                WORLD: object = Group()

        asked = 0
        rank, size = 0, 2

        def is_available(self) -> bool:
            return True

        def is_initialized(self) -> bool:
            return True

        def get_rank(self) -> int:
            FakeDist.asked += 1
            return self.rank

        def get_world_size(self) -> int:
            return self.size

    dist = FakeDist()
    assert contexts._rank_label(dist) == "rank=0/2"
    assert contexts._rank_label(dist) == "rank=0/2" and FakeDist.asked == 1  # kept
    FakeDist.distributed_c10d.GroupMember.WORLD = Group()  # destroyed and re-created
    dist.rank, dist.size = 1, 4
    assert contexts._rank_label(dist) == "rank=n/4" and FakeDist.asked == 2


def test_coverage_skips_only_files_it_would_never_trace(tmp_path: Path) -> None:
    """The per-folder pre-filter answers "not traced" only where coverage.py would."""
    from fastci.evidence.record import covplugin

    repo, outside = tmp_path / "repo", tmp_path / "elsewhere"
    (repo / ".venv" / "lib").mkdir(parents=True)
    (repo / "pkg").mkdir()
    outside.mkdir()
    for path in (repo / "pkg" / "a.py", repo / ".venv" / "lib" / "b.py", outside / "c.py"):
        path.write_text("x = 1\n")
    # A file in an omitted folder that links into the measured tree: coverage.py decides.
    (repo / ".venv" / "lib" / "linked.py").symlink_to(repo / "pkg" / "a.py")
    cov = make_coverage([str(repo)], ["*/.venv/*", "*/site-packages/*"], contexts=False)
    where = (cov._fastci_roots, cov._fastci_omit)  # type: ignore[attr-defined]
    assert os.sep + ".venv" + os.sep in where[1]
    assert covplugin._excluded(str(outside / "c.py"), where)
    assert covplugin._excluded(str(repo / ".venv" / "lib" / "b.py"), where)
    assert not covplugin._excluded(str(repo / "pkg" / "a.py"), where)
    assert not covplugin._excluded(str(repo / ".venv" / "lib" / "linked.py"), where)
    assert not covplugin._excluded("<string>", where) and not covplugin._excluded("rel.py", where)
    # End to end: the measured file's lines are recorded, the others' are not.
    sys.path.insert(0, str(repo / "pkg"))
    sys.path.insert(0, str(outside))
    try:
        cov.start()
        try:
            importlib.import_module("a")
            importlib.import_module("c")
        finally:
            cov.stop()
    finally:
        sys.path.remove(str(repo / "pkg"))
        sys.path.remove(str(outside))
        sys.modules.pop("a", None)
        sys.modules.pop("c", None)
    measured = {os.path.realpath(f) for f in cov.get_data().measured_files()}
    assert os.path.realpath(repo / "pkg" / "a.py") in measured
    assert os.path.realpath(outside / "c.py") not in measured
