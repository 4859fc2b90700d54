"""The reduction benchmark's bookkeeping (bench/reduction.py): changed lines and totals.

The benchmark itself runs the example's tests through Bazel for tens of minutes (``make
bench``); these tests check the parts that turn its runs into numbers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.reduction import Row, changed_lines, report


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


def test_changed_lines_are_the_head_side_of_each_hunk(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    src = "".join(f"x{i} = {i}\n" for i in range(1, 21))
    (tmp_path / "pkg" / "m.py").write_text(src)
    (tmp_path / "notes.txt").write_text("a\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    lines = src.splitlines(keepends=True)
    lines[2] = "x3 = 30\n"  # line 3 changed
    lines.insert(10, "y = 1\n")  # a new line 11
    lines.insert(11, "z = 2\n")  # and 12
    del lines[18]  # x17 deleted: the head line after it (x18) is line 19
    (tmp_path / "pkg" / "m.py").write_text("".join(lines))
    (tmp_path / "notes.txt").write_text("b\n")  # not Python: not counted
    assert changed_lines(tmp_path) == {"pkg/m.py": {3, 11, 12, 19}}


def test_report_totals_ratio_savings_retention_and_payback() -> None:
    rows = [Row("01_bug", "bug", planned=2, reduced=2, mode="selective", full_gpu_s=100.0,
                reduced_gpu_s=20.0, changed_full=10, changed_kept=10,
                failing_full=("//t:a",)),
            Row("02_refactor", "refactor", planned=1, reduced=0, mode="selective",
                full_gpu_s=50.0, reduced_gpu_s=50.0, changed_full=4, changed_kept=3),
            Row("03_broken", "bug", note="patch does not apply: x")]
    lines = report(rows, all_gpu_s=1000.0, calibration_gpu_s=300.0,
                   calibration_full_gpu_s=100.0, calibrated_tests=3)
    text = "\n".join(lines)
    assert "total over 2 changes: reduced plans 70 GPU-s vs the same tests at full workload " \
           "150 GPU-s (0.47x" in text
    # Everything at full workload on both changes: 2000 GPU-s.
    assert "selection alone saves 92.5%, selection + reduction 96.5%" in text
    assert "retention: 13/14 (test, changed line) pairs (92.9%); on the 1 buggy changes " \
           "10/10 (100.0%)" in text
    assert "escapes (fail at full, pass reduced): 0" in text
    # 80 GPU-s saved over 2 changes = 40 per change; 300 / 40 = 7.5 changes.
    assert "300 GPU-s = 3.0 full runs of them" in text and "after 7.5 changes" in text
    assert "note: patch does not apply: x" in text


def test_an_escape_is_listed() -> None:
    rows = [Row("01_bug", "bug", planned=1, reduced=1, full_gpu_s=10.0, reduced_gpu_s=2.0,
                failing_full=("//t:a",), escapes=("//t:a",))]
    lines = report(rows, all_gpu_s=100.0, calibration_gpu_s=0.0, calibration_full_gpu_s=0.0,
                   calibrated_tests=0)
    assert "    ESCAPED: //t:a" in lines
    assert any("escapes (fail at full, pass reduced): 1" in line for line in lines)


def test_the_pruning_line_says_whether_kept_tests_still_catch_the_bug() -> None:
    rows = [Row("01_bug", "bug", planned=2, full_gpu_s=10.0, reduced_gpu_s=6.0,
                failing_full=("//t:a",), pruned=("//t:a",), pruned_gpu_s=4.0,
                pruned_failing=("//t:a",)),
            Row("02_bug", "bug", planned=2, full_gpu_s=10.0, reduced_gpu_s=6.0,
                failing_full=("//t:a", "//t:b"), pruned=("//t:a",), pruned_gpu_s=1.0,
                pruned_failing=("//t:a",))]
    text = "\n".join(report(rows, all_gpu_s=100.0, calibration_gpu_s=0.0,
                            calibration_full_gpu_s=0.0, calibrated_tests=0))
    assert "the change still fails in a kept test: no" in text
    assert "the change still fails in a kept test: yes" in text
    assert ("+ safe pruning (measured arms, not applied): 7 GPU-s (96.5% saved vs everything); "
            "failing tests it would skip: 2; buggy changes no kept test would catch: 1 (01_bug)"
            ) in text


def test_apfdc_per_strategy_is_averaged_over_buggy_changes() -> None:
    rows = [Row("01_bug", "bug", planned=2, full_gpu_s=10.0, reduced_gpu_s=5.0,
                failing_full=("//t:a",), apfdc={"reasons": 0.4, "risk": 0.8},
                apfdc_change={"reasons": 0.5, "risk": 0.9}),
            Row("02_bug", "bug", planned=2, full_gpu_s=10.0, reduced_gpu_s=5.0,
                failing_full=("//t:b",), apfdc={"reasons": 0.6, "risk": 1.0},
                apfdc_change={"reasons": 0.7, "risk": 1.0}),
            Row("03_ok", "refactor", planned=2, full_gpu_s=10.0, reduced_gpu_s=5.0)]
    text = "\n".join(report(rows, all_gpu_s=100.0, calibration_gpu_s=0.0,
                            calibration_full_gpu_s=0.0, calibrated_tests=0))
    assert "APFDc of the full arm in the 'reasons' order: mean 0.600 over 2 buggy change(s), " \
           "the change one fault (min 0.500); each failing test a fault: 0.500" in text
    assert "in the 'risk' order: mean 0.950" in text


def test_the_ablation_counts_what_each_stage_drops_from_measured_costs() -> None:
    from bench.reduction import ablation

    row = Row("01_bug", "bug", failing_full=("//t:b",))
    row.costs_full = {"//t:a": 4.0, "//t:b": 2.0, "//t:c": 6.0}
    row.costs_reduced = {"//t:a": 1.0, "//t:b": 1.0, "//t:c": 6.0}
    row.stages = {"select (unit)": ("//t:a", "//t:b", "//t:c"),
                  "+ line granularity": ("//t:a", "//t:b"),
                  "+ safe pruning": ("//t:a",),  # drops the failing test: a miss
                  "+ prioritize": ("//t:a",)}
    text = "\n".join(ablation([row]))
    lines = text.splitlines()
    # Columns after the stage name: tests, GPU-s, failing dropped, changes missed, APFDc.
    unit = next(x for x in lines if x.strip().startswith("select (unit)")).split()
    assert unit[2:7] == ["3", "12", "0", "0", "0.583"]  # b found after a: (12 - 4 - 1) / 12
    line = next(x for x in lines if x.strip().startswith("+ line granularity")).split()
    assert line[3:7] == ["2", "6", "0", "0"]
    pruned = next(x for x in lines if x.strip().startswith("+ safe pruning")).split()
    assert pruned[3:7] == ["1", "4", "1", "1"]
    reduced = next(x for x in lines if x.strip().startswith("+ reduce")).split()
    assert reduced[2:4] == ["1", "1"]


def test_the_ablation_runs_pruned_tests_after_a_kept_test_fails() -> None:
    from bench.reduction import ablation

    # Both a and b fail; pruning keeps a and drops b. fastci run then runs b (full).
    row = Row("01_bug", "bug", failing_full=("//t:a", "//t:b"))
    row.costs_full = {"//t:a": 4.0, "//t:b": 2.0, "//t:c": 6.0}
    row.costs_reduced = {"//t:a": 1.0, "//t:b": 1.0, "//t:c": 6.0}
    row.stages = {"select (unit)": ("//t:a", "//t:b", "//t:c"),
                  "+ line granularity": ("//t:a", "//t:b", "//t:c"),
                  "+ safe pruning": ("//t:a",),
                  "+ prioritize": ("//t:a",)}
    # A passing change: nothing fails, so nothing pruned runs.
    green = Row("09_ok", "benign")
    green.costs_full, green.costs_reduced = dict(row.costs_full), dict(row.costs_reduced)
    green.stages = dict(row.stages)
    lines = ablation([row, green])
    pruned = next(x for x in lines if x.strip().startswith("+ safe pruning")).split()
    assert pruned[3:7] == ["2", "8", "1", "0"]  # a twice; b dropped
    after = next(x for x in lines if x.strip().startswith("+ pruned run on failure")).split()
    assert after[5:9] == ["4", "16", "0", "0"]  # a, b, c on the red change; a on the green
    reduced = next(x for x in lines if x.strip().startswith("+ reduce")).split()
    assert reduced[2:4] == ["4", "10"]  # a reduced (1 + 1), b and c at full (2 + 6)
