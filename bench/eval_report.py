"""Report benchmark: ``fastci eval``'s ``report.html`` for 50 changes, in a real browser.

Builds 50 synthetic-but-plausible evaluated changes (commits, patches and faults, about
30 tests each, a few missed failures, one change that could not be evaluated), times
:func:`fastci.eval.report.write_reports` (median of 3), then opens ``report.html`` in
headless Chromium 5 times and takes the median of the render check's ``ms`` (the page's
``performance.now()`` once every plot has been checked). Target: under 2 s; exit 1 when
over, when the page is over 2 MiB, when a plot did not render, or when Chromium is
missing (``make setup`` installs it). ``--keep`` keeps the report and prints where it is.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from fastci.eval.report import write_reports
from fastci.eval.results import Arm, ChangeResult, TestOutcome

CHROMIUM = "/usr/bin/chromium"
TARGET_MS = 2000.0
MAX_BYTES = 2 * 1024 * 1024
CHANGES, TESTS, RENDERS, WRITES = 50, 30, 5, 3
SLOTS = 8


class ChromiumMissing(RuntimeError):
    """Chromium is not installed (``make setup`` installs Debian's ``chromium``)."""


class _RenderCheck(HTMLParser):
    """The text of ``<pre id="render-check">`` (or another ``pre`` by id) in a dumped DOM."""

    def __init__(self, pre_id: str = "render-check") -> None:
        super().__init__()
        self.pre_id = pre_id
        self.inside, self.text = False, ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.inside = tag == "pre" and ("id", self.pre_id) in attrs

    def handle_endtag(self, tag: str) -> None:
        self.inside = False

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.text += data


def chromium() -> str:
    """The Chromium binary; :class:`ChromiumMissing` with what to do when absent."""
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if not found:
        raise ChromiumMissing(f"Chromium is not installed ({CHROMIUM} missing): `make setup` "
                              "installs Debian's chromium package")
    return found


def dump_dom(page: Path, *, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Open ``page`` in headless Chromium; its stdout is the DOM once the page has loaded.

    Raises:
        ChromiumMissing: Chromium is not installed.
    """
    binary = chromium()
    with tempfile.TemporaryDirectory(prefix="fastci-chromium-") as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
             "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=timeout_s, check=False)


def render_check(page: Path, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Open ``page`` in headless Chromium and return its render check's JSON.

    Raises:
        ChromiumMissing: Chromium is not installed.
        RuntimeError: Chromium failed, or the page wrote no render check.
    """
    proc = dump_dom(page, timeout_s=timeout_s)
    text = pre_text(proc.stdout)
    if proc.returncode or not text.strip():
        raise RuntimeError(f"chromium exit {proc.returncode}, no render check in the DOM; "
                           f"stderr: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(text)
    return result


def pre_text(dom: str, pre_id: str = "render-check") -> str:
    """The text of the ``<pre id=pre_id>`` in a dumped DOM ("" when there is none)."""
    parser = _RenderCheck(pre_id)
    parser.feed(dom)
    return parser.text


def _test_rows(rng: random.Random, kind: str) -> list[TestOutcome]:
    rows = []
    failing = set(rng.sample(range(TESTS), rng.choice((1, 1, 2, 3)))) \
        if rng.random() < (0.8 if kind == "fault" else 0.15) else set()
    for i in range(TESTS):
        gpus = rng.choice((0, 1, 1, 2, 4, 8))
        all_s = round(rng.lognormvariate(3.0, 1.0), 2)
        fails = i in failing
        planned = rng.random() < (0.93 if fails else 0.3)
        reduced = planned and rng.random() < 0.5
        rows.append(TestOutcome(
            id=f"//tests/unit:test_{i:02d}", gpus=gpus,
            all_outcome="failed" if fails else "passed", all_s=all_s, planned=planned,
            overrides={"train_iters": 20} if reduced else {},
            plan_outcome=("failed" if fails else "passed") if planned else "",
            plan_s=round(all_s * (0.25 if reduced else 1.0), 2) if planned else 0.0,
            reused=planned and not reduced,
            why="reaches the changed lines" if planned else "no evidence it reaches the change"))
    # The plan's order (planned rows first, as results.jsonl has them): failing tests early.
    plan_order = sorted((t for t in rows if t.planned), key=lambda t: t.all_outcome != "failed")
    return plan_order + [t for t in rows if not t.planned]


def _arm(rows: list[TestOutcome], fastci: bool, lead_s: float) -> Arm:
    """An arm's numbers from the rows, roughly (latency: cost spread over the slots;
    APFDc: from the first failure only); plausible, not the harness's metrics."""
    ran = [t for t in rows if t.planned] if fastci else sorted(rows, key=lambda t: t.id)
    costs = [(t.plan_s if fastci else t.all_s) * max(t.gpus, 1) for t in ran]
    failed = [t.id for t in ran if (t.plan_outcome if fastci else t.all_outcome) == "failed"]
    first = next((i for i, t in enumerate(ran) if t.id in failed), None)
    total = sum(costs)
    return Arm(tests=len(ran), gpu_s=round(total, 2),
               latency_s=round(lead_s + total / SLOTS, 2), failing=tuple(sorted(failed)),
               ttff_s=None if first is None else round(lead_s + sum(costs[:first + 1]) / SLOTS, 2),
               apfdc=None if first is None or not total
               else round(1 - sum(costs[:first]) / total - costs[first] / (2 * total), 3))


def synthetic_results(n: int = CHANGES, *, seed: int = 7) -> list[ChangeResult]:
    """``n`` plausible evaluated changes (the last one could not be evaluated)."""
    rng = random.Random(seed)
    results = []
    for k in range(n):
        kind = ("commit", "patch", "fault", "fault", "commit")[k % 5]
        sha = f"{rng.getrandbits(160):040x}"
        change = {"commit": f"commit:{sha}", "patch": f"patch:fix-{k}.diff",
                  "fault": f"fault:commit:{sha}:negate-cond-{k}"}[kind]
        rows = _test_rows(rng, kind)
        analysis = round(rng.uniform(1.0, 6.0), 2)
        run_all, fastci = _arm(rows, False, 0.0), _arm(rows, True, analysis)
        missed = tuple({"test": t, "why": "no evidence it reaches the change"}
                       for t in sorted(set(run_all.failing) - set(fastci.failing)))
        changed = rng.randint(3, 120)
        cached = rng.random() < 0.4
        results.append(ChangeResult(
            change=change, kind=kind, title=f"{kind} {k}: tweak the scheduler's warm-up",
            base=sha, head=sha[::-1], settings={"gpu_slots": SLOTS}, plan_mode="selective",
            plan_reason="evidence covers the change", analysis_s=analysis, run_all=run_all,
            fastci=fastci, changed_lines=changed,
            retained_lines=changed - (rng.randint(0, changed // 5) if missed else 0),
            missed=missed, tests=tuple(rows),
            parent=f"commit:{sha}" if kind == "fault" else "",
            timing={"runs": fastci.gpu_s / SLOTS + (0 if cached else run_all.gpu_s / SLOTS),
                    "analysis": analysis, "bookkeeping": rng.uniform(2, 10),
                    "cached": run_all.gpu_s / SLOTS if cached else 0.0},
            run_all_cached=cached, recorded_at=1.7e9 + k,
            note="bazel build failed on the base commit" if k == n - 1 else ""))
    return results


def main(argv: list[str]) -> int:
    """``python -m bench eval_report [-- --keep]``: exit 1 over target or on a bad plot."""
    results = synthetic_results()
    work = Path(tempfile.mkdtemp(prefix="fastci-eval-report-"))
    try:
        writes = []
        for _ in range(WRITES):
            t0 = time.perf_counter()
            _, page = write_reports(results, work)
            writes.append(time.perf_counter() - t0)
        size_kib = page.stat().st_size / 1024
        checks = [render_check(page) for _ in range(RENDERS)]
    except (ChromiumMissing, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"eval report benchmark FAILED: {exc}")
        return 1
    finally:
        if "--keep" in argv:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    render_ms = statistics.median(c["ms"] for c in checks)
    bad = sorted({name for c in checks for name in c["bad"]})
    plots = checks[0]["plots"]
    problems = (["render over target"] if render_ms > TARGET_MS else []) \
        + ([f"report over {MAX_BYTES >> 20} MiB"] if size_kib * 1024 > MAX_BYTES else []) \
        + ([f"plots not rendered: {', '.join(bad)}"] if bad else [])
    print(f"eval report: {len(results)} changes x {TESTS} tests: report.html {size_kib:.0f} KiB, "
          f"{plots} plots; write_reports {statistics.median(writes):.2f} s (median of {WRITES}); "
          f"render {render_ms:.0f} ms in headless Chromium (median of {RENDERS}; target < "
          f"{TARGET_MS:.0f} ms): {'FAILED: ' + '; '.join(problems) if problems else 'OK'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
