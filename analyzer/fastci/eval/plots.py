"""The plots of ``report.html``, drawn with matplotlib as inline SVG.

Axes that number changes, or count them, have whole-number ticks only.

Five plots, each from the evaluated results (lines without a ``note``):

- ``cost_safety`` — per change, FastCI's GPU-seconds as a fraction of run-all's
  against modified-code coverage retention, coloured by detection;
- ``gpu_seconds`` — per change, run-all's and FastCI's GPU-seconds side by side;
- ``detection`` — per change kind, changes detected, missed, and with nothing to detect;
- ``apfd`` — for changes run-all saw fail, failing tests found against cost spent,
  FastCI's order against run-all's;
- ``eval_time`` — per change, where the evaluation's own time went (``timing``).

Figures are :class:`matplotlib.figure.Figure` objects rendered straight to SVG: no
pyplot, no backend switch, rcParams set only inside :func:`matplotlib.rc_context`. The
SVG has text as ``<text>`` (small, selectable), a fixed hash salt (the same results
give the same bytes), and every id scoped by the plot's name so several SVGs share one
HTML document. Data artists get the id ``<plot>-mark-<n>`` and plot areas
``<plot>-plotarea-<n>``: the report's render check looks for them.
"""

from __future__ import annotations

import bisect
import io
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import matplotlib
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator
from matplotlib.typing import RcKeyType

from fastci.eval.results import ChangeResult

#: Colours (colour-blind safe): the two arms, and the three detection classes.
RUN_ALL, FASTCI = "#7f7f7f", "#1f77b4"
DETECTED, MISSED, NOTHING = "#1b9e77", "#d95f02", "#9e9ac8"
#: Timing keys in stacking order (others follow, sorted).
TIMING_KEYS = ("runs", "analysis", "bookkeeping", "cached")

_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none", "svg.hashsalt": "fastci-eval", "font.size": 8.0,
    "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False}
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_PROLOG = re.compile(r"\A.*?(?=<svg\b)", re.DOTALL)
_IDS = re.compile(r'(\bid="|href="#|url\(#)')
_MEAN_GRID = 201
#: At most this many labelled changes along a per-change axis (every k-th beyond it).
_CHANGE_TICKS = 20


@dataclass(frozen=True)
class Plot:
    """One plot of the report.

    Attributes:
        name: a stable identifier (``data-plot`` in the HTML).
        caption: what it shows, one or two sentences.
        svg: the ``<svg>`` element; "" when there was nothing to draw.
        why_empty: why nothing was drawn ("" when ``svg`` is set).
    """

    name: str
    caption: str
    svg: str = ""
    why_empty: str = ""


class _Drawing:
    """A figure being drawn for one plot: tags data artists for the render check."""

    def __init__(self, name: str, width: float, height: float = 3.0) -> None:
        self.name = name
        self.fig = Figure(figsize=(width, height), layout="constrained")
        self._marks = 0

    def axes(self) -> Axes:
        ax = self.fig.add_subplot()
        ax.patch.set_gid(f"plotarea-{len(self.fig.axes)}")
        return ax

    def mark(self, *artists: Artist) -> None:
        for artist in artists:
            self._marks += 1
            artist.set_gid(f"mark-{self._marks}")

    def svg(self) -> str:
        buf = io.StringIO()
        self.fig.savefig(buf, format="svg", metadata=_NO_METADATA)
        svg = _PROLOG.sub("", buf.getvalue(), count=1)
        return _IDS.sub(lambda m: f"{m.group(1)}{self.name}-", svg).strip()


def _ratio(r: ChangeResult) -> float | None:
    return r.fastci.gpu_s / r.run_all.gpu_s if r.run_all.gpu_s > 0 else None


def _detection_class(r: ChangeResult) -> str:
    if not r.detected_by_all:
        return "nothing to detect"
    return "detected" if r.detected else "missed a failure"


def _width(n: int) -> float:
    """Figure width in inches for ``n`` changes along the x axis."""
    return min(12.0, max(6.0, 0.16 * n + 1.5))


def change_ticks(n: int) -> list[int]:
    """The change numbers a per-change axis labels: 1..n, every k-th when there are more
    than :data:`_CHANGE_TICKS` (a change is a whole number: no tick between two)."""
    step = max(1, math.ceil(n / _CHANGE_TICKS))
    return list(range(1, n + 1, step))


