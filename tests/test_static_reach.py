"""Changes that line evidence cannot see: compiled code, new names and files, ignored inputs.

Each scenario is a temporary git repository with a real evidence store; every
selection test here selects nothing on code without the static rules.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest

from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.changes.semantic_diff import ChangeKind, diff_sources
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.select import DecisionKind, Selection
from fastci.changes.compiled_code import compiled_units
from fastci.changes.static_facts import (discovers_files, open_namespace, parse,
                                 registrable_classes)
from selection_support import Repo, env_now, ingest, units_of


class Scene:
    """A repo, a store, and recorded tests; ``plan()`` compares the worktree with ``base``."""

    def __init__(self, root: Path, files: Mapping[str, str]) -> None:
        self.root = root
        self.repo = Repo(root)
        self.repo.write({".gitignore": ".fastci/\n", **files})
        self.base = self.repo.commit()
        self.store = EvidenceStore.open(root / ".fastci/evidence.db", create=True)

    def record(self, test: str, executed: Mapping[str, Sequence[str] | None],
               reads: Mapping[str, str] | None = None) -> None:
        """Record ``test`` as executing the named units (None: every unit) of each file."""
        units: dict[str, str] = {}
        for path, quals in executed.items():
            every = units_of(self.root, [path])
            units.update({u: c for u, c in every.items()
                          if quals is None or u.split("::", 1)[1] in quals})
        ingest(self.store, test, units, commit=self.base, files=reads)

    def plan(self) -> Selection:
        return analyze(self.root, Config(), base=self.base, declared=Given(None),
                       environment=KnownFingerprint(env_now()), store=self.store).selection

    def chosen(self) -> dict[str, set[DecisionKind]]:
        return {d.test: {r.kind for r in d.reasons} for d in self.plan().selected}

    def sentences(self, test: str) -> str:
        return " | ".join(r.sentence for r in self.plan().by_test[test].reasons)


@pytest.fixture
def scene_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "repo"


def make(root: Path, files: Mapping[str, str]) -> Scene:
    return Scene(root, files)


OTHER = "def other():\n    return 3\n"

# ---------------------------------------------------------------- compiled code (item 3)

KERNEL = '''import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, n):
    pid = tl.program_id(0)
    return pid + n


def add(x):
    add_kernel[(1,)](x, 4)
    return x
'''
OPS = '''from kern import add_kernel


def run(x):
    add_kernel[(2,)](x, 8)
    return x
'''


def test_triton_jit_body_edit_selects_the_callers_and_module_users(scene_dir: Path) -> None:
    s = make(scene_dir, {"kern.py": KERNEL, "ops.py": OPS, "other.py": OTHER})
    # The kernel body never runs as Python: the evidence holds its callers only.
    s.record("//t:k", {"kern.py": ["<module>", "add"]})
    s.record("//t:ops", {"ops.py": ["run"]})  # kern.py imported before recording began
    s.record("//t:other", {"other.py": None})
    s.repo.write({"kern.py": KERNEL.replace("pid + n", "pid * n")})
    assert s.chosen() == {"//t:k": {DecisionKind.COMPILED_CODE},
                          "//t:ops": {DecisionKind.COMPILED_CODE}}
    why = s.sentences("//t:k")
    assert "@triton.jit" in why and "line events" in why
    assert "executes ops.py::run" in s.sentences("//t:ops")


def test_torch_compile_call_site_targets(scene_dir: Path) -> None:
    model = '''import torch


class Block:
    def __init__(self):
        self.fwd = torch.compile(self._fwd)

    def _fwd(self, x):
        return x * 2

    def __call__(self, x):
        return self.fwd(x)


def f(x):
    return x + 1


f2 = torch.compile(f, mode="max-autotune")
'''
    s = make(scene_dir, {"model.py": model, "other.py": OTHER})
    s.record("//t:m", {"model.py": ["<module>", "Block.__init__", "Block.__call__"]})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"model.py": model.replace("x * 2", "x * 3")})
    assert s.chosen() == {"//t:m": {DecisionKind.COMPILED_CODE}}
    assert "torch.compile(self._fwd)" in s.sentences("//t:m")
    s.repo.write({"model.py": model.replace("x + 1", "x + 2")})
    assert s.chosen() == {"//t:m": {DecisionKind.COMPILED_CODE}}


NET = """import torch


def scale(x):
    return x * 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return scale(x) + 1
