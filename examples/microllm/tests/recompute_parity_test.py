"""Activation recomputation is bitwise invisible: with dropout on (tp=2), recomputing each
layer in backward gives exactly the losses and weights of storing activations.

Catches: recomputation drawing fresh dropout masks (generator not rewound), the generator left
rewound after recomputation, collectives replayed in a different order.
"""

from __future__ import annotations

import sys

import harness
from microllm.trainer import train

NAME = "recompute_parity_test"
DROPOUT = {"hidden_dropout": 0.1, "attention_dropout": 0.1}


def check(w: harness.Workload) -> None:
    stored = train(harness.config(w, recompute=False, **DROPOUT), return_state=True)
    recomputed = train(harness.config(w, recompute=True, **DROPOUT), return_state=True)
    harness.assert_runs_identical(recomputed, stored)


def test_recompute_parity(workload: harness.Workload) -> None:
    check(workload)


if __name__ == "__main__":
    sys.exit(harness.main(NAME, check))
