"""What the structural safety net costs (fastci.select.unseen): plans only, no runs.

On a scratch copy of the example (:func:`bench.replay.scratch_example`), every test is
recorded once with pytest at its floors; then each patch of ``bench/changes/`` is
applied and planned twice against that evidence, with the net and with it switched
off (its rule replaced by a no-op, here only: the product has no switch), and the
tests selected and their "s x GPUs" (each test's recorded duration at floors times the
GPUs its suite entry declares: a cost proxy on a CPU host) are printed side by side.

``--scale`` instead times planning on the synthetic 10,000-test store with the net as it
is and forced to fire (:func:`at_scale`).

``python -m bench.unseen_cost [--store PATH] [--keep] [--scale]``: ``--store`` plans against an
evidence store recorded before (with ``--keep``: the scratch repository is kept and its
path printed, with the store inside, so a second run can skip the recording).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from bench.microllm_suite import load_suite
from bench.replay import EXAMPLE, REPO, pytest_run_all, scratch_example
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze_change
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.select import change_rules
from fastci.select.decisions import DecisionKind
from fastci.units.index import FileUnits, UnitKind, index_source

CHANGES = Path(__file__).resolve().parent / "changes"


@contextlib.contextmanager
def net_off() -> Iterator[None]:
    """Plan without the net (for the comparison only)."""
    saved = change_rules.unseen_code_rules
    change_rules.unseen_code_rules = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        change_rules.unseen_code_rules = saved


def gpu_seconds(store: Path) -> dict[str, float]:
    """Test -> its recorded duration (at floors) x the GPUs its suite entry declares (pytest
    records no GPU count)."""
    suite = load_suite()
    with EvidenceStore.open(store) as s:
        runs = s.latest_runs()
    return {t: r.duration_s * int(suite.get(t.split("::")[0].rsplit("/", 1)[-1][:-3], {})
                                  .get("gpus", 1))
            for t, r in runs.items()}


def plan(root: Path, store: Path, cost_of: dict[str, float]) -> tuple[set[str], float, set[str]]:
    """(selected tests, their est. s x GPUs, tests with an UNSEEN_CODE reason)."""
    _, a = analyze_change(root, store=str(store), plan=str(root / ".fastci" / "plan.json"),
                          runner="pytest")
    assert a.plan.mode == "selective", a.plan.reason
    chosen = {t.id for t in a.plan.tests}
    cost = sum(cost_of.get(t, 0.0) for t in chosen)
    net = {d.test for d in a.selection.selected
           if any(r.kind is DecisionKind.UNSEEN_CODE for r in d.reasons)}
    return chosen, cost, net


def exposure(root: Path, store: Path, cost_of: dict[str, float]) -> None:
    """What an edit of each function no test executed would cost: the tests the net
    selects for it (those running another function of its module, else its importers)."""
    paths = sorted(p.relative_to(root).as_posix()
                   for p in (root / EXAMPLE / "microllm").rglob("*.py"))
    rows: list[tuple[str, int, float]] = []
    with EvidenceStore.open(store) as s:
        for path in paths:
            idx = index_source(path, (root / path).read_bytes())
            if not isinstance(idx, FileUnits):
                continue
            functions = [u.id for u in idx.units if u.kind is UnitKind.FUNCTION]
            ran = s.tests_for_units(functions)
            callers = set().union(*ran.values()) if ran else set()
            reach = callers or s.tests_for_modules([path])[path]
            rows += [(uid, len(reach), sum(cost_of.get(t, 0.0) for t in reach))
                     for uid in functions if not ran.get(uid)]
    print(f"functions of {EXAMPLE}/microllm no recording executed: {len(rows)}; an edit of "
          "one selects (tests, s x GPUs):")
    for uid, n, cost in sorted(rows, key=lambda r: -r[2]):
        print(f"  {uid[len(EXAMPLE) + 1:]:70s} {n:3d} {cost:8.1f}")
    if rows:
        costs = sorted(r[2] for r in rows)
        print(f"  median {costs[len(costs) // 2]:.1f} s x GPUs, max {costs[-1]:.1f}")


def at_scale(workdir: Path, repeats: int = 3) -> None:
    """Plan time on :mod:`bench.selection_synthetic`'s store (10,000 tests x 50,500 units, a
    20-file change), with the net as it is (it does not fire: every changed function is
    executed by some test) and forced to fire on every changed function (its worst case:
    the callers' lookup for every changed file and a reason per reached test)."""
    import json
    import time

    from bench.selection_synthetic import build
    from fastci.config import Config
    from fastci.evidence.record.environment import current_fingerprint
    from fastci.plan.planner import analyze
    from fastci.select import unseen

    root = workdir / "synthetic"
    if not (root / "meta.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        build(root)
    commit = json.loads((root / "meta.json").read_text())["commit"]
    fp = current_fingerprint()
    real = unseen.unseen_changes
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(repeats):
        for label in ("as is", "forced to fire"):
            unseen.unseen_changes = (  # type: ignore[assignment]
                real if label == "as is" else lambda fd, executed: real(fd, {}))
            try:
                with EvidenceStore.open(root / "repo/.fastci/evidence.db") as s:
                    t0 = time.perf_counter()
                    a = analyze(root / "repo", Config(), base=commit, declared=Given(None),
                                environment=KnownFingerprint(fp), store=s)
                    dt = time.perf_counter() - t0
            finally:
                unseen.unseen_changes = real
            net = sum(1 for d in a.selection.selected
                      if any(r.kind is DecisionKind.UNSEEN_CODE for r in d.reasons))
            if label not in best or dt < best[label][0]:
                best[label] = (dt, len(a.selection.selected), net)
    print(f"plan time at 10,000 tests x 50,500 units (best of {repeats}, in-process):")
    for label, (dt, n, net) in best.items():
        print(f"  net {label:15s} {dt:.2f} s, {n:,} tests selected, {net:,} with its reason")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.unseen_cost")
    ap.add_argument("--store", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--scale", action="store_true",
                    help="only the plan-time measurement on the synthetic store")
    args = ap.parse_args(argv)
    if args.scale:
        work = Path(tempfile.mkdtemp(prefix="fastci-unseen-scale-"))
        try:
            at_scale(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="fastci-unseen-"))
    try:
        root = scratch_example(work / "repo")
        store = (root / ".fastci" / "evidence.db")
        store.parent.mkdir(parents=True, exist_ok=True)
        if args.store:
            shutil.copy(args.store, store)
        else:
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
                       PYTHONPATH=os.pathsep.join([str(root / EXAMPLE), str(REPO / "analyzer")]))
            traces = work / "traces"
            pytest_run_all(root, [f"{EXAMPLE}/tests"], env, ["--at-floors"])(traces)
            head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip()
            with EvidenceStore.open(store, create=True) as s:
                ingest(s, find_traces([traces]), source="pytest", commit=head, root=root)
        cost_of = gpu_seconds(store)
        print(f"{len(cost_of)} tests recorded; all of them: {sum(cost_of.values()):.1f} s x GPUs")
        print("plan-only: tests selected and est. s x GPUs (recorded at floors), "
              "without -> with the net")
        totals = [0, 0, 0.0, 0.0]
        for patch in sorted(CHANGES.glob("*.patch")):
            subprocess.run(["git", "-C", str(root), "apply", str(patch)], check=True)
            try:
                with net_off():
                    off, off_cost, _ = plan(root, store, cost_of)
                on, on_cost, net = plan(root, store, cost_of)
            finally:
                subprocess.run(["git", "-C", str(root), "checkout", "-q", "--", "."], check=True)
            totals = [totals[0] + len(off), totals[1] + len(on), totals[2] + off_cost,
                      totals[3] + on_cost]
            extra = sorted(on - off)
            print(f"  {patch.stem[:40]:40s} {len(off):3d} -> {len(on):3d} tests  "
                  f"{off_cost:8.1f} -> {on_cost:8.1f} s x GPUs"
                  + (f"  net adds: {', '.join(t.rsplit('/', 1)[-1] for t in extra)}"
                     if extra else "")
                  + (f"  (net reasons on {len(net)})" if net else ""))
        print(f"  total{'':35s} {totals[0]:3d} -> {totals[1]:3d} tests  {totals[2]:8.1f} -> "
              f"{totals[3]:8.1f} s x GPUs")
        exposure(root, store, cost_of)
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
