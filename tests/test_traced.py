"""Frames dynamo traces are evidence (fastci.evidence.record.traced), recorded with pytest for
real and planned: a model compiled with ``torch.compile(model)``, one compiled with
``model.compile()``, one run through ``torch._dynamo.explain``, a function compiled by a
project decorator defined in another module, and a helper reached only inside a
compiled model: each broken in turn, the tests that run it are selected (issue 32
item 3). And the compiled-code rule narrowed to evidence (issue 38 item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastci.evidence.store.db import EvidenceStore
from fastci.evidence.record.traced import TRACED_CONTEXT

pytest.importorskip("torch")

FILES = {
    "pkg/__init__.py": "",
    # A helper reached only inside a compiled model (through a submodule of another file).
    "pkg/kv.py": textwrap.dedent('''\
        import torch


        def keep(n):
            return n


        class KVCache(torch.nn.Module):
            def forward(self, x):
                return x[: keep(x.shape[0])]
        '''),
    "pkg/model.py": textwrap.dedent('''\
        import torch

        from pkg.kv import KVCache


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.kv = KVCache()

            def forward(self, x):
                return self.kv(x) * 2
        '''),
    # A project decorator, in its own module, that compiles what it decorates.
    "pkg/jit.py": textwrap.dedent('''\
        import torch


        def compiled(fn):
            return torch.compile(fn, backend="eager")
        '''),
    "pkg/ops.py": textwrap.dedent('''\
        from pkg.jit import compiled


        def scale(x):
            return x * 3


        @compiled
        def fused(x):
            return scale(x) + 1
        '''),
    # A decoding step compiled only when asked (issue 38 item 4).
    "pkg/decode.py": textwrap.dedent('''\
        import torch


        def sample(logits):
            return logits.argmax(-1)


        def step(logits):
            return sample(logits)


        def generate(logits, compile=False):
            fn = torch.compile(step, backend="eager") if compile else step
            return fn(logits)
        '''),
    "test_a.py": textwrap.dedent('''\
        import pytest
        import torch

        from pkg import decode
        from pkg.model import Net
        from pkg.ops import fused


        @pytest.fixture(scope="module")
        def compiled_net():
            return torch.compile(Net(), backend="eager")


        def test_compile_instance(compiled_net):
            assert compiled_net(torch.ones(2, 3)).tolist() == [[2.0] * 3] * 2


        def test_compiled_again(compiled_net):  # dynamo's cache: nothing traced anew
            assert compiled_net(torch.ones(3, 3)).shape == (3, 3)


        def test_module_compile():
            net = Net()
            net.compile(backend="eager")
            assert net(torch.ones(2, 3)).shape == (2, 3)


        def test_explain_one_graph():
            assert torch._dynamo.explain(Net())(torch.ones(2, 3)).graph_count == 1


        def test_wrapper():
            assert fused(torch.ones(2)).tolist() == [4.0, 4.0]


        def test_generate():
            assert decode.generate(torch.eye(3)).tolist() == [0, 1, 2]


        def test_generate_compiled():
            assert decode.generate(torch.eye(3), compile=True).tolist() == [0, 1, 2]


        def test_plain():
            assert torch.ones(1).item() == 1
        '''),
    ".gitignore": "__pycache__/\n",
}
NET_TESTS = {f"test_a.py::{n}" for n in ("test_compile_instance", "test_compiled_again",
                                          "test_module_compile", "test_explain_one_graph")}


class Recorded:
    """The project, recorded with pytest and ingested at its base commit."""

    def __init__(self, root: Path, store: EvidenceStore, base: str) -> None:
        self.root, self.store, self.base = root, store, base

    def plan_after(self, rel: str, old: str, new: str, *, run: bool = False
                   ) -> tuple[set[str], set[str]]:
        """(tests selected, tests failing when ``run``) with ``old`` replaced by ``new``."""
        from record_support import edited, plan_now, run_pytest

        failing: set[str] = set()
        with edited(self.root / rel, old, new):
            a = plan_now(self.root, self.base, self.store)
            if run:
                res = run_pytest(self.root, "-rf", "test_a.py")
                failing = {line.split()[1] for line in res.stdout.splitlines()
                           if line.startswith("FAILED ")}
        assert a.plan.mode == "selective", a.plan.reason
        return {d.test for d in a.selection.selected}, failing


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    from record_support import record

    root = tmp_path_factory.mktemp("traced") / "repo"
    _, store, base = record(root, FILES, "test_a.py", passed=8)
    yield Recorded(root, store, base)
    store.close()


def test_traced_frames_are_executed_units_marked_traced(recorded: Recorded) -> None:
    users = recorded.store.tests_for_units(["pkg/kv.py::keep", "pkg/kv.py::KVCache.forward",
                                            "pkg/ops.py::scale", "pkg/decode.py::sample"])
    # Inlined into the compiled Net.forward: never a Python call, yet every test that ran
    # the model has them, also the one that found Net.forward in dynamo's cache.
    assert users["pkg/kv.py::keep"] == users["pkg/kv.py::KVCache.forward"] == NET_TESTS
    assert users["pkg/ops.py::scale"] == {"test_a.py::test_wrapper"}
    assert users["pkg/decode.py::sample"] == {"test_a.py::test_generate",
                                              "test_a.py::test_generate_compiled"}
    units = recorded.store.units_of_test("test_a.py::test_explain_one_graph")
    assert list(units["pkg/kv.py::keep"]) == [TRACED_CONTEXT]
    assert TRACED_CONTEXT not in units_of_eager(recorded, "test_a.py::test_generate")


def units_of_eager(recorded: Recorded, test: str) -> set[str]:
    return {s for sigs in recorded.store.units_of_test(test).values() for s in sigs}


def test_a_bounds_check_in_a_traced_forward_selects_the_one_graph_test(
        recorded: Recorded) -> None:
    # The miss: a check that reads a tensor value breaks the graph in two.
    planned, failing = recorded.plan_after(
        "pkg/kv.py", "        return x[", "        if x.sum() > 1e9:\n            raise "
        "ValueError(x.shape)\n        return x[", run=True)
    assert failing == {"test_a.py::test_explain_one_graph"}
    assert planned == NET_TESTS


def test_a_helper_reached_only_inside_the_compiled_model_is_selected(recorded: Recorded) -> None:
    planned, _ = recorded.plan_after("pkg/kv.py", "return n\n", "return n - 1\n")
    assert planned == NET_TESTS


def test_a_function_compiled_by_a_decorator_of_another_module_is_selected(
        recorded: Recorded) -> None:
    planned, _ = recorded.plan_after("pkg/ops.py", "return x * 3", "return x * 4")
    assert planned == {"test_a.py::test_wrapper"}


# --------------------------------------------------------------------------- the watch

CHILD = '''
import sys
from pathlib import Path
from fastci.evidence.record.files import PathMapper
from fastci.evidence.record.traced import DynamoWatch, units_of_codes
from fastci.units.lines import line_index

root = Path(sys.argv[1])
watch = DynamoWatch(lambda: None)
watch.start()
armed = any(type(f).__name__ == "_GuardsFinder" for f in sys.meta_path)
if sys.argv[2] == "compile":
    sys.path.insert(0, str(root))
    import torch
    import mod
    torch.compile(mod.outer, backend="eager")(torch.ones(2))
mapper = PathMapper(root, extra_roots=[])
codes = watch.stop(mapper, {}, {})
units = units_of_codes(set().union(*codes.values()), mapper,
                       lambda rel: line_index(rel, (root / rel).read_bytes()))
print(armed, "torch" in sys.modules, sorted(units), watch.problem,
      any(type(f).__name__ == "_GuardsFinder" for f in sys.meta_path))
'''
MOD = "def inner(x):\n    return (lambda y: y + 1)(x)\n\n\ndef outer(x):\n    return inner(x) * 2\n"


def _child(tmp_path: Path, what: str) -> str:
    (tmp_path / "mod.py").write_text(MOD)
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), what],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def test_a_process_that_never_imports_torch_loads_nothing_and_keeps_no_hook(
        tmp_path: Path) -> None:
    assert _child(tmp_path, "nothing") == "True False [] None False"


def test_torch_imported_after_the_recording_started_is_watched(tmp_path: Path) -> None:
    # A child process records from its start, before it imports torch: the import
    # watcher wraps TracingContext when torch loads it. The lambda maps to its unit.
    assert _child(tmp_path, "compile") == \
        "True True [('mod.py', 'inner'), ('mod.py', 'outer')] None False"


def test_dynamo_without_the_hook_counts_every_loaded_repo_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import importlib

    import torch

    from fastci.evidence.record import traced
    from fastci.evidence.record.files import PathMapper
    from fastci.units.lines import line_index

    (tmp_path / "failsafe_mod.py").write_text(MOD.replace("* 2", "* 3"))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("failsafe_mod")
    # A torch whose TracingContext says nothing of what it traced.
    monkeypatch.setattr(traced, "_wrap", lambda guards: "no traced_code in this torch")
    watch = traced.DynamoWatch(lambda: None)
    watch.start()
    torch.compile(mod.outer, backend="eager")(torch.ones(2))
    mapper = PathMapper(tmp_path, extra_roots=[])
    ctx: traced.Ctx = {}
    traced.add_traced(watch, mapper, {}, ctx, {},
                      lambda rel: line_index(rel, (tmp_path / rel).read_bytes()))  # type: ignore[arg-type]
    assert watch.problem == "no traced_code in this torch"
    assert {k: v[0] for k, v in ctx.items()} == {
        ("failsafe_mod.py", q): {traced.TRACED_CONTEXT} for q in ("<module>", "inner", "outer")}
    assert "every loaded repository module counts as traced" in caplog.text
    # Nothing compiled while watching: nothing was missed, the evidence stays as seen.
    watch = traced.DynamoWatch(lambda: None)
    watch.start()
    ctx = {}
    traced.add_traced(watch, mapper, {}, ctx, {}, lambda rel: None)
    assert watch.problem is None and ctx == {}


# --------------------------------------------------------------------------- issue 38 item 4

def test_the_compiled_code_rule_selects_the_tests_whose_evidence_reaches_the_change(
        recorded: Recorded) -> None:
    # sample() is traced through step(), which generate() compiles only when asked: every
    # test imports pkg.decode, but the evidence names the two that ran sample (one of them
    # traced it), and only those can break.
    planned, failing = recorded.plan_after("pkg/decode.py", "return logits.argmax(-1)",
                                           "return logits.argmin(-1)", run=True)
    assert failing == planned == {"test_a.py::test_generate", "test_a.py::test_generate_compiled"}


def test_the_compile_call_site_is_a_witness(recorded: Recorded) -> None:
    # A change of generate itself (the unit holding the compile call) is an executed unit.
    planned, _ = recorded.plan_after("pkg/decode.py", "if compile else step",
                                     "if compile is True else step")
    assert planned == {"test_a.py::test_generate", "test_a.py::test_generate_compiled"}


class _Run:
    def __init__(self, complete: bool, environment: dict[str, str]) -> None:
        self.complete, self.environment = complete, environment


def test_evidence_that_cannot_tell_keeps_the_wide_rule() -> None:
    from fastci.changes.semantic_diff import ChangeKind, UnitChange
    from fastci.changes.compiled_code import Compiled
    from fastci.evidence.record.traced import TRACED_BY_DYNAMO, TRACED_FRAMES_KEY
    from fastci.select.compiled import compiled_reason

    u = UnitChange("d.py::sample", "d.py", "sample", (ChangeKind.BODY, ChangeKind.COMPILED),
                   detail="called or traced from compiled step")
    lazy = Compiled("torch.compile(step)", True, frozenset({"d.py::step", "d.py::generate"}))
    new = _Run(True, {TRACED_FRAMES_KEY: TRACED_BY_DYNAMO})
    ran = {"d.py::generate": {"t1"}}
    assert compiled_reason("t2", "d.py", u, lazy, new, ran) is None
    got = compiled_reason("t1", "d.py", u, lazy, new, ran)
    assert got is not None and got.sentence.startswith("executes d.py::generate")
    for run, why in ((_Run(True, {}), "recorded before FastCI recorded the frames dynamo"),
                     (_Run(False, {TRACED_FRAMES_KEY: TRACED_BY_DYNAMO}), "incomplete"),
                     (None, "incomplete")):
        got = compiled_reason("t2", "d.py", u, lazy, run, ran)
        assert got is not None and "every test whose evidence touches" in got.via
        assert why in got.via
    eager = Compiled("@triton.jit", False, frozenset({"d.py::step"}))
    got = compiled_reason("t2", "d.py", u, eager, new, ran)
    assert got is not None and "other than dynamo" in got.via
