"""The evidence store at scale (issue 16): 100,000 tests x 500,000 units.

A synthetic git repository of 5,000 files x 100 functions (505,000 units with the
module units) and a starting store bulk-loaded with 100,000 tests, each executing
~500 units in a cluster of 10 files (~50 million (test, unit) pairs). Then, as a
CI main-branch job would, one new full-suite recording is ingested on top through
the real path: one trace file per test, as the recorder writes them, ingested as
``fastci ingest DIR`` does (:func:`fastci.evidence.fill.ingest_paths`: read, decode,
merge into runs in worker processes, checksums from the recorded tree and its warm
unit cache, stored in one batch); 10% of the tests executed other functions of their
files this time, so posting lists really change. Finally 20 files are edited and
``fastci plan``'s analysis is timed in fresh processes (as
:mod:`bench.selection_synthetic` does at 10,000 x 50,000), and so is the
``fastci plan`` command itself, from outside.

Printed, one line each with its target: the store's size on disk (the starting
store and after the ingest; <= 1 GB), the ingest's wall time (<= 60 s; making the
trace files is the recorder's work and is not counted), the plan's
analysis time (<= 2 s, best of 3), the command's wall time end to end (for
information: it adds the interpreter's start, the imports, writing the 14 MB plan
and the summary; its plan must be the analysis' plan), and the peak RSS of each
step (each runs in its own process). Exit 1 when a target is missed.

``--scale small`` runs 10,000 tests x 50,000 units. The built repository and
starting store are cached under ``~/.cache/fastci/bench-scale/<key>`` (the key
covers the generator's parameters and the code that writes the store), so a
second run does not rebuild them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fastci" / "bench-scale"
#: Bump when the generator changes in a way its source digest would not show.
GENERATOR_VERSION = 2
SCALES: dict[str, dict[str, Any]] = {
    "large": {"files": 5000, "funcs": 100, "tests": 100_000, "files_per_test": 10,
              "funcs_per_test_file": 50, "contexts": 200, "changed_files": 20,
              "redrawn": 0.10, "seed": 7},
    "small": {"files": 500, "funcs": 100, "tests": 10_000, "files_per_test": 10,
              "funcs_per_test_file": 50, "contexts": 200, "changed_files": 20,
              "redrawn": 0.10, "seed": 7},
}
TARGET_STORE_BYTES = 1_000_000_000
TARGET_INGEST_S = 60.0
TARGET_PLAN_S = 2.0
OVER = "OVER TARGET"
_BLOCK = 5000  # tests generated at a time


def cache_key(p: dict[str, Any]) -> str:
    """The digest of the parameters, of the generator's code (not the report's) and of the
    code that writes the store."""
    import inspect

    from bench import selection_synthetic

    h = hashlib.sha256(json.dumps({**p, "v": GENERATOR_VERSION}, sort_keys=True).encode())
    for fn in (suite, build, _units, _path, _test, selection_synthetic._source):
        h.update(inspect.getsource(fn).encode())
    for rel in ("schema.py", "postings.py", "batch.py", "store.py"):
        h.update((REPO / "analyzer/fastci/evidence" / rel).read_bytes())
    return h.hexdigest()[:16]


def _drop_stale(cache: Path, scale: str, keep: Path) -> None:
    """Remove this scale's repos and stores built by other code (they are never reused)."""
    for old in cache.glob(f"{scale}-*"):
        if old != keep and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def _path(f: int) -> str:
    return f"src/m{f:04d}.py"


def _test(t: int) -> str:
    return f"//synthetic/t{t // 100:04d}:test_{t:06d}"


