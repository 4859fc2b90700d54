from __future__ import annotations

import pytest

from microllm import ConfigError
from microllm.config import FLAT_INDEX, Config


def test_defaults_validate() -> None:
    assert Config().validate().num_microbatches == 2


@pytest.mark.parametrize(
    ("flat", "rule"),
    [
        ({"tp": 3}, "num_heads % tp == 0"),
        ({"pp": 3}, "num_layers % pp == 0"),
        ({"global_batch_size": 5}, "global_batch_size % (micro_batch_size * dp) == 0"),
        ({"pp": 2, "global_batch_size": 2}, "num_microbatches >= pp"),
        ({"tp": 2, "sequence_parallel": True, "seq_length": 33}, "seq_length % tp == 0"),
        ({"sequence_parallel": True}, "sequence_parallel requires tp > 1"),
        ({"hidden_size": 66}, "hidden_size % num_heads == 0"),
        ({"hidden_size": 12, "num_heads": 4}, "head_dim must be even"),
        ({"num_experts": 2, "moe_top_k": 3}, "moe_top_k"),
        ({"attention_impl": "flash"}, "attention_impl"),
        ({"warmup_iters": 5, "lr_decay_iters": 3}, "lr_decay_iters >= warmup_iters"),
    ],
)
def test_validate_rejects(flat: dict[str, object], rule: str) -> None:
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        Config.from_flat(**flat).validate()


def test_vocab_padding_depends_on_tp() -> None:
    assert Config.from_flat(vocab_size=500).padded_vocab_size == 504
    assert Config.from_flat(vocab_size=500, tp=2).padded_vocab_size == 512
    assert Config.from_flat(vocab_size=512, tp=4).padded_vocab_size == 512


def test_unknown_flat_key() -> None:
    with pytest.raises(ConfigError, match="unknown configuration key: nope"):
        Config.from_flat(nope=1)


def test_dict_round_trip() -> None:
    cfg = Config.from_flat(tp=2, num_layers=4, dtype="bf16", zero1=True)
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_flat_names_unique_and_cover_workload_dims() -> None:
    for dim in ("train_iters", "num_layers", "hidden_size", "num_heads", "seq_length", "micro_batch_size",
                "global_batch_size", "vocab_size", "save_interval", "eval_interval", "tp", "pp", "dp", "dtype",
                "lr_decay_iters"):
        assert dim in FLAT_INDEX
