"""Routing traces: margins, record/replay, and the rules that keep replay well defined."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from microllm import ConfigError, MicroLLMError
from microllm.config import Config
from microllm.model.routing import RoutingTrace, routing_margin
from microllm.trainer import train

MOE = Config.from_flat(train_iters=2, num_layers=1, hidden_size=32, num_heads=2, seq_length=8, vocab_size=40,
                       micro_batch_size=1, global_batch_size=2, num_experts=4, moe_top_k=2)


def test_margin_is_the_smallest_gap_up_to_the_kth_place() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.3, 0.2], [0.6, 0.3, 0.1, 0.0]])
    assert torch.allclose(routing_margin(probs, 2), torch.tensor([0.1, 0.0, 0.2]))
    assert torch.isinf(routing_margin(torch.ones(3, 1), 1)).all()


def test_replay_forces_recorded_decisions_and_reports_margins() -> None:
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.3, 0.3001, 0.2, 0.1999]])
    recorder = RoutingTrace(0)
    mine = probs.topk(2).indices
    assert recorder.route(probs, mine, 2) is mine
    replayer = RoutingTrace(0, replay=recorder.recorded)
    other = torch.tensor([[0, 1], [0, 1]])  # token 1 differs from the recording
    assert torch.equal(replayer.route(probs, other, 2), mine)
    assert replayer.decisions == 2 and len(replayer.mismatch_margins) == 1
    assert replayer.mismatch_margins[0] == pytest.approx(1e-4, abs=1e-6)
    with pytest.raises(MicroLLMError, match="only 1 recorded"):
        replayer.route(probs, other, 2)


def test_replaying_a_run_in_the_same_layout_agrees_bitwise(tmp_path: Path) -> None:
    ref = train(MOE.with_flat(routing_record=str(tmp_path)), return_state=True)
    again = train(MOE.with_flat(routing_replay=str(tmp_path)), return_state=True)
    assert again.routing_decisions == ref.routing_decisions > 0 and again.routing_mismatches == []
    assert again.losses == ref.losses
    with pytest.raises(MicroLLMError, match="no trace"):
        train(MOE.with_flat(dp=2, global_batch_size=4, routing_replay=str(tmp_path)))


@pytest.mark.parametrize(("flat", "rule"), [
    ({"routing_record": "a", "routing_replay": "b"}, "exclusive"),
    ({"routing_record": "a", "num_experts": 0}, "num_experts > 0"),
    ({"routing_replay": "a", "recompute": True}, "recompute off"),
])
def test_trace_config_rules(flat: dict[str, object], rule: str) -> None:
    with pytest.raises(ConfigError, match=rule):
        MOE.with_flat(**flat).validate()
