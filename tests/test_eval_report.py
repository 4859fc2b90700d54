"""``fastci eval``'s reports: summary.md, report.html, and the plots in a real browser."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from bench.eval_report import ChromiumMissing, render_check, synthetic_results
from fastci.eval.plots import apfd_curves, draw_plots
from fastci.eval.report import html_report, summary_markdown, write_reports
from fastci.eval.results import Arm, ChangeResult
from fastci.eval.results import TestOutcome as Outcome  # not a pytest class

PLOTS = ["cost_safety", "gpu_seconds", "detection", "apfd", "eval_time"]


_BASE = ChangeResult(
    change="", kind="", title="", base="b" * 40, head="h" * 40, settings={"gpu_slots": 2},
    plan_mode="selective", plan_reason="evidence", analysis_s=1.5, run_all=Arm(0, 0.0, 0.0),
    fastci=Arm(0, 0.0, 0.0), changed_lines=0, retained_lines=0,
    timing={"runs": 3.0, "analysis": 1.5, "bookkeeping": 0.5})


def _change(change: str, kind: str, title: str, run_all: Arm, fastci: Arm,
            **extra: Any) -> ChangeResult:
    return replace(_BASE, change=change, kind=kind, title=title, run_all=run_all, fastci=fastci,
                   **extra)


def _t(id: str, gpus: int, all_outcome: str, all_s: float, plan_s: float | None = None,
       plan_outcome: str = "passed") -> Outcome:
    planned = plan_s is not None
    return Outcome(id=id, gpus=gpus, all_outcome=all_outcome, all_s=all_s, planned=planned,
                       plan_outcome=plan_outcome if planned else "", plan_s=plan_s or 0.0)


#: A commit with a `|` and markup in its title, nothing failing.
COMMIT = _change(
    "commit:" + "a" * 40, "commit", "Fix | pipes <b>bold</b>",
    Arm(2, 100.0, 50.0), Arm(1, 20.0, 15.0), changed_lines=10, retained_lines=9,
    tests=(_t("//t:a0", 1, "passed", 60.0, 20.0), _t("//t:a1", 4, "passed", 10.0)))
#: A fault: run-all sees t1 and t2 fail, the plan runs t1 first and sees it fail, misses t2.
FAULT = _change(
    "fault:commit:" + "a" * 40 + ":negate", "fault", "<script>alert(1)</script>",
    Arm(3, 80.0, 100.0, ("//t:t1", "//t:t2"), ttff_s=30.0, apfdc=0.4),
    Arm(2, 25.0, 30.0, ("//t:t1",), ttff_s=5.0, apfdc=0.8), changed_lines=4, retained_lines=4,
    missed=({"test": "//t:t2", "why": "not reached | skipped"},),
    tests=(_t("//t:t1", 1, "failed", 20.0, 20.0, "failed"), _t("//t:t0", 2, "passed", 10.0, 2.5),
           _t("//t:t2", 0, "failed", 40.0)))
#: A patch run-all sees fail and the plan misses entirely (no APFDc, no TTFF).
PATCH = _change(
    "patch:fix|1.diff", "patch", "A patch", Arm(2, 50.0, 40.0, ("//t:p0",), ttff_s=12.0, apfdc=0.2),
    Arm(1, 5.0, 10.0), missed=({"test": "//t:p0", "why": "no evidence"},),
    tests=(_t("//t:p0", 8, "failed", 5.0), _t("//t:p1", 1, "passed", 10.0, 5.0)))
#: A change with no tests at all.
EMPTY = _change("commit:" + "e" * 40, "commit", "Docs only", Arm(0, 0.0, 0.0), Arm(0, 0.0, 0.0),
                timing={})
#: A change that could not be evaluated.
NOTED = _change("patch:broken.diff", "patch", "Broken", Arm(0, 0.0, 0.0), Arm(0, 0.0, 0.0),
                note="patch does not apply")
RESULTS = [COMMIT, FAULT, PATCH, EMPTY, NOTED]


def _headline(md: str) -> dict[str, str]:
    rows = re.findall(r"^\| ([^|#][^|]*?) \| (.*) \|$", md, re.M)
    return {k: v for k, v in rows if k not in ("Metric",)}


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells, split at unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]


def test_markdown_headline_is_the_totals_computed_by_hand() -> None:
    head = _headline(summary_markdown(RESULTS))
    assert head["Changes evaluated"] == "4 (1 could not be evaluated)"
    assert head["GPU-seconds"] == "run-all 230.0, FastCI 50.0 (78.3% saved)"  # 1 - 50/230
    assert head["CI latency (s)"] == "run-all 190.0, FastCI 55.0 (71.1% saved)"  # 1 - 55/190
    assert head["Modified-code coverage retained"] == "13/14 lines (92.9%)"
    assert head["Failures detected by FastCI"] == "1/2 changes that failed under run-all"
    assert head["Missed failing tests"] == "2"
    assert head["Mean APFDc (FastCI)"] == "0.800"
    assert head["Mean time to first failure (s)"] == "FastCI 5.0, run-all 21.0"
    assert not any(k.startswith("APFDc of") for k in head)  # no line holds strategies


def test_markdown_headline_averages_each_strategys_apfdc() -> None:
    fault = replace(FAULT, strategies={"risk": {"change": 0.9, "tests": 0.5},
                                       "reasons": {"change": 0.4, "tests": 0.3}})
    patch = replace(PATCH, strategies={"risk": {"change": 0.7, "tests": 0.7}})
    head = _headline(summary_markdown([COMMIT, fault, patch, NOTED]))
    assert head["APFDc of the risk order"] == \
        "0.800 (first failure; 2 changes), 0.600 (each failing test)"
    assert head["APFDc of the reasons order"] == \
        "0.400 (first failure; 1 change), 0.300 (each failing test)"


def test_results_lines_keep_strategies_and_refuse_malformed_ones() -> None:
    from fastci.eval.results import EvalResultsError, from_json

    fault = replace(FAULT, strategies={"risk": {"change": 0.9, "tests": 0.5}})
    assert from_json(fault.to_json()) == fault
    raw = json.loads(fault.to_json())
    del raw["strategies"]  # a line written before strategies were measured
    assert from_json(json.dumps(raw)).strategies == {}
    raw["strategies"] = {"risk": "high"}
    with pytest.raises(EvalResultsError, match="strategies"):
        from_json(json.dumps(raw))


def test_markdown_per_change_table_escapes_pipes() -> None:
    md = summary_markdown(RESULTS)
    rows = [line for line in md.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == 4  # the noted change is not a row
    cells = [_cells(r) for r in rows]
    assert all(len(c) == 11 for c in cells)
    assert cells[0][1] == "`commit:aaaaaaaaaa` Fix \\| pipes &lt;b&gt;bold&lt;/b&gt;"
    assert cells[0][2:] == ["commit", "1/2", "100.0", "20.0", "50.0", "15.0", "90.0% (9/10)",
                            "0", "-"]
    assert cells[1][-3:] == ["100.0% (4/4)", "2", "yes"]
    assert cells[2][1] == "`patch:fix\\|1.diff` A patch"
    assert cells[2][-3:] == ["-", "1", "no"]
    assert cells[3][3:] == ["0/0", "0.0", "0.0", "0.0", "0.0", "-", "0", "-"]


def test_markdown_lists_misses_and_changes_not_evaluated() -> None:
    md = summary_markdown(RESULTS)
    misses = md.split("### Misses", 1)[1]
    assert "- `//t:t2` in `fault:commit:aaaaaaaaaa:negate`: not reached \\| skipped" in misses
    assert "- `//t:p0` in `patch:fix|1.diff`: no evidence" in misses  # no table: no escape
    assert "**Not evaluated (1):** `patch:broken.diff`: patch does not apply" in md
    assert "None." in summary_markdown([COMMIT]).split("### Misses", 1)[1]


@pytest.mark.parametrize("results", [[], [NOTED], [EMPTY], [COMMIT]],
                         ids=["none", "all-noted", "no-tests", "nothing-failed"])
def test_degenerate_results_render(results: list[ChangeResult]) -> None:
    head = _headline(summary_markdown(results))
    assert head["Mean APFDc (FastCI)"] == "-"
    assert head["Mean time to first failure (s)"] == "FastCI -, run-all -"
    assert head["Failures detected by FastCI"] == "- (no change failed under run-all)"
    page = html_report(results)
    assert page.count("<svg") == page.count('<figure class="plot"')
    assert 'id="render-check"' in page


def test_html_is_self_contained_with_one_svg_per_plot() -> None:
    page = html_report(RESULTS)
    assert not re.search(r"""\b(?:src|href)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//""", page, re.I)
    assert not re.search(r"<link\b|@import|url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    figures = re.findall(r'<figure class="plot" data-plot="([a-z_]+)"><svg\b.*?'
                         r"</svg><figcaption>[^<]+</figcaption></figure>", page, re.S)
    assert figures == PLOTS
    assert page.count("<svg") == len(PLOTS)
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "ids must be unique across the inline SVGs"