def _per_change_axis(ax: Axes, n: int) -> None:
    ax.set_xlim(0.4, n + 0.6)
    ax.xaxis.set_major_locator(FixedLocator(change_ticks(n)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("change (# in the table)")


def _count_axis(ax: Axes) -> None:
    """Whole-number ticks on the y axis of a count (``min_n_ticks=1``: matplotlib would
    fall back to fractions when fewer than 2 whole numbers are in view)."""
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _cost_safety(ok: Sequence[ChangeResult]) -> Plot:
    name = "cost_safety"
    caption = ("Cost against safety, one point per change: FastCI's GPU-seconds as a fraction "
               "of run-all's (left is cheaper) and the modified-code coverage it retained "
               "(up is safer).")
    points = [(x, r.retention, _detection_class(r)) for r in ok if (x := _ratio(r)) is not None]
    if not points:
        return Plot(name, caption, why_empty="no change where run-all cost anything")
    d = _Drawing(name, 5.0, 3.4)
    ax = d.axes()
    styles = {"detected": (DETECTED, "o"), "missed a failure": (MISSED, "X"),
              "nothing to detect": (NOTHING, "s")}
    for label, (colour, marker) in styles.items():
        xs = [x for x, _, c in points if c == label]
        ys = [y for _, y, c in points if c == label]
        if xs:
            d.mark(ax.scatter(xs, ys, s=28, c=colour, marker=marker, alpha=0.85,
                              label=f"{label} ({len(xs)})", linewidths=0))
    ax.set_xlim(0, max(1.05, max(x for x, _, _ in points) * 1.05))
    ax.set_ylim(max(0.0, min(0.8, min(y for _, y, _ in points) - 0.05)), 1.01)
    ax.set_xlabel("FastCI GPU-seconds / run-all GPU-seconds")
    ax.set_ylabel("modified-code coverage retained")
    ax.legend(loc="lower right")
    return Plot(name, caption, d.svg())


def _gpu_seconds(ok: Sequence[ChangeResult]) -> Plot:
    name = "gpu_seconds"
    caption = "GPU-seconds per change: run-all at full workload against FastCI's plan."
    if not ok:
        return Plot(name, caption, why_empty="no evaluated change")
    d = _Drawing(name, _width(len(ok)))
    ax = d.axes()
    xs = range(1, len(ok) + 1)
    d.mark(*ax.bar([x - 0.2 for x in xs], [r.run_all.gpu_s for r in ok], 0.4,
                   color=RUN_ALL, label="run-all"))
    d.mark(*ax.bar([x + 0.2 for x in xs], [r.fastci.gpu_s for r in ok], 0.4,
                   color=FASTCI, label="FastCI"))
    _per_change_axis(ax, len(ok))
    ax.set_ylabel("GPU-seconds")
    ax.legend(loc="upper right")
    return Plot(name, caption, d.svg())


def _detection(ok: Sequence[ChangeResult]) -> Plot:
    name = "detection"
    caption = ("Detection per change kind: changes whose failure FastCI's plan saw, changes "
               "where it missed run-all's failure, and changes run-all saw no failure in.")
    if not ok:
        return Plot(name, caption, why_empty="no evaluated change")
    kinds = [k for k in ("commit", "patch", "fault") if any(r.kind == k for r in ok)]
    kinds += sorted({r.kind for r in ok} - set(kinds))
    d = _Drawing(name, 4.0)
    ax = d.axes()
    bottom = [0] * len(kinds)
    for label, colour in (("detected", DETECTED), ("missed a failure", MISSED),
                          ("nothing to detect", NOTHING)):
        counts = [sum(1 for r in ok if r.kind == k and _detection_class(r) == label)
                  for k in kinds]
        d.mark(*ax.bar(kinds, counts, 0.6, bottom=bottom, color=colour, label=label))
        bottom = [b + c for b, c in zip(bottom, counts)]
    _count_axis(ax)
    ax.set_ylabel("changes")
    ax.set_ylim(0, max(bottom) * 1.35)
    ax.legend(loc="upper right", fontsize=7)
    return Plot(name, caption, d.svg())


def _curve(steps: Sequence[tuple[float, bool]], total: float,
           failing: int) -> tuple[list[float], list[float]]:
    """A step curve: after each test, cost spent / ``total`` and failing found / ``failing``."""
    xs, ys, spent, found = [0.0], [0.0], 0.0, 0
    for cost, fails in steps:
        spent += cost
        if fails:
            found += 1
            xs.append(spent / total)
            ys.append(found / failing)
    xs.append(spent / total)
    ys.append(found / failing)
    return xs, ys


def apfd_curves(r: ChangeResult) -> tuple[tuple[list[float], list[float]],
                                          tuple[list[float], list[float]]] | None:
    """Failing tests found against cost spent, for FastCI's order and run-all's.

    Args:
        r: an evaluated change.

    Returns:
        ``(fastci, run_all)``, each ``(xs, ys)`` of a step curve (steps after each
        point): x is cost spent (duration x max(GPUs, 1)) as a fraction of run-all's
        total, y the fraction of run-all's failing tests found. FastCI runs its planned
        rows in their order and finds a test when it fails there; run-all runs every
        row in id order. None when run-all saw no failure or cost nothing.
    """
    failing = set(r.run_all.failing)
    total = sum(t.all_s * max(t.gpus, 1) for t in r.tests)
    if not failing or total <= 0:
        return None
    plan = [(t.plan_s * max(t.gpus, 1), t.plan_outcome == "failed" and t.id in failing)
            for t in r.tests if t.planned]
    every = [(t.all_s * max(t.gpus, 1), t.id in failing)
             for t in sorted(r.tests, key=lambda t: t.id)]
    return _curve(plan, total, len(failing)), _curve(every, total, len(failing))


def _mean_curve(curves: Sequence[tuple[list[float], list[float]]],
                grid: Sequence[float]) -> list[float]:
    """The mean over ``curves`` of each step curve's value at each x of ``grid``."""
    return [sum(ys[max(bisect.bisect_right(xs, x) - 1, 0)] for xs, ys in curves) / len(curves)
            for x in grid]


def _apfd(ok: Sequence[ChangeResult]) -> Plot:
    name = "apfd"
    pairs = [c for r in ok if (c := apfd_curves(r)) is not None]
    caption = (f"Fault detection against cost, for the {len(pairs)} change(s) run-all saw fail: "
               "the fraction of run-all's failing tests found against GPU-seconds spent as a "
               "fraction of run-all's; thin: one change, bold: the mean. FastCI's curve ends "
               "where its plan ends.")
    if not pairs:
        return Plot(name, caption, why_empty="run-all saw no failure")
    d = _Drawing(name, 5.0, 3.4)
    ax = d.axes()
    thin = max(0.15, min(0.6, 3.0 / len(pairs)))
    for fastci, run_all in pairs:
        d.mark(*ax.step(*run_all, where="post", color=RUN_ALL, lw=0.8, alpha=thin))
        d.mark(*ax.step(*fastci, where="post", color=FASTCI, lw=0.8, alpha=thin))
    right = max(1.0, max(max(f[0][-1], a[0][-1]) for f, a in pairs))
    grid = [right * i / (_MEAN_GRID - 1) for i in range(_MEAN_GRID)]
    for arm, colour, label in ((1, RUN_ALL, "run-all, id order"),
                               (0, FASTCI, "FastCI, plan order")):
        d.mark(*ax.step(grid, _mean_curve([p[arm] for p in pairs], grid), where="post",
                        color=colour, lw=2.2, label=f"{label} (mean)"))
    ax.set_xlim(0, right * 1.02)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("GPU-seconds spent / run-all's total")
    ax.set_ylabel("failing tests found")
    ax.legend(loc="lower right")
    return Plot(name, caption, d.svg())


def _eval_time(ok: Sequence[ChangeResult]) -> Plot:
    name = "eval_time"
    keys = [k for k in TIMING_KEYS if any(r.timing.get(k) for r in ok)]
    keys += sorted({k for r in ok for k, v in r.timing.items() if v} - set(keys))
    spent = {k: sum(r.timing.get(k, 0.0) for r in ok) for k in keys}
    caption = ("Where the evaluation's own time went, per change (cached: run-all results "
               "reused, not run now). Total: "
               + (", ".join(f"{k} {v:.1f} s" for k, v in spent.items()) or "nothing recorded")
               + ".")
    if not keys:
        return Plot(name, caption, why_empty="no timing recorded")
    d = _Drawing(name, _width(len(ok)))
    ax = d.axes()
    xs = list(range(1, len(ok) + 1))
    bottom = [0.0] * len(ok)
    colours = matplotlib.color_sequences["tab10"]
    for i, k in enumerate(keys):
        heights = [r.timing.get(k, 0.0) for r in ok]
        d.mark(*ax.bar(xs, heights, 0.7, bottom=bottom, color=colours[i % len(colours)],
                       label=k))
        bottom = [b + h for b, h in zip(bottom, heights)]
    _per_change_axis(ax, len(ok))
    ax.set_ylabel("seconds")
    ax.legend(loc="upper right")
    return Plot(name, caption, d.svg())


def draw_plots(results: Sequence[ChangeResult]) -> list[Plot]:
    """Every plot of the report, in order, for the results without a note.

    Args:
        results: the evaluated changes (lines with a ``note`` are left out).

    Returns:
        One :class:`Plot` per plot; those with nothing to draw have ``svg`` "".
    """
    ok = [r for r in results if not r.note]
    with matplotlib.rc_context(_RC):
        return [draw(ok) for draw in (_cost_safety, _gpu_seconds, _detection, _apfd,
                                      _eval_time)]