def suite(p: dict[str, Any], redraw: bool = False) -> Iterator[tuple[int, Any, Any]]:
    """Per test: (test index, its files, its unit indexes sorted), deterministic.

    Each test executes, in each of its files (a stride-7 cluster), the module unit
    and ``funcs_per_test_file - 1`` functions. With ``redraw`` a ``redrawn`` share of
    the tests picks other functions (the same files): a new recording.
    """
    import numpy as np

    per_file = p["funcs"] + 1
    rng = np.random.default_rng(p["seed"])
    firsts = rng.integers(0, p["files"], size=p["tests"])
    k = p["files_per_test"]
    for lo in range(0, p["tests"], _BLOCK):
        hi = min(lo + _BLOCK, p["tests"])
        block = np.random.default_rng([p["seed"], lo])
        keys = block.random((hi - lo, k, p["funcs"]))
        if redraw:
            other = np.random.default_rng([p["seed"], lo, 1])
            moved = other.random(hi - lo) < p["redrawn"]
            keys[moved] = other.random((int(moved.sum()), k, p["funcs"]))
        funcs = np.argpartition(keys, p["funcs_per_test_file"] - 1, axis=2)[
            :, :, :p["funcs_per_test_file"] - 1] + 1
        for i in range(hi - lo):
            files = (firsts[lo + i] + 7 * np.arange(k)) % p["files"]
            base = (files * per_file)[:, None]
            units = np.concatenate([base[:, 0], (base + funcs[i]).ravel()])
            units.sort()
            yield lo + i, files, units


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def _units(p: dict[str, Any], cache: Any = None) -> tuple[list[tuple[str, str]], list[str]]:
    """Every unit (id, checksum) in file order, and each file's sha256 (each file's
    index put into ``cache``, a :class:`~fastci.units.index.UnitCache`, if given)."""
    from bench.selection_synthetic import _source
    from fastci.units.index import FileUnits, index_source

    units: list[tuple[str, str]] = []
    digests = []
    for f in range(p["files"]):
        text = _source(f)
        idx = index_source(_path(f), text)
        assert isinstance(idx, FileUnits) and len(idx.units) == p["funcs"] + 1
        units.extend((u.id, u.checksum) for u in idx.units)  # <module> first, then f_0..
        digests.append(hashlib.sha256(text.encode()).hexdigest())
        if cache is not None:
            cache.put(_path(f), digests[-1], idx)
    return units, digests


