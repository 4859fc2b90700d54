"""Evidence benchmarks: recording overhead, unit indexing, ingest throughput, store size.

* Recording overhead: a microllm training run (the convergence test's model at 20
  steps; a small torch loop if microllm is absent) timed in fresh processes
  plain, under coverage.py alone, and under the FastCI recorder (start to
  stop, trace written). Target: recorder <= 1.3x plain. Medians of N
  alternating repeats are reported (ratios: the median of the per-repeat ratios), in wall time and in CPU time; the
  verdict uses CPU time because the 2-core machine is shared and wall
  times of the same run vary by 50%.
* Recording benchmark (``--recording`` runs only this): whole pytest runs, plain, under
  bare ``coverage run`` and recorded, 5 rounds with the modes alternating; ratios are
  medians of the per-round ratios of wall time (the machine's speed drifts between
  minutes): the example suite at its floors (target <= 1.15x plain; ``coverage run``
  follows its child processes as the recorder does) and CPU-light project tests
  (target: recorded <= 1.10x coverage run).
* ``--instructions``: the project-tests comparison counted in instructions executed
  (valgrind's callgrind, one run per mode), which repeat where wall times do not.
  Not part of ``make bench`` (valgrind makes each run ~50x slower).
* Both also time a *tracing floor*: coverage.py's C tracer on in the same
  processes but measuring no file (an empty source folder): the tracer's cost on
  Python 3.11 (``sys.settrace``) plus coverage.py's per-file decisions, which the
  recorder's engine mostly skips. The overhead benchmark also times that engine
  measuring no file (the *engine floor*), the tighter bound.
* Indexing the repo's units, cold and from the content-digest cache.
* Ingest: synthetic traces (30 files x 10 units x 3 contexts each) into a fresh
  store: traces/s and store bytes per test.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.3
REPEATS = 5
N_TRACES = 400

_WORKLOAD = r'''
import json, os, sys, time
from pathlib import Path
repo, mode, out, device = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
sys.path[:0] = [str(repo / "examples/microllm/tests"), str(repo / "examples/microllm")]
try:
    if device != "cpu":
        raise ImportError("microllm runs on CPU only")
    import harness
    from microllm.trainer import train
    w = dict(harness.load_suite()["convergence_test"]["workload"], train_iters=20)
    cfg = harness.config(w, lr=0.01, min_lr=0.001, warmup_iters=5)
    work, name = (lambda: train(cfg)), "microllm convergence model, 20 steps"
except ImportError:
    import torch
    sys.path.insert(0, str(out))
    from fallback_loop import loop
    w = {"steps": 200 if device == "cpu" else 100}
    work = lambda: loop(w["steps"], device)
    name = f"torch {'MLP' if device == 'cpu' else '6-layer transformer'} loop on {device}, {w['steps']} steps"
    repo = out
t0, c0 = time.perf_counter(), time.process_time()
if mode in ("coverage", "floor"):
    # floor: coverage.py's C tracer on, measuring no file (an empty source folder).
    import coverage
    src = out / "empty-source" if mode == "floor" else repo
    src.mkdir(exist_ok=True)
    cov = coverage.Coverage(data_file=None, config_file=False, source=[str(src)])
    cov.start()
elif mode == "engine-floor":
    # the recorder's own coverage engine (its fast per-file decisions) measuring no file
    from fastci.evidence.record.covplugin import make_coverage
    from fastci.evidence.record.recorder import _OMIT
    (out / "empty-source").mkdir(exist_ok=True)
    cov = make_coverage([str(out / "empty-source")], list(_OMIT), contexts=False)
    cov.start()
elif mode == "recorder":
    from fastci.evidence.record.recorder import Recorder
    rec = Recorder("bench", out / "traces", repo_root=repo, workload=w, gpus=0)
    rec.start()
work()
if mode in ("coverage", "floor", "engine-floor"):
    cov.stop(); cov.get_data()
elif mode == "recorder":
    rec.stop("passed")
print(json.dumps({"s": time.perf_counter() - t0, "cpu": time.process_time() - c0, "name": name}))
'''

_FALLBACK = '''
import torch

def step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()

def loop(n, device="cpu"):
    torch.manual_seed(0)
    if device == "cpu":
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        x, y = torch.randn(32, 64), torch.randn(32, 64)
    else:
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 6).to(device)
        x = torch.randn(16, 256, 512, device=device)
        y = torch.randn(16, 256, 512, device=device)
    opt = torch.optim.AdamW(model.parameters())
    return [step(model, opt, x, y) for _ in range(n)]
'''


#: The verdict of a measurement over its target; any makes the benchmark exit 1.
OVER_TARGET = "OVER TARGET"


def overhead(work: Path, device: str = "cpu") -> list[str]:
    """Time the workload plain / coverage / recorder in fresh processes."""
    (work / "fallback_loop.py").write_text(_FALLBACK)
    (work / "wl.py").write_text(_WORKLOAD)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    times: dict[str, list[float]] = {"plain": [], "floor": [], "engine-floor": [], "coverage": [],
                                     "recorder": []}
    cpu: dict[str, list[float]] = {m: [] for m in times}
    name = ""
    for _ in range(REPEATS):
        for mode in times:
            res = subprocess.run([sys.executable, str(work / "wl.py"), str(REPO), mode, str(work),
                                  device],
                                 capture_output=True, text=True, env=env, check=True)
            data = json.loads(res.stdout.strip().splitlines()[-1])
            times[mode].append(data["s"])
            cpu[mode].append(data["cpu"])
            name = data["name"]
    med = {m: statistics.median(v) for m, v in times.items()}
    med_cpu = {m: statistics.median(v) for m, v in cpu.items()}

    def ratio_of(series: dict[str, list[float]], a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(series[a], series[b]))

    ratio = ratio_of(cpu, "recorder", "plain")
    verdict = "OK" if ratio <= TARGET else OVER_TARGET
    return [f"recording overhead ({name}; median of {REPEATS}, one intra-op thread):",
            "  wall: " + ", ".join(f"{m} {med[m]:.2f} s" for m in times)
            + f"; recorder / plain = {ratio_of(times, 'recorder', 'plain'):.2f}x",
            "  CPU:  " + ", ".join(f"{m} {med_cpu[m]:.2f} s" for m in times),
            f"  recorder / plain = {ratio:.2f}x CPU (target <= {TARGET}x: {verdict}); "
            f"recorder / coverage alone = {ratio_of(cpu, 'recorder', 'coverage'):.2f}x; "
            f"floor (coverage.py's tracer on, measuring no file) / plain = "
            f"{ratio_of(cpu, 'floor', 'plain'):.2f}x; engine floor (the recorder's own "
            f"coverage engine measuring no file) / plain = "
            f"{ratio_of(cpu, 'engine-floor', 'plain'):.2f}x"]


#: Recording the example suite at its floors: at most this times the plain run's wall time.
SUITE_TARGET = 1.15
#: Recording the project's own tests: at most this times bare ``coverage run``'s wall time.
PROJECT_TARGET = 1.10
SUITE_REPEATS = 5
#: CPU-light tests of the project itself that need no Bazel (units, changes, selection).
PROJECT_TESTS = ("tests/test_units.py", "tests/test_changes.py", "tests/test_select.py")


def _failed(cmd: list[str], res: subprocess.CompletedProcess[str]) -> RuntimeError:
    """The error for a benchmarked command that failed: its exit code and last lines."""
    tail = (res.stdout + res.stderr).strip().splitlines()[-3:]
    return RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {' | '.join(tail)}")


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (its processes, children included) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise _failed(cmd, res)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


class _Rounds:
    """Each mode's (wall, CPU) seconds per round; the modes alternate within a round.

    This machine's speed drifts by 20 % and more between minutes, so a ratio is the
    median of the per-round ratios (the two runs of a round ran a minute apart), not the
    ratio of the medians. The medians are printed as they are.
    """

    def __init__(self, modes: dict[str, list[str]], env: dict[str, str],
                 mode_env: dict[str, dict[str, str]] | None = None) -> None:
        self.times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
        for _ in range(SUITE_REPEATS):
            for mode, cmd in modes.items():
                self.times[mode].append(_run(cmd, {**env, **(mode_env or {}).get(mode, {})}))

    def wall(self, mode: str) -> float:
        return statistics.median(w for w, _ in self.times[mode])

    def ratio(self, a: str, b: str, *, cpu: bool = False) -> float:
        k = 1 if cpu else 0
        return statistics.median(x[k] / y[k] for x, y in zip(self.times[a], self.times[b]))


_ENGINE_FLOOR_PLUGIN = '''
"""pytest plug-in of the recording benchmark: the recorder's coverage engine on from
before the initial conftests to the end of the session, measuring no file."""
import os

import pytest

_COV = None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    global _COV
    from fastci.evidence.record.covplugin import make_coverage
    from fastci.evidence.record.recorder import _OMIT

    _COV = make_coverage([os.environ["FASTCI_BENCH_EMPTY"]], list(_OMIT), contexts=False)
    _COV.start()


def pytest_unconfigure(config):
    if _COV is not None:
        _COV.stop()
'''


def recording(work: Path) -> list[str]:
    """Whole pytest runs, plain, under ``coverage run`` and recorded (see :class:`_Rounds`).

    (a) the example suite at its floors (``examples/microllm/tests --at-floors``),
    plain vs ``--fastci-record``: target <= :data:`SUITE_TARGET` x plain;
    (b) :data:`PROJECT_TESTS` plain, under bare ``coverage run -m pytest`` and
    recorded: target recorded <= :data:`PROJECT_TARGET` x coverage run.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1")
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    lines = [f"recording benchmark (whole pytest runs, {SUITE_REPEATS} rounds, the modes "
             f"alternating in each; ratios are medians of the per-round ratios of wall "
             f"time; one intra-op thread):"]
    suite = [*pytest, "examples/microllm/tests", "--at-floors"]
    # The suite starts Python child processes (a CLI run, gloo ranks), which the
    # recorder records too: the like-for-like floor is coverage.py measuring the
    # same processes (``patch = subprocess``, coverage.py >= 7.10), lines only.
    rc = work / "coveragerc-children"
    rc.write_text(f"[run]\npatch = subprocess\nparallel = true\n"
                  f"data_file = {work / 'suite-cov' / 'data'}\nsource = {REPO}\n"
                  "omit =\n    */.venv/*\n    */site-packages/*\n    */dist-packages/*\n")
    (work / "suite-cov").mkdir(exist_ok=True)
    # The floor of any recorder built on Python 3.11's sys.settrace: coverage.py's C
    # tracer on in the same processes, measuring no file (an empty source folder).
    empty = work / "empty-source"
    empty.mkdir(exist_ok=True)
    floor_rc = work / "coveragerc-floor"
    floor_rc.write_text(rc.read_text().replace(f"source = {REPO}", f"source = {empty}"))
    # The tighter floor: the recorder's own engine measuring no file, in the pytest
    # process only (its children run untraced, so this is below the true floor).
    (work / "fastci_bench_engine_floor.py").write_text(_ENGINE_FLOOR_PLUGIN)
    engine_env = {"PYTHONPATH": os.pathsep.join(filter(None, [
        str(work), os.environ.get("PYTHONPATH", "")])), "FASTCI_BENCH_EMPTY": str(empty)}
    r = _Rounds({"plain": suite,
                 "engine-floor": [*suite, "-p", "fastci_bench_engine_floor"],
                 "floor": [sys.executable, "-m", "coverage", "run", f"--rcfile={floor_rc}",
                           "-m", "pytest", *suite[3:]],
                 "coverage": [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}",
                              "-m", "pytest", *suite[3:]],
                 "recorded": [*suite, "--fastci-record", "--fastci-trace-dir",
                              str(work / "suite-traces")]}, env, {"engine-floor": engine_env})
    ratio = r.ratio("recorded", "plain")
    lines.append(f"  example suite at floors: median wall plain {r.wall('plain'):.2f} s, coverage "
                 f"run with its child processes {r.wall('coverage'):.2f} s, recorded "
                 f"{r.wall('recorded'):.2f} s; per round: coverage run "
                 f"{r.ratio('coverage', 'plain'):.2f}x plain, recorded {ratio:.2f}x plain "
                 f"({r.ratio('recorded', 'plain', cpu=True):.2f}x in CPU time), "
                 f"{r.ratio('recorded', 'coverage'):.2f}x coverage run; tracing floor "
                 f"{r.ratio('floor', 'plain'):.2f}x plain, engine floor of the pytest process "
                 f"alone {r.ratio('engine-floor', 'plain'):.2f}x plain "
                 f"(target <= {SUITE_TARGET}x plain: "
                 f"{'OK' if ratio <= SUITE_TARGET else OVER_TARGET})")
    own = [*pytest, *PROJECT_TESTS]
    r = _Rounds({"plain": own,
                 "floor": [sys.executable, "-m", "coverage", "run", f"--source={empty}",
                           f"--data-file={work / 'floor.data'}", "-m", "pytest", *own[3:]],
                 "coverage": [sys.executable, "-m", "coverage", "run",
                              f"--data-file={work / 'cov.data'}", "-m", "pytest", *own[3:]],
                 "recorded": [*own, "--fastci-record", "--fastci-trace-dir",
                              str(work / "own-traces")]}, env)
    ratio = r.ratio("recorded", "coverage")
    lines.append(f"  project tests ({' '.join(PROJECT_TESTS)}): median wall plain "
                 f"{r.wall('plain'):.2f} s, coverage run {r.wall('coverage'):.2f} s, recorded "
                 f"{r.wall('recorded'):.2f} s; per round: coverage run "
                 f"{r.ratio('coverage', 'plain'):.2f}x plain, recorded "
                 f"{r.ratio('recorded', 'plain'):.2f}x plain, {ratio:.2f}x coverage run "
                 f"({r.ratio('recorded', 'coverage', cpu=True):.2f}x in CPU time); tracing "
                 f"floor {r.ratio('floor', 'plain'):.2f}x plain "
                 f"(target <= {PROJECT_TARGET}x coverage run: "
                 f"{'OK' if ratio <= PROJECT_TARGET else OVER_TARGET})")
    return lines