def test_html_escapes_strings_from_results() -> None:
    page = html_report(RESULTS, title="<i>eval</i>")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script") == 1  # the render check only
    assert "<b>bold</b>" not in page and "<i>eval</i>" not in page
    assert "not reached | skipped" in page and "patch does not apply" in page


def test_html_is_reproducible_and_leaves_rcparams_alone() -> None:
    before = dict(matplotlib.rcParams)
    assert html_report(RESULTS) == html_report(RESULTS)
    assert dict(matplotlib.rcParams) == before


def test_apfd_curves_follow_the_plan_order_and_run_alls_id_order() -> None:
    # Run-all costs 80 (t1 20x1, t0 10x2, t2 40x1); the plan runs t1 then t0 (2.5 x 2 GPUs).
    assert apfd_curves(FAULT) == (([0.0, 0.25, 0.3125], [0.0, 0.5, 0.5]),
                                  ([0.0, 0.5, 1.0, 1.0], [0.0, 0.5, 1.0, 1.0]))
    assert apfd_curves(PATCH) == (([0.0, 0.1], [0.0, 0.0]), ([0.0, 0.8, 1.0], [0.0, 1.0, 1.0]))
    assert apfd_curves(COMMIT) is None and apfd_curves(EMPTY) is None


def test_plots_with_nothing_to_draw_say_why() -> None:
    plots = {p.name: p for p in draw_plots([COMMIT, NOTED])}
    assert plots["apfd"].svg == "" and plots["apfd"].why_empty == "run-all saw no failure"
    assert all(plots[name].svg for name in PLOTS if name != "apfd")


