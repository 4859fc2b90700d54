from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from microllm import CheckpointError
from microllm.checkpoint import latest_iteration
from microllm.config import Config
from microllm.trainer import train

BASE = Config.from_flat(train_iters=4, num_layers=2, hidden_size=32, num_heads=2, seq_length=8,
                        vocab_size=40, micro_batch_size=1, global_batch_size=2)


def test_save_writes_one_shard_per_model_parallel_rank(tmp_path: Path) -> None:
    train(BASE.with_flat(tp=2, pp=2, save=str(tmp_path), save_interval=2))
    assert latest_iteration(str(tmp_path)) == 4
    assert sorted(os.listdir(tmp_path / "iter_0000002")) == [
        "complete.json", "mp_rank_00_000.pt", "mp_rank_00_001.pt", "mp_rank_01_000.pt", "mp_rank_01_001.pt"]
    manifest = json.loads((tmp_path / "iter_0000002" / "complete.json").read_text())
    assert manifest["iteration"] == 2 and len(manifest["shards"]) == 4


def test_loader_refuses_incomplete_iterations(tmp_path: Path) -> None:
    train(BASE.with_flat(tp=2, save=str(tmp_path), save_interval=2))
    (tmp_path / "iter_0000004" / "mp_rank_01_000.pt").unlink()
    with pytest.raises(CheckpointError, match="missing mp_rank_01_000.pt"):
        train(BASE.with_flat(tp=2, load=str(tmp_path), train_iters=5))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    (tmp_path / "iter_0000002" / "complete.json").unlink()
    with pytest.raises(CheckpointError, match="no complete.json"):
        train(BASE.with_flat(tp=1, load=str(tmp_path), train_iters=5))


def test_interrupted_resave_leaves_the_iteration_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train(BASE.with_flat(save=str(tmp_path), save_interval=4))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="disk full"):
        train(BASE.with_flat(save=str(tmp_path), save_interval=4))
    monkeypatch.undo()
    # The marker still names iteration 4, whose shards may now be half old, half new: refused.
    assert latest_iteration(str(tmp_path)) == 4
    with pytest.raises(CheckpointError, match="no complete.json"):
        train(BASE.with_flat(load=str(tmp_path), train_iters=5))


def test_load_into_other_tp_keeps_weights(tmp_path: Path) -> None:
    saved = train(BASE.with_flat(tp=2, save=str(tmp_path), save_interval=4), return_state=True)
    loaded = train(BASE.with_flat(tp=1, load=str(tmp_path), train_iters=4), return_state=True)
    assert loaded.start_iteration == 4 and loaded.losses == []
    for name, tensor in saved.state.items():
        assert torch.equal(loaded.state[name], tensor), name


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(BASE.with_flat(load=str(tmp_path)))
    train(BASE.with_flat(save=str(tmp_path), save_interval=4))
    with pytest.raises(CheckpointError, match="hidden_size"):
        train(BASE.with_flat(load=str(tmp_path), hidden_size=64, num_heads=2))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        train(BASE.with_flat(load=str(tmp_path)))