def _instructions(cmd: list[str], env: dict[str, str]) -> int:
    """Instructions one command's main process executes, counted by valgrind's callgrind
    (child processes are not followed: here they are git calls, the same in every mode)."""
    res = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
                         cwd=REPO, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", res.stderr)
    if res.returncode != 0 or found is None:
        raise _failed(["valgrind", *cmd], res)
    return int(found.group(1))


def instructions(work: Path) -> list[str]:
    """The project-tests comparison of :func:`recording`, in instructions executed.

    Wall times of one command move by 20 % and more between minutes on a shared
    machine; the instructions a run executes repeat to within a fraction of a percent,
    so this is the steadier ratio (valgrind makes each run ~50x slower: one run per
    mode, two at a time). Cache misses and system time are not in it.
    """
    if shutil.which("valgrind") is None:
        return ["instructions benchmark: valgrind is not installed; skipped"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    own = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PROJECT_TESTS]
    modes = {"plain": own,
             "coverage": [sys.executable, "-m", "coverage", "run",
                          f"--data-file={work / 'icov.data'}", "-m", "pytest", *own[3:]],
             "recorded": [*own, "--fastci-record", "--fastci-trace-dir", str(work / "i-traces")]}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {m: pool.submit(_instructions, cmd, env) for m, cmd in modes.items()}
        count = {m: f.result() for m, f in futures.items()}
    ratio = count["recorded"] / count["coverage"]
    return [f"  project tests in instructions (valgrind callgrind, main process): plain "
            f"{count['plain'] / 1e9:.2f} G, coverage run {count['coverage'] / 1e9:.2f} G "
            f"({count['coverage'] / count['plain']:.2f}x plain), recorded "
            f"{count['recorded'] / 1e9:.2f} G ({count['recorded'] / count['plain']:.2f}x plain, "
            f"{ratio:.2f}x coverage run; target <= {PROJECT_TARGET}x coverage run: "
            f"{'OK' if ratio <= PROJECT_TARGET else OVER_TARGET})"]


