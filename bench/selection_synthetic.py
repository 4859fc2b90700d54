"""Plan time at scale: a 20-file change against 10,000 tests x 50,000 units.

Builds a synthetic git repository (500 files x 100 functions = 50,000 function
units, plus module units) and a synthetic evidence store through the store's
bulk path (``EvidenceStore.bulk_load``): 10,000 tests, each executing 500 units
in a cluster of 10 files (~5 million evidence rows). Then edits 20 files (19
function bodies, 1 module constant) and times ``fastci plan``'s analysis in a
fresh process, reporting wall time and peak RSS of that process.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

N_FILES, FUNCS_PER_FILE = 500, 100
N_TESTS, FILES_PER_TEST, FUNCS_PER_TEST_FILE = 10_000, 10, 50
N_CONTEXTS = 200
N_CHANGED_FILES = 20
TARGET_S = 2.0
PRUNE_TARGET_S = 0.5  # issue 14: pruning adds at most this to planning


def _source(f: int, bump: int = -1) -> str:
    lines = [f'"""Synthetic module {f}."""', f"OFFSET = {f}", ""]
    for i in range(FUNCS_PER_FILE):
        body = f"x + {i} + OFFSET" + (" + 1" if i == bump else "")
        lines += ["", f"def f_{i}(x):", f"    return {body}", ""]
    return "\n".join(lines) + "\n"


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def build(root: Path) -> dict[str, float]:
    """Create the synthetic repo and store under ``root``; return build timings."""
    from fastci.evidence.record.environment import current_fingerprint
    from fastci.evidence.store.db import EvidenceStore
    from fastci.units.index import FileUnits, index_source

    t0 = time.perf_counter()
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    units: list[tuple[str, str]] = []
    for f in range(N_FILES):
        rel = f"src/m{f:03d}.py"
        text = _source(f)
        (repo / rel).write_text(text)
        idx = index_source(rel, text)
        assert isinstance(idx, FileUnits)
        units.extend((u.id, u.checksum) for u in idx.units)  # <module> first, then f_0..f_99
    (repo / ".gitignore").write_text("/.fastci/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "synthetic base")
    commit = _git(repo, "rev-parse", "HEAD")
    t_repo = time.perf_counter() - t0
    per_file = FUNCS_PER_FILE + 1
    rng = random.Random(7)
    tests = [f"//synthetic/t{t // 100:03d}:test_{t:05d}" for t in range(N_TESTS)]
    contexts = [f"ctx:{c}" for c in range(N_CONTEXTS)]

    def rows():  # (test, unit, contexts) sorted by unit for the fastest load
        by_unit: list[list[int]] = [[] for _ in range(len(units))]
        for t in range(N_TESTS):
            first = rng.randrange(N_FILES)
            for k in range(FILES_PER_TEST):
                f = (first + k * 7) % N_FILES
                base = f * per_file
                by_unit[base].append(t)  # the module top level: every importer
                for i in rng.sample(range(1, per_file), FUNCS_PER_TEST_FILE - 1):
                    by_unit[base + i].append(t)
        for u, ts in enumerate(by_unit):
            for t in ts:
                yield t, u, (u % N_CONTEXTS, (u + t) % N_CONTEXTS)

    store_path = repo / ".fastci" / "evidence.db"
    t1 = time.perf_counter()
    store = EvidenceStore.open(store_path, create=True)
    store.bulk_load(tests, units, contexts, rows(), env_fingerprint=current_fingerprint())
    # Real recordings carry their commit; the bulk path leaves it unset.
    store.conn.execute("UPDATE run SET commit_sha = ?", (commit,))
    stats = store.stats()
    store.close()
    t_store = time.perf_counter() - t1
    # The change: 19 function bodies and one module constant, in 20 files.
    changed = rng.sample(range(N_FILES), N_CHANGED_FILES)
    for n, f in enumerate(changed):
        text = _source(f, bump=rng.randrange(FUNCS_PER_FILE))
        if n == 0:
            text = text.replace(f"OFFSET = {f}", f"OFFSET = {f + 1}")
        (repo / f"src/m{f:03d}.py").write_text(text)
    (root / "meta.json").write_text(json.dumps({"commit": commit, "stats": stats}))
    return {"repo_s": t_repo, "store_s": t_store, "evidence_rows": stats["evidence"],
            "store_mb": stats["bytes"] / 1e6}


_MEASURE = r"""
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.evidence.record.environment import current_fingerprint
fp = current_fingerprint()
t_import = time.perf_counter() - t0
repo = Path(sys.argv[1]); commit = sys.argv[2]
t1 = time.perf_counter()
with EvidenceStore.open(repo / ".fastci/evidence.db") as store:
    a = analyze(repo, Config(), base=commit, declared=Given(None), environment=KnownFingerprint(fp),
                store=store)
    text = a.plan.to_json()
