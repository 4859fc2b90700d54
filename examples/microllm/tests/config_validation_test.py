"""Configuration validation accepts the declared layout and rejects each broken divisibility
rule with a message naming it, both through the API and through the CLI entry point (exit code 2).

Catches: a rule dropped or weakened in ``Config.validate`` (a layout that would crash or
silently mis-shard later), the CLI accepting a bad layout.
"""

from __future__ import annotations

import contextlib
import io
import sys

import harness
from microllm import ConfigError
from microllm.config import Config
from microllm.train import main as cli_main

NAME = "config_validation_test"


def _rejects(cfg: Config, rule: str) -> None:
    try:
        cfg.validate()
    except ConfigError as exc:
        assert rule in str(exc), f"rejected for another reason: {exc} (expected {rule})"
        return
    raise AssertionError(f"accepted a config that breaks {rule!r}")


def check(w: harness.Workload) -> None:
    good = harness.config(w)
    tp, pp, dp, mbs = w["tp"], w["pp"], w["dp"], w["micro_batch_size"]
    _rejects(good.with_flat(num_heads=w["num_heads"] + 1, hidden_size=(w["num_heads"] + 1) * 8), "num_heads % tp == 0")
    _rejects(good.with_flat(num_layers=w["num_layers"] + 1), "num_layers % pp == 0")
    _rejects(good.with_flat(global_batch_size=w["global_batch_size"] + 1), "global_batch_size % (micro_batch_size * dp) == 0")
    _rejects(good.with_flat(global_batch_size=mbs * dp * (pp - 1)), "num_microbatches >= pp")
    _rejects(good.with_flat(hidden_size=w["hidden_size"] + 1), "hidden_size % num_heads == 0")
    _rejects(good.with_flat(sequence_parallel=True, seq_length=tp * 8 + 1), "seq_length % tp == 0")
    _rejects(good.with_flat(tp=1, pp=1, dp=1, sequence_parallel=True), "sequence_parallel requires tp > 1")
    _rejects(good.with_flat(dtype="fp8"), "dtype in")
    _rejects(good.with_flat(warmup_iters=10, lr_decay_iters=5), "lr_decay_iters >= warmup_iters")
    assert good.padded_vocab_size % (tp * good.model.vocab_pad_multiple) == 0
    assert good.padded_vocab_size >= good.model.vocab_size
    try:
        good.with_flat(no_such_flag=1)
    except ConfigError:
        pass
    else:
        raise AssertionError("an unknown key was accepted")
    flags = [f"--{k}={v}" for k, v in w.items()]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli_main([*flags, f"--num_layers={w['num_layers'] + 1}"])
    assert code == 2 and "num_layers % pp == 0" in stderr.getvalue(), (code, stderr.getvalue()[-500:])


def test_config_validation(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