def indexing(work: Path) -> list[str]:
    """Index the repository's units cold and from the cache."""
    from fastci.units.index import UnitCache, index_tree, iter_python_files

    files = list(iter_python_files(REPO))
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    t0 = time.perf_counter()
    index_tree(REPO)
    cold = time.perf_counter() - t0
    cache = UnitCache(work / "units.cache")
    index_tree(REPO, cache=cache)
    cache.save()
    warm_cache = UnitCache(work / "units.cache")
    t0 = time.perf_counter()
    index_tree(REPO, cache=warm_cache)
    warm = time.perf_counter() - t0
    return [f"indexing the repo's units: {len(files)} files, {lines:,} lines: cold {cold:.2f} s "
            f"({lines / cold:,.0f} lines/s); from the digest cache {warm:.3f} s"]


def ingest_speed(work: Path) -> list[str]:
    """Ingest synthetic traces into a fresh store."""
    from fastci.evidence.record import trace
    from fastci.evidence.store.ingest import find_traces, ingest
    from fastci.evidence.store.db import EvidenceStore

    tdir = work / "traces_synth"
    tdir.mkdir()
    for n in range(N_TRACES):
        t = trace.Trace(format_version=trace.FORMAT_VERSION, test_id=f"//bench:t{n}",
                        run_id=f"r{n}", complete=True, outcome="passed", role="main",
                        started_at=1000.0 + n, duration_s=3.0, gpus=1, workload_json="{}")
        t.environment.fingerprint = "env"
        t.contexts.extend([f"args(x=T(bf16,2d,cpu,s))|caller=c{k}|tp={n % 4}" for k in range(3)])
        for f in range(30):
            ft = t.files.add(path=f"pkg/m{(n + f * 7) % 200}.py", digest="d")
            ft.line_deltas.extend([1] * 40)
            for u in range(10):
                ft.units.add(qualname=f"f{u}", checksum=f"c{u}", contexts=[0, 1, 2])
        trace.write_atomic(tdir / trace.file_name(t.test_id, t.run_id, n), t)
    db = work / "evidence.db"
    t0 = time.perf_counter()
    with EvidenceStore.open(db, create=True) as store:
        ingest(store, find_traces([tdir]), source="bazel", commit=None)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stats = store.stats()
    secs = time.perf_counter() - t0
    return [f"ingest: {N_TRACES} traces x 300 units in {secs:.2f} s "
            f"({N_TRACES / secs:,.0f} traces/s); store {stats['bytes'] / 1e6:.1f} MB = "
            f"{stats['bytes'] / N_TRACES / 1e3:.1f} kB per test "
            f"({stats['evidence']:,} evidence rows)"]


def main(argv: list[str]) -> int:
    """Run every evidence benchmark and print the report (``--cuda``: overhead on a GPU;
    ``--recording``: only the whole-suite recording benchmark, :func:`recording`;
    ``--instructions``: only its project-tests comparison counted in instructions,
    :func:`instructions`, which needs valgrind).

    Returns 1 when a recording overhead is over its target, else 0.
    """
    with tempfile.TemporaryDirectory(prefix="fastci-bench-evidence-") as tmp:
        work = Path(tmp)
        if "--cuda" in argv:
            lines = overhead(work, "cuda")
        elif "--recording" in argv:
            lines = recording(work)
        elif "--instructions" in argv:
            lines = instructions(work)
        else:
            lines = overhead(work) + recording(work) + indexing(work) + ingest_speed(work)
    for line in lines:
        print(line)
    code = exit_code(lines)
    if code:
        print("evidence benchmark FAILED: a recording overhead is over its target",
              file=sys.stderr)
    return code


def exit_code(lines: list[str]) -> int:
    """1 when a measurement missed its target (a line says ``OVER TARGET``), else 0."""
    return 1 if any(OVER_TARGET in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
