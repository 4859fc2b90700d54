"""``make gpu-check`` (tools/gpu_check/check.py), on a host without a GPU.

The check itself needs a GPU; here: it stops at once without one, its CPU smoke is never
mistaken for it, and the pieces that turn measurements into verdicts (the blind-spot plan,
the reduced-vs-full GPU-seconds, the recording overhead, the report) decide right.
The whole smoke (every stage on CPU, two tests, one change) is ``make gpu-check-smoke``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fastci.eval.results import Arm, ChangeResult
from fastci.eval.results import TestOutcome as Outcome

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_check" / "check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = _load()


def test_without_a_gpu_it_stops_at_once_with_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    began = time.perf_counter()
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == gc.NO_GPU_EXIT
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "gpu-check: no GPU visible (torch.cuda.is_available() is False): make gpu-check runs only on a GPU host"]
    assert time.perf_counter() - began < 60  # one torch import, no stage ran
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu"], "--device cpu is only the smoke"),
    (["--smoke"], "--smoke runs on CPU"),
])
def test_the_cpu_smoke_is_never_the_check(argv: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                         check=False, timeout=60)
    assert res.returncode == 2 and message in res.stderr


def test_the_subset_spans_tp_pp_dp_checkpointing_kv_cache_and_a_golden() -> None:
    suite = gc.load_suite(REPO)
    assert len(gc.SUBSET) >= 6
    for name in gc.SUBSET:
        spec = suite[name]
        assert spec["floors"], f"{name} is not reducible"
    workloads = [suite[n]["workload"] for n in gc.SUBSET]
    assert any(w.get("tp", 1) > 1 for w in workloads)
    assert any(w.get("pp", 1) > 1 for w in workloads)
    assert any(w.get("dp", 1) > 1 for w in workloads)
    scopes = {s for n in gc.SUBSET for s in suite[n]["scope"]}
    assert {"checkpoint_resume", "decode_parity", "golden_regression"} <= scopes
    assert gc.tp_tests(suite, gc.SUBSET) == ["tp_parity_test", "checkpoint_resume_test",
                                              "kv_cache_decode_test", "golden_loss_test"]
    assert (REPO / "bench" / "changes" / f"{gc.BLIND_SPOT}.patch").is_file()
    assert all((REPO / "bench" / "changes" / f"{c}.patch").is_file() for c in gc.CHANGES)


def _plan(*names: str, mode: str = "selective") -> dict[str, Any]:
    return {"mode": mode, "reason": "r",
            "tests": [{"id": f"examples/microllm/tests/{n}.py::test_x", "overrides": {}} for n in names]}


def test_blind_spot_fails_when_a_tp_test_is_left_out() -> None:
    tp = ["tp_parity_test", "golden_loss_test"]
    ok = gc.blind_spot_outcome(_plan("tp_parity_test", "golden_loss_test"), tp, gc.SUBSET)
    assert ok["selected"] == ["tp_parity_test", "golden_loss_test"] and ok["tp_missed"] == []
    with pytest.raises(gc.StageFailed, match=r"left TP tests out of the plan: \['golden_loss_test'\]"):
        gc.blind_spot_outcome(_plan("tp_parity_test"), tp, gc.SUBSET)
    everything = gc.blind_spot_outcome(_plan(mode="all"), tp, gc.SUBSET)
    assert "not because evidence saw them" in everything["note"]


def _result(change: str, tests: tuple[Outcome, ...], missed: tuple[dict[str, str], ...] = ()) -> ChangeResult:
    return ChangeResult(change=change, kind="patch", title="t", base="b", head="h", settings={},
                        plan_mode="selective", plan_reason="r", analysis_s=0.5,
                        run_all=Arm(tests=3, gpu_s=30.0, latency_s=12.0),
                        fastci=Arm(tests=2, gpu_s=6.0, latency_s=4.0), changed_lines=1,
                        retained_lines=1, missed=missed, tests=tests)


def test_plans_compare_reduced_runs_with_the_same_tests_at_full() -> None:
    tests = (
        Outcome(id="a", gpus=2, all_outcome="passed", all_s=10.0, planned=True,
                    overrides={"train_iters": 2}, plan_outcome="passed", plan_s=2.0),
        Outcome(id="b", gpus=1, all_outcome="passed", all_s=5.0, planned=True,  # full: not a reduced run
                    plan_outcome="passed", plan_s=5.0, reused=True),
        Outcome(id="c", gpus=0, all_outcome="passed", all_s=4.0, planned=True,
                    overrides={"num_layers": 1}, plan_outcome="passed", plan_s=1.0),
        Outcome(id="d", gpus=1, all_outcome="failed", all_s=3.0, planned=False),
    )
    got = gc.summarize_plans([_result("patch:x", tests, missed=({"test": "d", "why": "skipped"},))])
    assert [p["test"] for p in got["per_test"]] == ["a", "c"]
    assert (got["reduced_gpu_s"], got["full_gpu_s"]) == (5.0, 24.0)  # (2*2 + 1*1) vs (10*2 + 4*1)
    assert got["reduced_over_full"] == round(5.0 / 24.0, 3)
    assert got["escapes"] == ["patch:x: d"]
    assert got["changes"][0]["latency_s"] == 4.0 and got["changes"][0]["all_latency_s"] == 12.0


def test_recording_overhead_is_the_ratio_of_medians() -> None:
    got = gc.overhead_outcome([10.0, 11.0, 30.0], [11.0, 12.0, 12.5])
    assert got["recording_over_plain"] == round(12.0 / 11.0, 3)


def test_on_python_3_12_the_overhead_is_the_sys_monitoring_engines() -> None:
    assert gc.engine_problem("monitoring", "3.12") is None
    assert gc.engine_problem("coverage", "3.11") is None  # 3.11 has no other engine
    assert "records with coverage, not sys.monitoring" in str(gc.engine_problem("coverage", "3.13"))


def test_the_engine_is_asked_of_the_hosts_python(tmp_path: Path) -> None:
    ctx = gc.Ctx(root=REPO, out=tmp_path, device="cpu", smoke=True, tests=("tp_parity_test",),
                 changes=(gc.BLIND_SPOT,), pairs=1)
    engine, version, hook = gc.recording_engine(ctx)
    assert version == "%d.%d" % sys.version_info[:2]
    assert engine == ("monitoring" if sys.version_info >= (3, 12) else "coverage")
    assert hook == "c"  # make setup built it in place; run.sh builds it on the GPU host
    got = gc.overhead_outcome([1.0], [1.1], engine=f"{engine} (Python {version})")
    assert got["engine"].startswith(engine)


def test_report_names_card_driver_torch_date_and_says_when_it_is_a_smoke(tmp_path: Path) -> None:
    ctx = gc.Ctx(root=REPO, out=tmp_path, device="cpu", smoke=True, tests=("tp_parity_test",),
                 changes=(gc.BLIND_SPOT,), pairs=1)
    ctx.results["probe"] = {"card": "CPU smoke (not the GPU check)", "driver": "", "torch": "2.x",
                            "cuda": None, "date": "2026-12-07 18:00 UTC"}
    ctx.results["overhead"] = gc.overhead_outcome([1.0], [1.3])
    stages = {"overhead": {"seconds": 3.0, "budget_s": 40, "outcome": "passed"}}
    doc = gc.write_report(ctx, stages, ok=True)
    assert doc["targets"]["recording_over_plain"]["met"] is False  # 1.3 > 1.15
    assert doc["targets"]["reduced_over_full"]["met"] is None  # not measured: never "met"
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("### CPU SMOKE of make gpu-check (not GPU numbers)")
    assert "| card | driver | torch (CUDA) | date |" in md and "2026-12-07 18:00 UTC" in md
    assert "1.3 (MISSED; target <= 1.15)" in md
    assert json.loads((tmp_path / "results.json").read_text())["smoke"] is True


def test_in_test_seconds_come_from_the_plugins_result_lines(tmp_path: Path) -> None:
    lines = tmp_path / "r.jsonl"
    lines.write_text(json.dumps({"id": "a.py::t", "outcome": "passed", "duration_s": 1.25}) + "\n")
    assert [gc.seconds(r) for r in gc.read_result_lines(lines)] == [1.25]
    with pytest.raises(gc.StageFailed, match="without duration_s"):
        gc.seconds({"id": "a.py::t", "duration": 1.0})  # never a silent 0


def test_a_failed_rung_is_not_a_failed_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ctx = gc.Ctx(root=REPO, out=tmp_path, device="cpu", smoke=True, tests=("tp_parity_test", "dp_parity_test"),
                 changes=(), pairs=1, scratch=REPO)
    outputs = {"tp_parity_test": gc.Ran(0, "calibrated 5 rungs", 1.0),
               "dp_parity_test": gc.Ran(1, "fastci calibrate: 1 rung(s) did not pass, e.g. ...", 1.0)}
    monkeypatch.setattr(gc, "run", lambda cmd, **kw: outputs[cmd[-1].split("/")[-1].split(".py")[0]])
    got = gc.stage_calibrate(ctx)
    assert list(got["rungs_failed"]) == ["examples/microllm/tests/dp_parity_test.py::test_dp_parity"]
    outputs["dp_parity_test"] = gc.Ran(1, "fastci: pytest cannot collect the tests to calibrate", 1.0)
    with pytest.raises(gc.StageFailed, match="calibrate failed for 1 test"):
        gc.stage_calibrate(ctx)


REACH_OUT = """tests/test_record_reach.py::test_autograd_multithreading_is_off_while_recording_and_restored_after PASSED [ 33%]
tests/test_record_reach.py::test_editing_a_custom_backward_selects_the_test_that_ran_it[cpu] PASSED [ 66%]
tests/test_record_reach.py::test_editing_a_custom_backward_selects_the_test_that_ran_it[cuda] {cuda} [100%]
"""


def test_the_recorders_device_case_must_run_on_the_gpu() -> None:
    check = _load()
    ran = check.reach_outcome(0, REACH_OUT.format(cuda="PASSED"), need_cuda=True)
    assert ran["cases"]["test_editing_a_custom_backward_selects_the_test_that_ran_it[cuda]"] == "PASSED"
    with pytest.raises(check.StageFailed, match="did not run on the device"):
        check.reach_outcome(0, REACH_OUT.format(cuda="SKIPPED"), need_cuda=True)
    assert check.reach_outcome(0, REACH_OUT.format(cuda="SKIPPED"), need_cuda=False)  # the smoke
    with pytest.raises(check.StageFailed, match="failed"):
        check.reach_outcome(1, REACH_OUT.format(cuda="FAILED"), need_cuda=False)
