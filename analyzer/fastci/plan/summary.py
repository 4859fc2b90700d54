"""The human summary of a plan (``fastci plan`` prints it) and the timing it reads."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from fastci.plan.analysis import Analysis, Timing
from fastci.plan.reduce import Choice, planned_cost
from fastci.select import Selection
from fastci.select.test_rules import DeclaredTest, EvidenceReader
from fastci.types import TestId

LOG = logging.getLogger(__name__)


def timing_of(store: EvidenceReader, declared: Mapping[TestId, DeclaredTest] | None
              ) -> dict[TestId, Timing]:
    """Each known test's newest recorded duration and GPUs (declared GPUs win), for the summary."""
    try:
        runs = store.latest_runs()
    except Exception as exc:  # noqa: BLE001 - the summary only loses its estimate
        LOG.warning("cannot read recorded durations: %s", exc)
        runs = {}
    out = {t: Timing(float(r.duration_s), int(r.gpus)) for t, r in runs.items()}
    for t, d in (declared or {}).items():
        run = runs.get(t)
        out[t] = Timing(float(run.duration_s) if run is not None else None, int(d.gpus))
    return out


def summarize(analysis: Analysis) -> list[str]:
    """The human summary ``fastci plan`` prints."""
    sel, plan = analysis.selection, analysis.plan
    n_sel, n_all = len(sel.selected), len(sel.decisions)
    if plan.mode == "all":
        lines = [f"fastci plan: all: every test runs at full workload ({n_all} known)"]
    else:
        lines = [f"fastci plan: {plan.mode}: {n_sel} of {n_all} tests selected, "
                 f"{n_all - n_sel} skipped ({sel.summary})"]
    if analysis.runner is not None:
        lines.append(f"  runner: {analysis.runner} ({analysis.runner_why})")
    lines.extend(_cost_lines(sel, analysis.timing, analysis.choices))
    reduced = sum(1 for d in sel.selected if (c := analysis.choices.get(d.test)) and c.reduced)
    if reduced:
        lines.append(f"  reduced: {reduced} of {n_sel} selected tests run at a reduced workload")
    for r in sel.widen:
        lines.append(f"  widened: {r.sentence}")
    for note in sel.notes:
        lines.append(f"  note: {note}")
    # Every reason a test has counts, not only its first: a test that both executes a
    # changed unit and failed last time shows under both (so the counts may add up to
    # more than the number of tests; the header says so when they do).
    # Decisions made alike share their reasons tuple (Decision.sharing: ~98,000 of
    # 100,000 at scale), so the kinds are counted per tuple.
    groups: dict[int, list[Any]] = {}
    for d in sel.decisions:
        group = groups.get(id(d.reasons))
        if group is None:
            groups[id(d.reasons)] = [d.reasons, 1]
        else:
            group[1] += 1
    by_kind: dict[str, int] = {}
    several = 0
    for reasons, n in groups.values():
        kinds = list(dict.fromkeys(r.kind.value for r in reasons)) or ["?"]
        several += n if len(kinds) > 1 else 0
        for key in kinds:
            by_kind[key] = by_kind.get(key, 0) + n
    if several:
        lines.append(f"  tests by reason ({several} with several reasons count under each):")
    for kind, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {n:4d}  {kind}")
    lines.append(f"  analysis took {analysis.elapsed_s:.2f} s")
    return lines


def _cost_lines(sel: Selection, timing: Mapping[TestId, Timing],
                choices: Mapping[TestId, Choice] | None = None) -> list[str]:
    """What the selected tests cost of all: GPU-seconds, measured test time, or both.

    A suite without GPU tests reports its recorded test time (GPU-seconds would be
    0.0 of 0.0); a mixed one reports both; a test never run counts as never timed.
    GPU-seconds are at the workloads the plan chose (:func:`planned_cost`); when some
    run reduced, the full-workload figure follows. "Of all" is every test at full workload.
    """
    choices = choices or {}
    n_sel = len(sel.selected)
    gpu_suite = any(timing[d.test].gpus > 0 for d in sel.decisions if d.test in timing)
    cpu_tests = any(timing[d.test].gpus <= 0 for d in sel.decisions if d.test in timing)
    lines = []
    if gpu_suite or not timing:  # no timing at all (a caller's own Analysis): the old estimate
        known = [x for d in sel.selected if (x := planned_cost(d, choices)) is not None]
        full = [d.est_gpu_s for d in sel.selected if d.est_gpu_s is not None]
        every = [d.est_gpu_s for d in sel.decisions if d.est_gpu_s is not None]
        unknown = n_sel - len(known)
        notes = ([f"at the planned workloads; {sum(full):.1f} at full workload"]
                 if sum(known) != sum(full) else []) \
            + ([f"+{unknown} tests never timed"] if unknown else [])
        lines.append(f"  estimated GPU-seconds: {sum(known):.1f} of {sum(every):.1f} for all"
                     + "".join(f" ({n})" for n in notes))
    if timing and (cpu_tests or not gpu_suite):
        def seconds(t: TestId) -> float | None:
            return timing[t].duration_s if t in timing else None

        chosen = [x for d in sel.selected if (x := seconds(d.test)) is not None]
        every_s = [x for d in sel.decisions if (x := seconds(d.test)) is not None]
        unknown = n_sel - len(chosen)
        kind = " (GPU and CPU tests)" if gpu_suite else " (CPU)" if cpu_tests else ""
        lines.append(f"  estimated test time: {sum(chosen):.1f} s of {sum(every_s):.1f} s{kind}"
                     + (f" (+{unknown} tests never timed)" if unknown else ""))
    return lines
