"""Run the in-process suite tests at their floors (each well under a second here).

Tests that start processes (gloo, CLI), and absolute checks that are never reduced
(convergence, throughput), are left to the suite's own floor run.
"""

from __future__ import annotations

import importlib

import pytest

import harness

SLOW_OR_ABSOLUTE = {"gloo_parity_test", "train_cli_smoke_test", "config_validation_test", "convergence_test",
                    "throughput_test"}
FAST = sorted(set(harness.load_suite()) - SLOW_OR_ABSOLUTE)


@pytest.mark.parametrize("name", FAST)
def test_suite_entry_passes_at_floors(name: str) -> None:
    module = importlib.import_module(name)
    module.check(harness.resolve(name, env={}, at_floors=True))