def test_write_reports_writes_both_and_appends_to_the_step_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    md, page = write_reports(RESULTS, tmp_path / "out", title="First run")
    write_reports([COMMIT], tmp_path / "out", title="Second run")
    assert (md, page) == (tmp_path / "out" / "summary.md", tmp_path / "out" / "report.html")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "summary.md"]
    assert md.read_text(encoding="utf-8") == summary_markdown([COMMIT], title="Second run")
    assert step.read_text(encoding="utf-8") == (
        "earlier step\n" + summary_markdown(RESULTS, title="First run") + "\n"
        + summary_markdown([COMMIT], title="Second run") + "\n")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    write_reports(RESULTS, tmp_path / "out")
    assert len(re.findall(r"^## ", step.read_text(encoding="utf-8"), re.M)) == 2


def _render_check(page: Path) -> dict[str, object]:
    try:
        return render_check(page)
    except ChromiumMissing as exc:
        pytest.fail(f"{exc} (the browser test needs it; it is not skipped)")


@pytest.mark.parametrize("results", [RESULTS, [], [NOTED], synthetic_results(50)],
                         ids=["fixture", "none", "all-noted", "synthetic-50"])
def test_plots_render_in_headless_chromium(tmp_path: Path, results: list[ChangeResult]) -> None:
    _, page = write_reports(results, tmp_path)
    check = _render_check(page)
    figures = re.findall(r'<figure class="plot" data-plot="([a-z_]+)">',
                         page.read_text(encoding="utf-8"))
    assert check["plots"] == len(figures), json.dumps(check)
    assert check["ok"] == figures and check["bad"] == [], json.dumps(check)
    assert len(figures) == (len(PLOTS) if results and any(not r.note for r in results) else 0)


