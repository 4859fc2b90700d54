"""The reports of ``fastci eval``: ``summary.md`` and ``report.html``.

Both render a list of :class:`~fastci.eval.results.ChangeResult` (``results.jsonl``):

- :func:`summary_markdown` — for a CI job page (``$GITHUB_STEP_SUMMARY``) and PR
  comments: the headline numbers of :func:`~fastci.eval.results.totals`, one row per
  change, every missed failing test with the plan's reason, and the changes that
  could not be evaluated;
- :func:`html_report` — one self-contained HTML file (nothing fetched at view time):
  the same tables plus the plots of :mod:`fastci.eval.plots` as inline SVG, and a
  small script that checks after load that every plot drew something and writes the
  verdict as JSON into the hidden ``<pre id="render-check">`` (the tests read it back
  from a headless browser's DOM; a reader never sees it, and the data behind the page
  is ``results.jsonl``);
- :func:`write_reports` — both files into a directory, atomically.

Every string that comes from results is escaped (HTML, or Markdown table cells).
Changes with a ``note`` count nowhere (as in :func:`~fastci.eval.results.totals`) and
are listed apart.
"""

from __future__ import annotations

import html
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from fastci.eval.plots import Plot, draw_plots
from fastci.eval.results import ChangeResult, Totals, totals

LOG = logging.getLogger(__name__)

DEFAULT_TITLE = "FastCI evaluation"
SUMMARY_NAME, HTML_NAME = "summary.md", "report.html"

_SHA = re.compile(r"\b([0-9a-f]{10})[0-9a-f]{30}\b")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


# -- formatting ------------------------------------------------------------------------

def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _short(change: str) -> str:
    """A change id with each full commit sha cut to 10 hex digits."""
    return _SHA.sub(r"\1", change)


def _md(text: str) -> str:
    """Plain text for Markdown (a table cell or a list item): one line, nothing markup."""
    text = " ".join(text.split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def _md_code(text: str, *, cell: bool) -> str:
    """An id as a Markdown code span (in a table ``cell``, ``|`` must be escaped)."""
    text = " ".join(text.split())
    if cell:
        text = text.replace("|", "\\|")
    ticks = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence, pad = "`" * (ticks + 1), " " if ticks else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _h(text: str) -> str:
    return html.escape(text, quote=True)


# -- what both reports show ------------------------------------------------------------

def _headline(t: Totals, not_evaluated: int) -> list[tuple[str, str]]:
    """The headline numbers as (metric, value) lines of plain text."""
    def saved(fraction: float, base: float) -> str:
        return f" ({_pct(fraction)} saved)" if base > 0 else ""

    retention = (f"{t.retained_lines}/{t.changed_lines} lines ({_pct(t.retention)})"
                 if t.changed_lines else "- (no changed line executed by run-all)")
    detection = (f"{t.detected}/{t.detectable} changes that failed under run-all"
                 if t.detectable else "- (no change failed under run-all)")
    return [
        ("Changes evaluated", f"{t.changes}"
         + (f" ({not_evaluated} could not be evaluated)" if not_evaluated else "")),
        ("GPU-seconds", f"run-all {_s(t.all_gpu_s)}, FastCI {_s(t.fastci_gpu_s)}"
         + saved(t.gpu_saved, t.all_gpu_s)),
        ("CI latency (s)", f"run-all {_s(t.all_latency_s)}, FastCI {_s(t.fastci_latency_s)}"
         + saved(t.latency_saved, t.all_latency_s)),
        ("Modified-code coverage retained", retention),
        ("Failures detected by FastCI", detection),
        ("Missed failing tests", str(t.missed_tests)),
        ("Mean APFDc (FastCI)", "-" if t.mean_apfdc is None else f"{t.mean_apfdc:.3f}"),
        ("Mean time to first failure (s)",
         f"FastCI {_s(t.mean_ttff_s)}, run-all {_s(t.mean_all_ttff_s)}"),
        *((f"APFDc of the {name} order", _strategy_cell(measures))
          for name, measures in t.strategy_apfdc.items()),
    ]


def _strategy_cell(measures: Mapping[str, tuple[float, int]]) -> str:
    """A strategy's mean APFDc: the change as one fault, then each failing test a fault."""
    one, each = measures.get("change"), measures.get("tests")
    parts = []
    if one is not None:
        parts.append(f"{one[0]:.3f} (first failure; {one[1]} change{'s' * (one[1] != 1)})")
    if each is not None:
        parts.append(f"{each[0]:.3f} (each failing test)")
    return ", ".join(parts) or "-"


@dataclass(frozen=True)
class _Row:
    """One evaluated change, formatted."""

    n: int
    change: str
    full_change: str
    title: str
    kind: str
    tests: str
    gpu_all: str
    gpu_fastci: str
    latency_all: str
    latency_fastci: str
    retention: str
    failing: str
    detected: str


#: The per-change table's columns, each with its Markdown alignment.
_COLUMNS = (("#", "---:"), ("Change", ":---"), ("Kind", ":---"), ("Tests planned/total", "---:"),
            ("GPU-s run-all", "---:"), ("GPU-s FastCI", "---:"), ("Latency run-all (s)", "---:"),
            ("Latency FastCI (s)", "---:"), ("Retention", "---:"), ("Failing (run-all)", "---:"),
            ("Detected", ":---:"))


def _row(n: int, r: ChangeResult) -> _Row:
    return _Row(
        n=n, change=_short(r.change), full_change=r.change, title=r.title, kind=r.kind,
        tests=f"{r.fastci.tests}/{r.run_all.tests}",
        gpu_all=_s(r.run_all.gpu_s), gpu_fastci=_s(r.fastci.gpu_s),
        latency_all=_s(r.run_all.latency_s), latency_fastci=_s(r.fastci.latency_s),
        retention=(f"{_pct(r.retention)} ({r.retained_lines}/{r.changed_lines})"
                   if r.changed_lines else "-"),
        failing=str(len(r.run_all.failing)),
        detected=("yes" if r.detected else "no") if r.detected_by_all else "-")


def _misses(ok: Sequence[ChangeResult]) -> list[tuple[str, str, str]]:
    """Every missed failing test as (test, change, why)."""
    return [(m.get("test", "?"), r.change, m.get("why", "")) for r in ok for m in r.missed]


# -- Markdown --------------------------------------------------------------------------

def summary_markdown(results: Sequence[ChangeResult], *, title: str = DEFAULT_TITLE) -> str:
    """A Markdown summary of an evaluation, for a CI job page and PR comments.

    Args:
        results: the evaluated changes (``results.jsonl``).
        title: the heading.

    Returns:
        The summary: a headline table, a per-change table, the misses, and a line
        naming the changes that could not be evaluated (those with a ``note``).
    """
    ok = [r for r in results if not r.note]
    noted = [r for r in results if r.note]
    lines = [f"## {_md(title)}", "", "| Metric | Value |", "|---|---|"]
    lines += [f"| {_md(k)} | {_md(v)} |" for k, v in _headline(totals(results), len(noted))]
    if ok:
        lines += ["", "| " + " | ".join(name for name, _ in _COLUMNS) + " |",
                  "|" + "|".join(align for _, align in _COLUMNS) + "|"]
        for row in (_row(n, r) for n, r in enumerate(ok, 1)):
            change = _md_code(row.change, cell=True) + (f" {_md(row.title)}" if row.title else "")
            cells = (str(row.n), change, _md(row.kind), row.tests, row.gpu_all, row.gpu_fastci,
                     row.latency_all, row.latency_fastci, row.retention, row.failing,
                     row.detected)
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "### Misses", ""]
    misses = _misses(ok)
    lines += [f"- {_md_code(test, cell=False)} in {_md_code(_short(change), cell=False)}: "
              f"{_md(why) or 'no reason recorded'}" for test, change, why in misses] or ["None."]
    if noted:
        lines += ["", f"**Not evaluated ({len(noted)}):** " + "; ".join(
            f"{_md_code(_short(r.change), cell=False)}: {_md(r.note)}" for r in noted)]
    return "\n".join(lines) + "\n"