def build(root: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Write the repo (base commit plus the uncommitted 20-file change) and the starting
    store ``root/base.db`` (bulk-loaded); return timings."""
    import random

    from bench.selection_synthetic import _source
    from fastci.evidence.record.environment import current_fingerprint
    from fastci.evidence.store.db import EvidenceStore

    from fastci.evidence.store.ingest import Checksums
    from fastci.integrations.git.repository import cache_dir
    from fastci.units.index import UnitCache

    t0 = time.perf_counter()
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    for f in range(p["files"]):
        (repo / _path(f)).write_text(_source(f))
    (repo / ".gitignore").write_text("/.fastci/\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "synthetic base")
    commit = _git(repo, "rev-parse", "HEAD")
    # The tree the new recording was made in (the base commit: the 20-file change comes
    # after it), and ingest's unit index cache of it, warm as on a main branch that
    # ingested before (a cold cache costs libcst indexing every file once).
    _git(repo, "worktree", "add", "-q", "--detach", str(root / "base-tree"), commit)
    caches = cache_dir(root / "base-tree")
    cache = UnitCache(caches / "units.cache")
    units, digests = _units(p, cache)
    cache.save()
    # What the recording needs of the index, so the ingest step does not index again.
    (root / "index.json").write_text(json.dumps({"units": [u for u, _ in units],
                                                 "digests": digests}))
    checksums = Checksums(root / "base-tree", caches=caches)
    for f in range(p["files"]):
        checksums.of(_path(f), digests[f])
    checksums.save()
    t_repo = time.perf_counter() - t0
    c = p["contexts"]

    files_of: list[list[int]] = []

    def rows() -> Iterator[tuple[int, int, tuple[int, int]]]:
        for t, files, us in suite(p):
            files_of.append(sorted(files.tolist()))
            for u in us.tolist():
                yield t, u, (u % c, (u + t) % c)

    t1 = time.perf_counter()
    fp = current_fingerprint()
    with EvidenceStore.open(root / "base.db", create=True) as store:
        # Each test's source files too, as an ingest of its recording leaves them (without
        # them the ingest on top writes a million rows a main-branch re-recording never
        # writes); bulk_load reads them after the evidence, which fills files_of.
        store.bulk_load([_test(t) for t in range(p["tests"])], units,
                        [f"ctx:{i}" for i in range(c)], rows(), env_fingerprint=fp,
                        recorded_at=1_700_000_000.0,
                        sources=((t, _path(f), digests[f])
                                 for t, files in enumerate(files_of) for f in files))
        store.conn.execute("UPDATE run SET commit_sha = ?", (commit,))
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stats = store.stats()
    t_store = time.perf_counter() - t1
    rng = random.Random(p["seed"])
    for n, f in enumerate(rng.sample(range(p["files"]), p["changed_files"])):
        text = _source(f, bump=rng.randrange(p["funcs"]))
        if n == 0:
            text = text.replace(f"OFFSET = {f}", f"OFFSET = {f + 1}")
        (repo / _path(f)).write_text(text)
    meta = {"commit": commit, "stats": stats, "repo_s": t_repo, "store_s": t_store,
            "fingerprint": fp, "build_rss_mb": _rss_mb()}
    (root / "meta.json").write_text(json.dumps(meta))
    return meta


def recording(p: dict[str, Any], fingerprint: str, index: dict[str, list[str]],
              clock: list[float]) -> Iterator[bytes]:
    """The new full-suite recording: one trace file's bytes per test, as the recorder
    writes them (format 2, no checksums), made as they are read; the time spent making
    them is added to ``clock[0]`` (the recorder's work, not ingest's). ``index``: every
    unit id and file digest, as the build step wrote them (``index.json``)."""
    import numpy as np

    from fastci.evidence.record import trace

    digests = index["digests"]
    quals = [uid.partition("::")[2] for uid in index["units"]]
    per_file = p["funcs"] + 1
    c = p["contexts"]
    sigs = [f"ctx:{i}" for i in range(c)]
    for t, _files, us in suite(p, redraw=True):
        t0 = time.perf_counter()
        msg = trace.Trace(format_version=trace.FORMAT_VERSION, test_id=_test(t), run_id="main-2",
                          complete=True, outcome="passed", role="main", started_at=1_700_003_600.0,
                          duration_s=1.0, gpus=1, workload_json="{}", overrides_json="{}")
        msg.environment.fingerprint = fingerprint
        # Each unit ran in {ctx:u%c, ctx:(u+t)%c}: the test's contexts, its distinct
        # sets of them, and each unit's set, as trace.ContextTable would number them.
        pair = np.stack([us % c, (us + t) % c], axis=1)
        pair.sort(axis=1)
        used = np.unique(pair)
        msg.contexts.extend([sigs[i] for i in used.tolist()])
        local = np.searchsorted(used, pair)
        distinct, unit_set = np.unique(local, axis=0, return_inverse=True)
        single = distinct[:, 0] == distinct[:, 1]
        msg.set_sizes = trace.u32(np.where(single, 1, 2).tolist())
        msg.set_contexts = trace.u32(np.concatenate(
            [row[:1] if one else row for row, one in zip(distinct, single)]).tolist())
        unit_set = unit_set.ravel()
        owner = us // per_file
        bounds = np.flatnonzero(np.diff(owner)) + 1
        for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(us)]):
            f = int(owner[lo])
            trace.write_file(msg.files, _path(f), digests[f],
                             zip([quals[u] for u in us[lo:hi].tolist()],
                                 unit_set[lo:hi].tolist()))
        data = trace.encode(msg)
        clock[0] += time.perf_counter() - t0
        yield data


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def traces_step(root: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Write the new recording's trace files into ``root/traces`` (the recorder's work:
    timed apart, never counted as ingest) and flush them to disk."""
    meta = json.loads((root / "meta.json").read_text())
    traces = root / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir()
    making = [0.0]
    size = 0
    index = json.loads((root / "index.json").read_text())
    for t, data in enumerate(recording(p, meta["fingerprint"], index, making)):
        (traces / f"{t:06d}.trace").write_bytes(data)
        size += len(data)
    os.sync()
    return {"gen_s": making[0], "trace_mb": size / 1e6}


def ingest_step(root: Path, p: dict[str, Any], jobs: int | None = None) -> dict[str, Any]:
    """Copy the starting store into the repo and ingest ``root/traces`` as ``fastci ingest
    DIR`` does (:func:`~fastci.evidence.fill.ingest_paths`: read, decode, merge into runs
    with checksums from the recorded tree and its unit cache, store in one batch).

    A process of its own, as ``fastci ingest`` is: the process that made the traces holds
    the unit index (505,000 names) and left 950 MB of dirty pages to write back, and
    timing the ingest there measured those too (68 s where a fresh process took 55 s).
    """
    from fastci.evidence.store.ingest import worker_count
    from fastci.evidence.fill import ingest_paths
    from fastci.evidence.store.db import EvidenceStore

    meta = json.loads((root / "meta.json").read_text())
    work = root / "repo" / ".fastci" / "evidence.db"
    work.parent.mkdir(parents=True, exist_ok=True)
    for stale in (work, Path(f"{work}-wal"), Path(f"{work}-shm")):
        stale.unlink(missing_ok=True)
    shutil.copyfile(root / "base.db", work)
    os.sync()
    traces = root / "traces"
    try:
        t0 = time.perf_counter()
        report, _ = ingest_paths(work, [traces], source="bazel", commit=meta["commit"],
                                 source_root=root / "base-tree", jobs=jobs)
        ingest_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(traces, ignore_errors=True)
    with EvidenceStore.open(work) as store:
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stats = store.stats()
    assert report.runs_added == p["tests"] and not report.corrupt, report
    return {"ingest_s": ingest_s, "runs": report.runs_added,
            "jobs": worker_count(jobs, p["tests"]), "stats": stats, "rss_mb": _rss_mb()}


def _child(step: str, root: Path, scale: str, jobs: int | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "analyzer"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    extra = [] if jobs is None else [f"--jobs={jobs}"]
    res = subprocess.run([sys.executable, "-m", "bench.store_scale", f"--step={step}",
                          f"--root={root}", f"--scale={scale}", *extra], cwd=REPO, env=env,
                         capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"bench.store_scale {step} failed:\n{res.stderr[-4000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def command_runs(root: Path, repeats: int = 3) -> list[dict[str, Any]]:
    """``fastci plan`` as a user runs it, timed from outside in fresh processes: the
    interpreter's start to its exit, the plan written (outside the repository, so its
    tree stays the one analysed) and the summary printed."""
    meta = json.loads((root / "meta.json").read_text())
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fastci-scale-plan-") as tmp:
        plan = Path(tmp) / "plan.json"
        for _ in range(repeats):
            began = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "fastci", "plan", "--no-bazel",
                                  "--base", meta["commit"], "--out", str(plan)],
                                 cwd=root / "repo", capture_output=True, text=True)
            wall = time.perf_counter() - began
            if res.returncode:
                raise RuntimeError(f"fastci plan exited {res.returncode}:\n{res.stderr[-4000:]}")
            written = json.loads(plan.read_text())
            out.append({"wall_s": wall, "mode": written["mode"], "selected": len(written["tests"])})
    return out


def _workers(jobs: int) -> str:
    return f"{jobs} worker processes merging the traces" if jobs else "merged in one process"


def _verdict(ok: bool) -> str:
    return "OK" if ok else OVER


def run(scale: str, cache: Path = CACHE, jobs: int | None = None) -> list[str]:
    """Build (or reuse) the synthetic repo and store, ingest, plan; the report lines."""
    from bench.selection_synthetic import measure

    p = SCALES[scale]
    root = cache / f"{scale}-{cache_key(p)}"
    lines = [f"== evidence store at scale ({scale}: {p['tests']:,} tests x "
             f"{p['files'] * (p['funcs'] + 1):,} units)"]
    if not (root / "meta.json").exists():
        if root.exists():
            shutil.rmtree(root)
        _drop_stale(cache, scale, root)
        root.mkdir(parents=True)
        t0 = time.perf_counter()
        meta = _child("build", root, scale)
        lines.append(f"  built in {time.perf_counter() - t0:.0f} s (repo and unit index "
                     f"{meta['repo_s']:.0f} s, bulk load {meta['store_s']:.0f} s; peak RSS "
                     f"{meta['build_rss_mb']:,.0f} MB), cached in {root}")
    else:
        meta = json.loads((root / "meta.json").read_text())
        lines.append(f"  reusing the cached repo and starting store in {root}")
    base = meta["stats"]
    pairs = base["evidence"]
    ing = {**_child("traces", root, scale), **_child("ingest", root, scale, jobs)}
    after = ing["stats"]
    size = max(base["bytes"], after["bytes"])
    lines += [
        f"  store: {pairs:,} (test, unit) pairs, {base['unit_version']:,} unit versions, "
        f"{base['ctxset']:,} context sets",
        f"  store size: {base['bytes'] / 1e6:,.0f} MB bulk-loaded, {after['bytes'] / 1e6:,.0f} MB "
        f"after the ingest ({after['bytes'] / max(after['evidence'], 1):.1f} bytes/pair; "
        f"target <= {TARGET_STORE_BYTES / 1e9:.0f} GB: {_verdict(size <= TARGET_STORE_BYTES)})",
        f"  ingest of one full-suite recording ({ing['runs']:,} runs, {after['evidence']:,} "
        f"pairs, {p['redrawn']:.0%} of the tests executing other functions): "
        f"{ing['ingest_s']:.1f} s from {ing['trace_mb']:,.0f} MB of trace files to the store, "
        f"{_workers(ing['jobs'])} (target <= {TARGET_INGEST_S:.0f} s: "
        f"{_verdict(ing['ingest_s'] <= TARGET_INGEST_S)}); +{ing['gen_s']:.1f} s making the "
        f"traces (the recorder's work, not counted); peak RSS {ing['rss_mb']:,.0f} MB",
    ]
    runs = measure(root)
    best = min(float(r["plan_s"]) for r in runs)
    r = runs[-1]
    cli = command_runs(root)
    cli_best = min(float(c["wall_s"]) for c in cli)
    same = all(c["mode"] == r["mode"] and c["selected"] == r["selected"] for c in cli)
    lines += [
        f"  plan ({p['changed_files']}-file change, {r['changed_units']} units changed; "
        f"{r['selected']:,} of {r['tests']:,} tests selected, mode {r['mode']}): "
        f"{', '.join('%.2f' % float(x['plan_s']) for x in runs)} s (best {best:.2f} s, target "
        f"<= {TARGET_PLAN_S:.0f} s: {_verdict(best <= TARGET_PLAN_S)}); +{float(r['import_s']):.2f} s "
        f"interpreter imports; peak RSS {float(r['peak_rss_mb']):,.0f} MB",
        f"  the `fastci plan` command end to end (interpreter start to exit, plan written, "
        f"summary printed): {', '.join('%.2f' % float(c['wall_s']) for c in cli)} s (best "
        f"{cli_best:.2f} s; the target is the analysis' line above, which leaves out the "
        f"interpreter's start, the imports, writing the plan and the summary)"
        + ("" if same else f"; {OVER}: its plan differs from the analysis': "
           + ", ".join(f"{c['mode']} with {c['selected']:,} tests" for c in cli)),
    ]
    return lines


def main(argv: list[str]) -> int:
    """``python -m bench store_scale [-- --scale small]``; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench.store_scale")
    parser.add_argument("--scale", choices=sorted(SCALES), default="large")
    parser.add_argument("--jobs", type=int, default=None,
                        help="fastci ingest --jobs (default: one worker per CPU)")
    parser.add_argument("--step", choices=["build", "traces", "ingest"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args, _unknown = parser.parse_known_args(argv)  # `python -m bench -- ...` passes all options
    if args.step:
        if args.step == "build":
            print(json.dumps(build(args.root, SCALES[args.scale])))
        elif args.step == "traces":
            print(json.dumps(traces_step(args.root, SCALES[args.scale])))
        else:
            print(json.dumps(ingest_step(args.root, SCALES[args.scale], args.jobs)))
        return 0
    lines = run(args.scale, jobs=args.jobs)
    for line in lines:
        print(line, flush=True)
    if any(OVER in line for line in lines):
        print("store scale benchmark FAILED: a target was missed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
