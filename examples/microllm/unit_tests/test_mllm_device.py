"""Where ranks compute: device resolution, GPU sharing, process transport, dtype, references."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

import harness
from microllm import MicroLLMError
from microllm import device as devices
from microllm.config import Config
from microllm.parallel.comm import launch
from microllm.trainer import train


def test_auto_is_cuda_only_when_a_gpu_is_visible() -> None:
    assert devices.resolve("auto", count=0) == "cpu"
    assert devices.resolve("auto", count=1) == "cuda"
    assert devices.resolve("cpu", count=4) == "cpu"


def test_cuda_without_a_visible_gpu_fails_naming_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(MicroLLMError, match="device=cuda but no CUDA device is visible .CUDA_VISIBLE_DEVICES="):
        devices.resolve("cuda", count=0)
    with pytest.raises(MicroLLMError, match="not in"):
        devices.resolve("tpu", count=0)


def test_simulated_ranks_share_the_visible_gpus_round_robin() -> None:
    assert [str(devices.rank_device("cuda", r, count=1)) for r in range(4)] == ["cuda:0"] * 4
    assert [str(devices.rank_device("cuda", r, count=2)) for r in range(4)] == ["cuda:0", "cuda:1"] * 2
    assert devices.rank_device("cpu", 3, count=8) == torch.device("cpu")


def test_process_ranks_use_nccl_only_when_each_has_its_own_gpu() -> None:
    assert devices.process_transport("cuda", 2, count=2) == "nccl"
    assert devices.process_transport("cuda", 4, count=2) == "gloo"  # two processes would share a GPU
    assert devices.process_transport("cpu", 2, count=8) == "gloo"


def test_auto_dtype_follows_the_device_and_an_explicit_one_is_kept() -> None:
    assert devices.compute_dtype_name("auto", "cuda") == "bf16"
    assert devices.compute_dtype_name("auto", "cpu") == "fp32"
    assert devices.compute_dtype_name("fp16", "cuda") == "fp16"
    assert devices.compute_dtype_name("fp32", "cuda") == "fp32"


def test_config_rejects_an_unknown_device() -> None:
    with pytest.raises(MicroLLMError, match="device in"):
        Config.from_flat(device="tpu").validate()


def test_every_rank_context_names_its_device() -> None:
    cfg = Config.from_flat(tp=2, device="cpu").validate()
    seen = launch(lambda ctx: (ctx.global_rank, ctx.device, ctx.tp_group.device), cfg.parallel)
    assert seen == [(0, torch.device("cpu"), torch.device("cpu")), (1, torch.device("cpu"), torch.device("cpu"))]


def test_auto_on_a_cpu_host_is_the_cpu_run_bitwise() -> None:
    flat = dict(tp=2, num_layers=1, hidden_size=32, num_heads=2, seq_length=16, vocab_size=50,
                train_iters=2, micro_batch_size=1, global_batch_size=2)
    auto = train(Config.from_flat(**flat), return_state=True)
    cpu = train(Config.from_flat(**flat, device="cpu"), return_state=True)
    harness.assert_runs_identical(auto, cpu)
    assert all(t.device.type == "cpu" for t in auto.state.values())  # states come back in host memory


def test_references_are_per_device() -> None:
    assert harness.reference_path("golden_loss_test", "cpu").name == "golden_loss_test.json"
    assert harness.reference_path("golden_loss_test", "cuda").name == "golden_loss_test.cuda.json"


def test_a_device_without_its_golden_fails_with_the_command_that_records_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    golden = importlib.import_module("golden_loss_test")
    monkeypatch.setattr(harness, "device_kind", lambda: "cuda")
    monkeypatch.setattr(harness, "GOLDEN_DIR", harness.HERE / "golden" / "absent-for-this-test")
    monkeypatch.delenv("MICROLLM_REGEN_GOLDEN", raising=False)
    w = harness.resolve("golden_loss_test", at_floors=True)
    with pytest.raises(AssertionError, match=r"no cuda reference yet .*golden_loss_test\.cuda\.json.*"
                                             r"MICROLLM_REGEN_GOLDEN=1"):
        golden.check(w)


def test_simulated_ranks_run_backward_on_their_own_threads() -> None:
    # Ranks sharing one GPU would otherwise queue their backward passes on autograd's single
    # worker thread of that device, where a collective inside backward deadlocks.
    cfg = Config.from_flat(tp=2, device="cpu").validate()
    assert launch(lambda ctx: torch._C._is_multithreading_enabled(), cfg.parallel) == [False, False]
    assert torch._C._is_multithreading_enabled()  # the caller's own setting is untouched


def test_a_throughput_floor_is_per_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    throughput = importlib.import_module("throughput_test")
    w = harness.resolve("throughput_test")
    assert throughput.floor_for(w, "cpu") == w["min_tokens_per_s"]
    monkeypatch.setattr(harness, "GOLDEN_DIR", tmp_path)
    monkeypatch.setattr(harness, "HERE", tmp_path.parent)
    with pytest.raises(AssertionError, match="no cuda reference yet .*throughput_test.cuda.json"):
        throughput.floor_for(w, "cuda")
    ref = {"workload": w, "device": "cuda", "measured_tokens_per_s": 90000, "min_tokens_per_s": 36000}
    (tmp_path / "throughput_test.cuda.json").write_text(json.dumps(ref))
    assert throughput.floor_for(w, "cuda") == 36000  # never the CPU floor on a GPU
    with pytest.raises(AssertionError, match="recorded at another workload"):
        throughput.floor_for({**w, "seq_length": w["seq_length"] * 2}, "cuda")
