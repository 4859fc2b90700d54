"""The prune-default benchmark's scoring (bench.prune_mix; its runs need the example's
recorded workspace): misses per failing test under the rerun rule, and the mix's shape."""

from __future__ import annotations

from pathlib import Path

from bench.prune_mix import MixRow, is_function, benign_edit, benign_units, report, score


def _row(name: str, failing: tuple[str, ...] = (), pruned: tuple[str, ...] = ("//t:b",)) -> MixRow:
    return MixRow(name, "bench", selected=("//t:a", "//t:b"), pruned=pruned, failing=failing,
                  costs={"//t:a": 1.0, "//t:b": 3.0})


def test_a_failing_pruned_test_is_a_miss_only_when_every_kept_test_passes() -> None:
    # Kept a fails: fastci run then runs the pruned b, no miss, all 4 GPU-s spent.
    caught = score([_row("bug1", failing=("//t:a", "//t:b"))])
    assert caught.misses == () and caught.pruned_gpu_s == 4.0 and caught.reruns == 1
    # Only the pruned b fails: nothing triggers the rerun, b is a miss.
    lost = score([_row("bug2", failing=("//t:b",))])
    assert lost.misses == (("bug2", "//t:b"),) and lost.pruned_gpu_s == 1.0


def test_the_verdict_needs_a_ci_shaped_mix_and_zero_misses() -> None:
    passing = [_row(f"ok{i}") for i in range(4)]
    s = score([*passing, _row("bug1", failing=("//t:a",)), _row("bug2", failing=("//t:a",))])
    assert (s.passing, s.failing, s.shaped) == (4, 2, True)
    assert s.ratio == (4 * 1.0 + 2 * 4.0) / (6 * 4.0)
    assert s.verdict().startswith("safe may be the default: 0 misses, 0.50x")
    thin = score([passing[0], _row("bug1", failing=("//t:a",))])
    assert not thin.shaped and thin.verdict().startswith("no verdict: 1 passing and 1 failing")
    missed = score([*passing, _row("bug2", failing=("//t:b",))])
    assert missed.verdict() == "keep prune: off (1 failing test(s) never ran)"
    assert any("verdict: keep prune: off" in line for line in report([*passing,
                                                                       _row("bug2", failing=("//t:b",))]))


def test_a_benign_edit_changes_the_function_and_not_its_behaviour() -> None:
    src = 'class A:\n    def f(self, x):\n        """Doc."""\n        return x + 1\n'
    out = benign_edit(src, "A.f")
    assert out == 'class A:\n    def f(self, x):\n        """Doc."""\n        _unused = 0\n        return x + 1\n'
    ns: dict[str, object] = {}
    exec(compile(out, "m.py", "exec"), ns)  # noqa: S102 - our own literal source
    assert ns["A"]().f(1) == 2  # type: ignore[operator]
    assert benign_edit(src, "A.g") is None


def test_interleave_keeps_every_prefix_shaped_and_loses_nothing() -> None:
    from bench.prune_mix import interleave

    order = interleave(["p1", "p2", "p3", "p4", "p5"], ["f1", "f2"], 2)
    assert order == ["p1", "p2", "f1", "p3", "p4", "f2", "p5"]
    for cut in range(len(order) + 1):  # an interrupted run: 2 passing per other so far
        prefix = order[:cut]
        others = sum(x.startswith("f") for x in prefix)
        assert len(prefix) - others >= 2 * others


def test_rows_saved_as_measured_load_back_for_a_resumed_run(tmp_path: Path) -> None:
    from bench.prune_mix import MixRow, load_rows, save_row

    rows = [MixRow("a", "benign", ("t1", "t2"), ("t2",), (), {"t1": 1.5, "t2": 2.0}),
            MixRow("b", "bench", ("t1",), (), ("t1",), {"t1": 3.0}, note="")]
    path = tmp_path / "deep" / "rows.jsonl"
    assert load_rows(path) == []
    for r in rows:
        save_row(path, r)
    assert load_rows(path) == rows


def test_a_red_base_is_named_since_safe_pruning_holds_nothing_there() -> None:
    from types import SimpleNamespace

    from bench.prune_mix import red_at_base

    class Store:
        def latest_runs(self) -> dict[str, SimpleNamespace]:
            return {"//t:ok": SimpleNamespace(outcome="passed"),
                    "//t:slow": SimpleNamespace(outcome="failed"),
                    "//t:crashed": SimpleNamespace(outcome="error"),
                    "//t:xfail": SimpleNamespace(outcome="xfailed")}

    assert red_at_base(Store()) == ["//t:crashed", "//t:slow"]  # type: ignore[arg-type]


def test_benign_edits_are_drawn_from_functions_only(tmp_path: Path) -> None:
    # A class body is a unit that tests reach too, but there is no function to edit.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("class A:\n    x = 1\n\n    def f(self):\n"
                                           "        return 1\n\n\ndef g():\n    return 2\n")
    recorded = [(t, u, "c") for t in ("t1", "t2") for u in ("pkg/m.py::A", "pkg/m.py::A.f",
                                                            "pkg/m.py::g", "pkg/gone.py::h")]
    every = benign_units(recorded, "pkg", count=10, seed=1, max_tests=4)
    assert every == ["pkg/gone.py::h", "pkg/m.py::A", "pkg/m.py::A.f", "pkg/m.py::g"]
    only = benign_units(recorded, "pkg", count=10, seed=1, max_tests=4,
                        editable=lambda unit: is_function(tmp_path, unit))
    assert only == ["pkg/m.py::A.f", "pkg/m.py::g"]