t = time.perf_counter() - t1
# Pruning's own cost: the same analysis with every selected test a candidate (aggressive:
# the synthetic tests declare no checks, so safe mode would have nothing to try).
from fastci.select.prune import prune
with EvidenceStore.open(repo / ".fastci/evidence.db") as store:
    t2 = time.perf_counter()
    _sel, pruned = prune(a.selection, store, {}, {d.test: d.est_gpu_s for d in a.selection.selected},
                         "aggressive")
    prune_s = time.perf_counter() - t2
    # Each prioritization strategy's own cost on the same selection.
    from fastci.plan.prioritize import prioritized
    from fastci.select.priority import STRATEGIES
    order_s = {}
    for name in STRATEGIES:
        t3 = time.perf_counter()
        prioritized(a.selection, store, {}, name)
        order_s[name] = time.perf_counter() - t3
print(json.dumps({"plan_s": t, "prune_s": prune_s, "pruned": len(pruned), "order_s": order_s,
                  "import_s": t_import, "selected": len(a.selection.selected),
                  "tests": len(a.selection.decisions), "mode": a.plan.mode,
                  "changed_units": len(a.changes.unit_changes) if a.changes else None,
                  "reason": a.plan.reason, "plan_kb": len(text) / 1e3,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(root: Path, repeats: int = 3) -> list[dict[str, object]]:
    """Time the analysis in fresh processes (the first one reads a cold page cache)."""
    meta = json.loads((root / "meta.json").read_text())
    out = []
    for _ in range(repeats):
        res = subprocess.run([sys.executable, "-c", _MEASURE, str(root / "repo"), meta["commit"]],
                             capture_output=True, text=True, check=True)
        out.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def run(workdir: Path) -> list[str]:
    """Build, measure, and return the report lines."""
    root = workdir / "synthetic"
    if not (root / "meta.json").exists():
        if root.exists():
            import shutil

            shutil.rmtree(root)
        root.mkdir(parents=True)
        built = build(root)
        head = (f"built {N_TESTS:,} tests x {N_FILES * (FUNCS_PER_FILE + 1):,} units, "
                f"{built['evidence_rows']:,} evidence rows ({built['store_mb']:.0f} MB) in "
                f"{built['repo_s'] + built['store_s']:.0f} s")
    else:
        head = f"reusing the synthetic store in {root}"
    runs = measure(root)
    best = min(float(r["plan_s"]) for r in runs)  # type: ignore[arg-type]
    r = runs[-1]
    verdict = "OK" if best <= TARGET_S else "OVER TARGET"
    prune_best = min(float(x["prune_s"]) for x in runs)  # type: ignore[arg-type]
    times = ", ".join("%.2f" % float(x["plan_s"]) for x in runs)  # type: ignore[arg-type]
    return [
        "== plan time at scale (synthetic)",
        "  " + head,
        f"  change: {N_CHANGED_FILES} files ({r['changed_units']} units changed); plan mode "
        f"{r['mode']}: {r['selected']:,} of {r['tests']:,} tests selected",
        f"  plan time: {times} s "
        f"(best {best:.2f} s, target <= {TARGET_S:.0f} s: {verdict}); "
        f"+{float(r['import_s']):.2f} s interpreter imports",  # type: ignore[arg-type]
        f"  pruning (aggressive, every selected test a candidate): "
        f"{', '.join('%.2f' % float(x['prune_s']) for x in runs)} s, {r['pruned']:,} pruned "  # type: ignore[arg-type]
        f"(best {prune_best:.2f} s, target <= {PRUNE_TARGET_S} s: "
        f"{'OK' if prune_best <= PRUNE_TARGET_S else 'OVER TARGET'})",
        "  ordering the selected tests (best of the runs): " + ", ".join(
            f"{name} {min(float(x['order_s'][name]) for x in runs):.2f} s"  # type: ignore[index]
            for name in r["order_s"]),  # type: ignore[attr-defined]
        f"  peak RSS of the planning process: {float(r['peak_rss_mb']):.0f} MB; "  # type: ignore[arg-type]
        f"plan.json {float(r['plan_kb']):.0f} kB",  # type: ignore[arg-type]
    ]


if __name__ == "__main__":
    import tempfile

    base = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.gettempdir()) / "fastci-bench"
    for line in run(base):
        print(line)
