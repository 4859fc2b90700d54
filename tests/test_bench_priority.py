"""The prioritization benchmark's report (bench.priority; its runs are `make bench`'s)."""

from __future__ import annotations

import pytest

from bench.priority import Row, report
from fastci.select.priority import DEFAULT, STRATEGIES


def _row(name: str, held_out: bool, score: dict[str, float]) -> Row:
    return Row(name, held_out, tests=3, failing=("//t:a",) if score else (), apfdc=score)


def test_the_report_gives_each_set_its_means_worst_and_best_strategy() -> None:
    others = [n for n in STRATEGIES if n != DEFAULT]
    best = others[0]
    lines = report([
        _row("01_bug", False, {**{n: 0.5 for n in STRATEGIES}, best: 0.9}),
        _row("02_bug", False, {**{n: 0.7 for n in STRATEGIES}, best: 0.8}),
        _row("03_benign", False, {}),  # nothing failed: not scored
        _row("mut-x", True, {n: 1.0 for n in STRATEGIES}),
    ])
    text = "\n".join(lines)
    assert "bench changes: 3 planned and run, 2 with a failing test" in text
    assert "held-out faults: 1 planned and run, 1 with a failing test" in text
    assert f"best mean APFDc on the bench changes: {best} 0.850 (default {DEFAULT}: 0.600" in text
    mean = next(x for x in lines if x.strip().startswith("mean")).split()[1:]
    worst = next(x for x in lines if x.strip().startswith("worst")).split()[1:]
    col = list(STRATEGIES).index(best)
    assert float(mean[col]) == pytest.approx(0.85) and float(worst[col]) == pytest.approx(0.8)
    # The unscored change is listed with dashes, not counted.
    assert next(x for x in lines if "03_benign" in x).split()[3:] == ["-"] * len(STRATEGIES)


def test_the_report_gives_time_to_first_failure_and_sets_no_apfdc_target() -> None:
    from bench.priority import time_to_first_failure

    cost = {"//t:a": 5.0, "//t:b": 1.0, "//t:c": 2.0}
    assert time_to_first_failure(["//t:b", "//t:a", "//t:c"], cost, ["//t:a"]) == 6.0
    assert time_to_first_failure(["//t:b"], cost, ["//t:a"]) is None
    row = Row("01_bug", False, tests=3, failing=("//t:a",), apfdc={n: 0.5 for n in STRATEGIES},
              ttff={n: 6.0 for n in STRATEGIES})
    text = "\n".join(report([row]))
    mean = next(x for x in text.splitlines() if "mean TTFF GPU-s" in x).split()[3:]
    assert mean == ["6.0"] * len(STRATEGIES)
    # An order is adopted on held-out faults, not on reaching one APFDc number.
    assert "target" not in text