"""
#: How other files compile Net (issue 32 item 3): each marks Net.forward and what it calls.
COMPILES_NET = {
    "instance": "import torch\nfrom model import Net\n\n\ndef build():\n    net = Net()\n"
                "    return torch.compile(net, backend='eager')\n",
    "module_compile": "from model import Net\n\n\ndef build():\n    net = Net()\n"
                      "    net.compile(backend='eager')\n    return net\n",
}


@pytest.mark.parametrize("how", sorted(COMPILES_NET))
def test_a_class_compiled_in_another_file(scene_dir: Path, how: str) -> None:
    s = make(scene_dir, {"model.py": NET, "train.py": COMPILES_NET[how], "other.py": OTHER})
    # Evidence without traced frames: dynamo ran forward and scale symbolically.
    s.record("//t:m", {"model.py": ["<module>", "Net", "Net.__init__"], "train.py": None})
    s.record("//t:other", {"other.py": None})
    for old, new in (("scale(x) + 1", "scale(x) + 2"), ("x * 2", "x * 3")):
        s.repo.write({"model.py": NET.replace(old, new)})
        assert s.chosen() == {"//t:m": {DecisionKind.COMPILED_CODE}}, (how, old)
        assert "in train.py" in s.sentences("//t:m")


WRAPPER = "import torch\n\n\ndef compiled(fn):\n    return torch.compile(fn, backend='eager')\n"
USES_WRAPPER = """from jit import compiled


def scale(x):
    return x * 3


@compiled
def fused(x):
    return scale(x) + 1
"""
PARTIAL = """import functools

import torch

fast = functools.partial(torch.compile, backend="eager")


def scale(x):
    return x * 3


@fast
def fused(x):
    return scale(x) + 1


@functools.partial(torch.compile, fullgraph=True)
def fused2(x):
    return x - 1