# -- HTML ------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em}
th{background:#f4f4f4;text-align:left}td{vertical-align:top}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{font-size:.92em}tr.missed td{background:#fdf0e6}
figure.plot{display:inline-block;vertical-align:top;margin:.5em 1em 1em 0;max-width:100%}
figure.plot svg{max-width:100%;height:auto}figcaption{max-width:36em;font-size:.9em;color:#444}
p.no-plot{color:#666;font-style:italic}
"""

# After load: every figure.plot holds an <svg> with a non-empty box, at least one data
# mark (ids <plot>-mark-<n>, see fastci.eval.plots) drawn with a non-empty box inside a
# plot area (<plot>-plotarea-<n>), and its text, if any, laid out.
_RENDER_CHECK = """
addEventListener("load", () => {
  const nonEmpty = (b) => b.width > 0 || b.height > 0;
  const inside = (b, a) => b.right >= a.left - 1 && b.left <= a.right + 1 &&
    b.bottom >= a.top - 1 && b.top <= a.bottom + 1;
  const figures = document.querySelectorAll("figure.plot");
  const ok = [], bad = [], why = {};
  for (const figure of figures) {
    const name = figure.dataset.plot, svg = figure.querySelector("svg");
    const fail = (reason) => { bad.push(name); why[name] = reason; };
    if (!svg) { fail("no svg"); continue; }
    const box = svg.getBoundingClientRect();
    if (!(box.width > 0 && box.height > 0)) { fail("empty svg"); continue; }
    const areas = [...svg.querySelectorAll(`[id^="${name}-plotarea-"]`)]
      .map((e) => e.getBoundingClientRect()).filter((b) => b.width > 0 && b.height > 0);
    if (!areas.length) { fail("no plot area"); continue; }
    const shapes = [...svg.querySelectorAll(`[id^="${name}-mark-"]`)].flatMap((m) =>
      [m, ...m.querySelectorAll("path, line, rect, use, polyline, polygon")]);
    const drawn = shapes.filter((s) => s.tagName !== "g").map((s) => s.getBoundingClientRect())
      .filter((b) => nonEmpty(b) && areas.some((a) => inside(b, a)));
    if (!drawn.length) { fail("no drawn marks"); continue; }
    const texts = [...svg.querySelectorAll("text")];
    if (texts.length && !texts.some((t) => nonEmpty(t.getBoundingClientRect()))) {
      fail("text not rendered"); continue;
    }
    ok.push(name);
  }
  document.getElementById("render-check").textContent = JSON.stringify(
    {plots: figures.length, ok, bad, why, ms: performance.now()});
});
"""


def _td(text: str, *, numeric: bool = False) -> str:
    return f'<td class="n">{_h(text)}</td>' if numeric else f"<td>{_h(text)}</td>"


def _tr(cells: Sequence[str], css_class: str = "") -> str:
    attr = f' class="{css_class}"' if css_class else ""
    return f"<tr{attr}>{''.join(cells)}</tr>"


def _table(header: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{_h(c)}</th>" for c in header)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _changes_table(ok: Sequence[ChangeResult]) -> str:
    """One row per evaluated change (as in the summary, plus the title)."""
    rows = []
    for n, r in enumerate(ok, 1):
        row = _row(n, r)
        cells = [_td(str(row.n), numeric=True),
                 f'<td><code title="{_h(row.full_change)}">{_h(row.change)}</code></td>',
                 _td(row.title), _td(row.kind),
                 *(_td(c, numeric=True) for c in (row.tests, row.gpu_all, row.gpu_fastci,
                                                  row.latency_all, row.latency_fastci,
                                                  row.retention, row.failing)),
                 _td(row.detected)]
        rows.append(_tr(cells, "missed" if r.detected_by_all and not r.detected else ""))
    names = [name for name, _ in _COLUMNS]
    return _table(names[:2] + ["Title"] + names[2:], rows)


def _figure(plot: Plot) -> str:
    if not plot.svg:
        return f'<p class="no-plot">{_h(plot.name)}: not drawn ({_h(plot.why_empty)}).</p>'
    return (f'<figure class="plot" data-plot="{_h(plot.name)}">{plot.svg}'
            f"<figcaption>{_h(plot.caption)}</figcaption></figure>")


def _html_list(items: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else "<p>None.</p>"


def html_report(results: Sequence[ChangeResult], *, title: str = DEFAULT_TITLE) -> str:
    """One self-contained HTML page: headline, plots (inline SVG), changes, misses.

    Args:
        results: the evaluated changes (``results.jsonl``).
        title: the page's title and heading.

    Returns:
        The page; it loads nothing from anywhere, and after load writes the render
        check's JSON into ``<pre id="render-check">``.
    """
    ok = [r for r in results if not r.note]
    noted = [r for r in results if r.note]
    headline = _table(("Metric", "Value"), [
        _tr([_td(k), _td(v)]) for k, v in _headline(totals(results), len(noted))])
    plots = ("\n".join(_figure(p) for p in draw_plots(ok)) if ok
             else '<p class="no-plot">No evaluated change to plot.</p>')
    misses = [f"<code>{_h(test)}</code> in <code>{_h(change)}</code>: "
              f"{_h(why) or 'no reason recorded'}" for test, change, why in _misses(ok)]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_h(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_h(title)}</h1>", "<h2>Headline</h2>", headline,
        "<h2>Plots</h2>", plots,
        "<h2>Changes</h2>", _changes_table(ok) if ok else "<p>None.</p>",
        "<h2>Misses</h2>", _html_list(misses)]
    if noted:
        parts += [f"<h2>Not evaluated ({len(noted)})</h2>", _html_list(
            [f"<code>{_h(r.change)}</code>: {_h(r.note)}" for r in noted])]
    parts += ['<pre id="render-check" hidden></pre>', f"<script>{_RENDER_CHECK}</script>",
              "</body></html>"]
    return "\n".join(parts) + "\n"


# -- files -----------------------------------------------------------------------------

def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_reports(results: Sequence[ChangeResult], out_dir: Path, *,
                  title: str = DEFAULT_TITLE) -> tuple[Path, Path]:
    """Write ``summary.md`` and ``report.html`` into ``out_dir`` (each atomically).

    When ``$GITHUB_STEP_SUMMARY`` names a file, the Markdown summary is appended to it
    too (GitHub Actions shows it on the job's page).

    Args:
        results: the evaluated changes.
        out_dir: the directory (created if missing).
        title: the reports' heading.

    Returns:
        The paths of ``summary.md`` and ``report.html``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summary_markdown(results, title=title)
    md_path, html_path = out_dir / SUMMARY_NAME, out_dir / HTML_NAME
    _write_atomic(md_path, summary)
    _write_atomic(html_path, html_report(results, title=title))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(summary + "\n")
        LOG.debug("appended the summary to %s", step_summary)
    return md_path, html_path