def test_render_check_reports_a_plot_that_drew_nothing(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html_report(RESULTS).replace('id="apfd-mark-', 'id="gone-'), encoding="utf-8")
    check = _render_check(page)
    assert check["bad"] == ["apfd"] and check["ok"] == [p for p in PLOTS if p != "apfd"]


# --- Whole-number ticks, and nothing raw on the page (issue 36) --------------------------------


def _tick_labels(svg: str, plot: str, axis: str) -> list[str]:
    """The tick labels of one axis (``x`` or ``y``) of a plot's SVG, in order."""
    return re.findall(rf'id="{plot}-{axis}tick_\d+">.*?<text\b[^>]*>([^<]*)</text>', svg, re.S)


def test_change_ticks_are_whole_changes_at_most_twenty() -> None:
    from fastci.eval.plots import change_ticks

    assert change_ticks(1) == [1] and change_ticks(2) == [1, 2]
    assert change_ticks(20) == list(range(1, 21))
    assert change_ticks(21) == list(range(1, 22, 2))
    for n in range(1, 200):
        ticks = change_ticks(n)
        assert ticks[0] == 1 and ticks[-1] <= n and len(ticks) <= 20, n


@pytest.mark.parametrize("results", [[COMMIT], [COMMIT, FAULT], RESULTS, synthetic_results(50)],
                         ids=["one", "two", "fixture", "synthetic-50"])
def test_per_change_and_count_axes_have_whole_number_ticks(results: list[ChangeResult]) -> None:
    from fastci.eval.plots import change_ticks

    plots = {p.name: p.svg for p in draw_plots(results)}
    n = sum(1 for r in results if not r.note)
    for name in ("gpu_seconds", "eval_time"):  # x: the change's number in the table
        assert _tick_labels(plots[name], name, "x") == [str(t) for t in change_ticks(n)], name
    counts = _tick_labels(plots["detection"], "detection", "y")  # y: changes
    assert counts and all(re.fullmatch(r"\d+", c) for c in counts), counts
    # The parser reads real labels: a continuous axis keeps its fractions.
    assert any("." in c for c in _tick_labels(plots["cost_safety"], "cost_safety", "x"))


def test_the_page_shows_no_raw_json_but_keeps_the_render_check(tmp_path: Path) -> None:
    from bench.eval_report import dump_dom, pre_text

    _, page = write_reports(RESULTS, tmp_path)
    # What a reader sees: the body's rendered text (hidden elements have none), read after
    # the render check ran.
    seen = ('<script>addEventListener("load", () => { const p = document.createElement("pre");'
            ' p.id = "seen"; p.textContent = JSON.stringify(document.body.innerText);'
            ' document.body.append(p); });</script></body>')
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", seen), encoding="utf-8")
    try:
        proc = dump_dom(page)
    except ChromiumMissing as exc:
        pytest.fail(f"{exc} (the browser test needs it; it is not skipped)")
    text = json.loads(pre_text(proc.stdout, "seen"))
    assert "Headline" in text and "Misses" in text and "not reached | skipped" in text
    assert '"plots"' not in text and "{" not in text, text[-300:]
    check = json.loads(pre_text(proc.stdout))
    assert check["plots"] == len(PLOTS) and check["bad"] == []