"""


@pytest.mark.parametrize("src", ["wrapper", "partial"])
def test_a_compile_wrapper_or_partial_used_as_decorator(scene_dir: Path, src: str) -> None:
    files = {"ops.py": USES_WRAPPER if src == "wrapper" else PARTIAL, "jit.py": WRAPPER,
             "other.py": OTHER}
    s = make(scene_dir, files)
    s.record("//t:ops", {"ops.py": ["<module>"]})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"ops.py": files["ops.py"].replace("x * 3", "x * 4")})
    assert s.chosen() == {"//t:ops": {DecisionKind.COMPILED_CODE}}
    assert "torch.compile" in s.sentences("//t:ops")
    if src == "partial":
        s.repo.write({"ops.py": PARTIAL.replace("x - 1", "x - 2")})
        assert s.chosen() == {"//t:ops": {DecisionKind.COMPILED_CODE}}


def test_compile_is_not_re_compile() -> None:
    src = "import re\n\n\ndef f(p):\n    return p\n\n\nx = re.compile(f('a'))\n"
    assert compiled_units(src) == {}


def test_numba_njit_edit(scene_dir: Path) -> None:
    src = '''from numba import njit


@njit(cache=True)
def fast_sum(a):
    total = 0
    for v in a:
        total += v
    return total


def total(a):
    return fast_sum(a)
'''
    s = make(scene_dir, {"nb.py": src, "other.py": OTHER})
    s.record("//t:n", {"nb.py": ["<module>", "total"]})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"nb.py": src.replace("total += v", "total -= v")})
    assert s.chosen() == {"//t:n": {DecisionKind.COMPILED_CODE}}


def test_compiled_detection_forms() -> None:
    src = '''import torch
import numba
import jax
from triton import jit as tjit
from torch import compile
tl_jit = tjit


@tl_jit
def k1(x):
    return helper(x)


def helper(x):
    return x


@compile
def c1(x):
    def inner(y):
        return y
    return inner(x)


@torch._dynamo.optimize("inductor")
def c2(x):
    return x


@numba.cuda.jit
def c3(x):
    return x


@jax.jit
def c4(x):
    return x


def plain(x):
    return x


scripted = torch.jit.script(plain)


class M:
    def __init__(self):
        self.fwd = torch.compile(self._fwd)

    def _fwd(self, x):
        return x

    def eager(self, x):
        return x
'''
    got = {q: c.how for q, c in compiled_units(src).items()}
    assert set(got) == {"k1", "helper", "c1", "c1.<locals>.inner", "c2", "c3", "c4", "plain",
                        "M._fwd"}
    assert got["k1"] == "@triton.jit" and "compiled k1" in got["helper"]
    assert compiled_units("def f(x):\n    return x\n") == {}


def test_compiled_kind_and_reason_text() -> None:
    old = "import torch\n\n\n@torch.jit.script\ndef f(x):\n    return x\n"
    d = diff_sources("m.py", old.encode(), old.replace("return x", "return -x").encode())
    (u,) = d.units
    assert u.kinds == (ChangeKind.BODY, ChangeKind.COMPILED) and u.detail == "@torch.jit.script"


# ---------------------------------------------------------------- new names (item 4)

def test_new_def_shadowing_a_star_import(scene_dir: Path) -> None:
    api = "from base import *\n\n\ndef use():\n    return helper()\n"
    s = make(scene_dir, {"base.py": "def helper():\n    return 1\n", "api.py": api,
                         "other.py": OTHER})
    s.record("//t:api", {"api.py": None, "base.py": None})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"api.py": api + "\n\ndef helper():\n    return 2\n"})
    chosen = s.chosen()
    assert set(chosen) == {"//t:api"}
    assert "star-imports from base" in s.sentences("//t:api")


REG_BASE = '''class Op:
    registry = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        Op.registry[cls.__name__.lower()] = cls
'''
REG_OPS = '''from pkg.base import Op


class Add(Op):
    def __call__(self, a, b):
        return a + b
'''


def test_new_subclass_registered_by_a_base_in_another_module(scene_dir: Path) -> None:
    s = make(scene_dir, {"pkg/__init__.py": "", "pkg/base.py": REG_BASE, "pkg/ops.py": REG_OPS,
                         "other.py": OTHER})
    s.record("//t:reg", {"pkg/base.py": None, "pkg/ops.py": None})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"pkg/ops.py": REG_OPS + "\n\nclass Plain:\n    pass\n"})
    assert s.chosen() == {}  # a class with no base registers nowhere
    s.repo.write({"pkg/ops.py": REG_OPS + "\n\nclass Mul(Op):\n    pass\n"})
    assert set(s.chosen()) == {"//t:reg"}
    assert "base Op may register subclasses" in s.sentences("//t:reg")


def test_new_name_in_a_module_with_getattr(scene_dir: Path) -> None:
    lazy = ("def __getattr__(name):\n    return lambda: name\n\n\n"
            "def known():\n    return 1\n")
    s = make(scene_dir, {"lazy.py": lazy, "other.py": OTHER})
    s.record("//t:lazy", {"lazy.py": ["<module>", "known"]})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"lazy.py": lazy + "\n\ndef fresh():\n    return 2\n"})
    assert set(s.chosen()) == {"//t:lazy"}
    assert "__getattr__" in s.sentences("//t:lazy")


def test_new_name_found_by_getattr_discovery_elsewhere(scene_dir: Path) -> None:
    acts = "def gelu(x):\n    return x\n"
    registry = "import pkg.acts as acts\n\n\ndef get(name):\n    return getattr(acts, name)\n"
    s = make(scene_dir, {"pkg/__init__.py": "", "pkg/acts.py": acts,
                         "pkg/registry.py": registry, "other.py": OTHER})
    s.record("//t:disc", {"pkg/registry.py": None})
    s.record("//t:acts", {"pkg/acts.py": ["gelu"]})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"pkg/acts.py": acts + "\n\ndef silu(x):\n    return x\n"})
    assert s.chosen() == {"//t:disc": {DecisionKind.STATIC_REACH}}
    assert "getattr(acts, ...)" in s.sentences("//t:disc")


def test_ordinary_new_helper_selects_nothing_even_next_to_discovery(scene_dir: Path) -> None:
    acts = "def gelu(x):\n    return x\n"
    registry = "import pkg.acts as acts\n\n\ndef get(name):\n    return getattr(acts, name)\n"
    s = make(scene_dir, {"pkg/__init__.py": "", "pkg/acts.py": acts,
                         "pkg/registry.py": registry, "pkg/util.py": OTHER})
    s.record("//t:disc", {"pkg/registry.py": None, "pkg/acts.py": None})
    s.record("//t:util", {"pkg/util.py": None})
    s.repo.write({"pkg/util.py": OTHER + "\n\ndef helper():\n    return 4\n",
                  "pkg/extra.py": "def new_helper():\n    return 5\n"})
    assert s.chosen() == {}


APP = '''try:
    from pkg.fast import kernel
except ImportError:
    kernel = None


def run(x):
    return kernel(x) if kernel else x
'''


def test_new_file_completing_a_try_except_import(scene_dir: Path) -> None:
    s = make(scene_dir, {"pkg/__init__.py": "", "pkg/app.py": APP, "other.py": OTHER})
    s.record("//t:app", {"pkg/app.py": None})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"pkg/fast.py": "def kernel(x):\n    return -x\n"})
    assert s.chosen() == {"//t:app": {DecisionKind.STATIC_REACH}}
    why = s.sentences("//t:app")
    assert "new file pkg/fast.py" in why and "inside try/except" in why
    # Committed without re-recording, then deleted again: the test's evidence was
    # recorded without the file, so for it nothing changed.
    s.base = s.repo.commit()
    s.repo.write({"pkg/fast.py": None})
    assert s.chosen() == {}
    # Re-recorded with the file present, deleting it reaches the same importer.
    s.record("//t:app", {"pkg/app.py": None})
    assert s.chosen() == {"//t:app": {DecisionKind.STATIC_REACH}}


def test_new_file_named_by_importlib_or_found_by_pkgutil(scene_dir: Path) -> None:
    loader = ('import importlib\nimport pkgutil\n\n\ndef load():\n'
              '    return [importlib.import_module(f"{__name__}.{m.name}")\n'
              '            for m in pkgutil.iter_modules(__path__)]\n')
    config = 'import importlib\n\nBACKEND = importlib.import_module("backends.cuda")\n'
    s = make(scene_dir, {"plugins/__init__.py": loader, "plugins/a.py": OTHER,
                         "cfg.py": config, "other.py": OTHER})
    s.record("//t:plug", {"plugins/__init__.py": None, "plugins/a.py": None})
    s.record("//t:cfg", {"cfg.py": None})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"plugins/b.py": OTHER, "backends/cuda.py": OTHER})
    assert s.chosen() == {"//t:plug": {DecisionKind.STATIC_REACH},
                          "//t:cfg": {DecisionKind.STATIC_REACH}}


def test_new_or_deleted_init_reaches_the_whole_tree(scene_dir: Path) -> None:
    s = make(scene_dir, {"ns/a.py": OTHER, "ns/sub/b.py": OTHER, "other.py": OTHER})
    s.record("//t:a", {"ns/a.py": None})
    s.record("//t:b", {"ns/sub/b.py": None})
    s.record("//t:other", {"other.py": None})
    s.repo.write({"ns/__init__.py": ""})
    assert s.chosen() == {"//t:a": {DecisionKind.STATIC_REACH},
                          "//t:b": {DecisionKind.STATIC_REACH}}
    assert "regular package" in s.sentences("//t:b")
    s.base = s.repo.commit()
    s.record("//t:a", {"ns/a.py": None})
    s.record("//t:b", {"ns/sub/b.py": None})
    s.repo.write({"ns/__init__.py": None})
    assert set(s.chosen()) == {"//t:a", "//t:b"}


def test_static_facts_namespace_and_registration() -> None:
    assert open_namespace(parse("import sys\nX = sys.modules[__name__]\n"))
    assert open_namespace(parse("def f():\n    return globals()\n"))
    assert open_namespace(parse("def f():\n    return dir()\n")) is None
    assert open_namespace(parse("import os\n\n\ndef f():\n    return 1\n")) is None
    got = registrable_classes(parse("class A:\n    pass\nclass B(Exception):\n    pass\n"
                                    "class C(A):\n    pass\nclass D(metaclass=M):\n    pass\n"))
    assert set(got) == {"C", "D"}
    assert discovers_files(parse("import ast\n\nfor n in ast.walk(t):\n    pass\n")) is None
    assert discovers_files(parse("import os\n\nNAMES = os.listdir(HERE)\n"))


# ---------------------------------------------------------------- ignored inputs (item 5)

def test_git_ignored_read_file_changed_or_deleted(scene_dir: Path) -> None:
    s = make(scene_dir, {".gitignore": ".fastci/\ndata/\n", "tok.py": OTHER, "other.py": OTHER})
    tok = s.root / "data/tok.json"
    tok.parent.mkdir(parents=True)
    tok.write_text('{"vocab": 1}\n')
    digest = hashlib.sha256(tok.read_bytes()).hexdigest()
    s.record("//t:tok", {"tok.py": None}, reads={"data/tok.json": digest})
    s.record("//t:other", {"other.py": None})
    assert s.chosen() == {}  # same content as recorded
    tok.write_text('{"vocab": 2}\n')
    assert s.chosen() == {"//t:tok": {DecisionKind.READ_CHANGED_FILE}}
    assert "read data/tok.json (not tracked by git), whose content differs" in \
        s.sentences("//t:tok")
    tok.unlink()
    assert s.chosen() == {"//t:tok": {DecisionKind.READ_CHANGED_FILE}}
    assert "is gone" in s.sentences("//t:tok")


def test_compile_of_a_call_result_marks_classes_only() -> None:
    src = ("def select(x):\n    return x\n\n\nclass Net:\n    def forward(self, x):\n"
           "        return x\n\n\nq = select(1).compile()\nn = Net().compile()\n")
    assert set(compiled_units(src)) == {"Net.forward"}
