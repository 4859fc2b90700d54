"""``make gpu-check``: FastCI measured on one GPU, in one prepared run (no network, no Bazel).

Run on the GPU host from the repository root, after ``tools/gpu_check/run.sh`` installed the
carried wheels (``make gpu-wheels`` downloads them here into ``.whl/``)::

    python3 tools/gpu_check/check.py                 # the real check (needs a visible GPU)
    python3 tools/gpu_check/check.py --device cpu --smoke   # CPU smoke of every stage: NOT the check

Stages, each with a time budget printed next to what it took (the whole check is sized for
8 minutes on one H100):

1. ``probe``      card, driver, torch, CUDA; stops at once, one line, exit 3, without a GPU.
2. ``references`` records the per-device references this device lacks (the golden curve and
                  the throughput floor, at full workload) and copies them to
                  ``<out>/references/`` to be committed.
3. ``floors``     every example test once at its floors on the device (pytest route); all pass.
   ``reach``      the recorder's device cases (``tests/test_record_reach.py``): autograd's
                  multithreading off while recording, and an edited custom ``backward`` run
                  on the device selecting its test; the ``[cuda]`` case must run, not skip.
4. ``record``     the subset (>= 6 reducible tests: TP, PP, DP, checkpointing, KV cache,
                  golden) recorded at full workload into a scratch repository's evidence store.
5. ``blind_spot`` an edit to the custom ``autograd.Function.backward`` of microllm's TP copy
                  (bench change 06) must select every TP test of the subset.
6. ``overhead``   a CUDA training test, plain and recorded, alternating: in-test seconds.
7. ``calibrate``  ``fastci calibrate --no-bazel`` of the subset.
8. ``plans``      ``fastci eval`` of real bench changes (06, 02, 03) on the subset:
                  GPU-seconds of the reduced runs against the same tests at full workload
                  (per test, in sum), escapes, CI latency.

No stage starts after ``--deadline-s`` (500 s), and the results are written after every
stage, so a run cut short by the device's 10-minute limit keeps what it measured.

Writes ``<out>/results.json`` and ``<out>/results.md`` (card, driver, torch, date). Exit 0:
every stage passed and nothing escaped; 1: a stage failed; 3: no GPU (the real check only).
The smoke mode runs the same code on CPU with fewer tests and is labelled as a smoke in every
output: its numbers are CPU numbers and never stand for the GPU's.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
SUITE_DIR = Path("examples/microllm/tests")
SUITE_FILE = SUITE_DIR / "suite.bzl"
#: Reducible tests spanning TP, PP, DP, checkpointing, the KV cache and a golden.
SUBSET = ("tp_parity_test", "pp_parity_test", "dp_parity_test", "checkpoint_resume_test",
          "kv_cache_decode_test", "golden_loss_test")
#: Real changes whose plans are measured (bench/changes); 06 is the autograd blind spot.
CHANGES = ("06_tp_backward_missing_allreduce", "02_rotary_cache_off_by_one",
           "03_checkpoint_rng_not_restored")
BLIND_SPOT = "06_tp_backward_missing_allreduce"
#: Tests whose references are per device (harness.reference_path): recorded at full workload.
REFERENCED = ("golden_loss_test", "throughput_test")
#: The CUDA training test whose recording overhead is measured.
OVERHEAD_TEST = "tp_parity_test"
#: Seconds per stage, sized for one H100 (8 minutes in all).
BUDGET_S = {"probe": 15, "references": 30, "floors": 90, "reach": 30, "record": 45,
            "blind_spot": 20, "calibrate": 120, "plans": 120, "overhead": 40}
#: The recorder's cases that need the device (issue 32: autograd's device threads).
REACH_TESTS = ("tests/test_record_reach.py", "-k", "custom_backward or autograd_multithreading")
TARGETS = {"reduced_over_full": 0.33, "recording_over_plain": 1.15, "escapes": 0}
#: No stage starts later than this (seconds from the start): a command there may run 600 s.
DEADLINE_S = 500.0
NO_GPU_EXIT = 3


#: What FastCI's pytest route imports that a bare GPU host may lack (make gpu-wheels carries them).
REQUIRED_MODULES = ("libcst", "yaml", "google.protobuf", "coverage", "pytest")


class StageFailed(Exception):
    """A stage could not do what it checks; the message is its one-line reason."""


class NoGpu(StageFailed):
    """The real check was started on a host without a visible GPU."""


@dataclass
class Ctx:
    """What every stage shares."""

    root: Path
    out: Path
    device: str
    smoke: bool
    tests: tuple[str, ...]
    changes: tuple[str, ...]
    pairs: int
    python: str = sys.executable
    results: dict[str, Any] = field(default_factory=dict)
    scratch: Path | None = None
    ends_at: float = float("inf")  # time.perf_counter() past which nothing may still run

    def left(self, wanted: float) -> float:
        """A command's timeout: ``wanted``, cut to what is left of the whole run (>= 10 s)."""
        return max(10.0, min(wanted, self.ends_at - time.perf_counter()))

    def env(self, cwd: Path | None = None, **extra: str) -> dict[str, str]:
        """The environment of every command: this tree's fastci first on the path.

        microllm is not put there: the suite's harness imports the microllm beside it, so a
        change's scratch worktree (``fastci eval``) tests its own code, not this tree's.
        """
        base = cwd or self.root
        env = dict(os.environ)
        paths = [str(base / "analyzer")]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])  # the carried wheels (run.sh) stay importable
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the smoke never touches a GPU, even on a GPU host
        env.update(extra)
        return env


@dataclass(frozen=True)
class Ran:
    """One command's exit status, output and wall seconds."""

    rc: int
    out: str
    seconds: float


def run(cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float) -> Ran:
    """Run ``cmd``; a timeout is rc 124 with what it printed so far."""
    began = time.perf_counter()
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace",
                              timeout=timeout, check=False)
        return Ran(proc.returncode, proc.stdout, time.perf_counter() - began)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return Ran(124, out + f"\n(timed out after {timeout:.0f}s)", time.perf_counter() - began)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def load_suite(root: Path) -> dict[str, dict[str, Any]]:
    """The ``SUITE`` literal of suite.bzl (the example's one source of truth)."""
    tree = ast.parse((root / SUITE_FILE).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SUITE"
                                                for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise StageFailed(f"{SUITE_FILE}: no SUITE literal")


def node_ids(root: Path, names: Sequence[str]) -> list[str]:
    """pytest node ids of the named suite tests (one ``test_*`` function per file)."""
    ids = []
    for name in names:
        path = root / SUITE_DIR / f"{name}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        funcs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        if len(funcs) != 1:
            raise StageFailed(f"{path}: expected one test function, found {funcs}")
        ids.append(f"{SUITE_DIR / name}.py::{funcs[0]}")
    return ids


def tp_tests(suite: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """The tests among ``names`` whose declared workload runs tensor parallelism (tp > 1)."""
    return [n for n in names if int(suite[n]["workload"].get("tp", 1)) > 1]


def seconds(row: Mapping[str, Any]) -> float:
    """A result line's in-test seconds (setup, call and teardown; no interpreter start)."""
    if "duration_s" not in row:
        raise StageFailed(f"a --fastci-results line without duration_s: {sorted(row)}")
    return float(row["duration_s"])


def read_result_lines(path: Path) -> list[dict[str, Any]]:
    """The plugin's ``--fastci-results`` lines (id, outcome, duration, workload, overrides)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --------------------------------------------------------------------------- stages


def stage_probe(ctx: Ctx) -> dict[str, Any]:
    """Card, driver, torch and CUDA versions; the caller stops at once when there is no GPU."""
    code = ("import json, torch; ok = torch.cuda.is_available(); "
            "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'available': ok, "
            "'count': torch.cuda.device_count() if ok else 0, "
            "'name': torch.cuda.get_device_name(0) if ok else ''}))")
    got = run([ctx.python, "-c", code], cwd=ctx.root, env=ctx.env(), timeout=60)
    if got.rc != 0:
        raise StageFailed(f"python cannot import torch: {last_line(got.out)}")
    info = json.loads(last_line(got.out))
    if ctx.device == "cuda" and not info["available"]:
        raise NoGpu("no GPU visible (torch.cuda.is_available() is False): make gpu-check runs only on a GPU host")
    driver, card = "", info["name"]
    smi = shutil.which("nvidia-smi")
    if smi and ctx.device == "cuda":
        q = run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                cwd=ctx.root, env=os.environ, timeout=30)
        if q.rc == 0 and q.out.strip():
            parts = [p.strip() for p in q.out.strip().splitlines()[0].split(",")]
            card, driver = parts[0], parts[1] if len(parts) > 1 else ""
    if ctx.device == "cpu":
        card, driver = "CPU smoke (not the GPU check)", ""
    code = ("import importlib.util as u, json; print(json.dumps([m for m in %r if u.find_spec(m) is None]))"
            % (REQUIRED_MODULES,))
    found = run([ctx.python, "-c", code], cwd=ctx.root, env=ctx.env(), timeout=60)
    missing = json.loads(last_line(found.out)) if found.rc == 0 else list(REQUIRED_MODULES)
    return {"card": card, "driver": driver, "torch": info["torch"], "cuda": info["cuda"],
            "gpus": info["count"], "cuda_available": info["available"],
            "git": shutil.which("git") or "", "missing_modules": missing,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": sys.version.split()[0]}


def stage_references(ctx: Ctx) -> dict[str, Any]:
    """Record the references this device lacks (at full workload) and keep copies to commit."""
    if ctx.device == "cpu":
        return {"recorded": [], "note": "CPU references are committed; none recorded"}
    recorded = []
    for name in REFERENCED:
        path = ctx.root / SUITE_DIR / "golden" / f"{name}.{ctx.device}.json"
        if path.is_file():
            continue
        env = ctx.env(MICROLLM_REGEN_GOLDEN="1")
        for var in ("CI", "TEST_TARGET", "BAZEL_TEST"):
            env.pop(var, None)  # recording is refused under CI/Bazel: this run is by hand
        got = run([ctx.python, str(SUITE_DIR / f"{name}.py")], cwd=ctx.root, env=env, timeout=ctx.left(300))
        if got.rc != 0 or not path.is_file():
            raise StageFailed(f"recording {path.name} failed: {last_line(got.out)}")
        keep = ctx.out / "references"
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, keep / path.name)
        recorded.append(str(path.relative_to(ctx.root)))
    return {"recorded": recorded,
            "note": ("no reference was missing" if not recorded else
                     "recorded now on this device (commit them from <out>/references/): "
                     "the floors below compare against a reference this same run made")}


def stage_floors(ctx: Ctx) -> dict[str, Any]:
    """Every example test (the subset in the smoke) once at its floors: all must pass."""
    names = ctx.tests if ctx.smoke else tuple(sorted(load_suite(ctx.root)))
    lines = ctx.out / "floors.jsonl"
    lines.unlink(missing_ok=True)
    got = run([ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "fastci.pytest.plugin", "--fastci-results", str(lines),
               *node_ids(ctx.root, names), "--at-floors"],
              cwd=ctx.root, env=ctx.env(), timeout=ctx.left(600))
    rows = read_result_lines(lines)
    by_test = {r["id"].split("/")[-1].split(".py")[0]: {"outcome": r.get("outcome"),
                                                      "seconds": round(seconds(r), 3)}
               for r in rows}
    failed = sorted(t for t, r in by_test.items() if r["outcome"] != "passed")
    missing = sorted(set(names) - set(by_test))
    result = {"tests": len(names), "passed": len(by_test) - len(failed), "failed": failed,
              "missing": missing, "per_test": by_test, "pytest": last_line(got.out)}
    if got.rc != 0 or failed or missing:
        ctx.results["floors"] = result
        raise StageFailed(f"at floors: {len(failed)} failed {failed[:5]}, {len(missing)} not run "
                          f"({last_line(got.out)})")
    return result


def stage_reach(ctx: Ctx) -> dict[str, Any]:
    """The recorder sees what autograd runs on the device: the switch and the custom-backward
    cases of ``tests/test_record_reach.py``, run here (``[cuda]`` must run on a GPU)."""
    got = run([ctx.python, "-m", "pytest", "-v", "-p", "no:cacheprovider", *REACH_TESTS],
              cwd=ctx.root, env=ctx.env(), timeout=ctx.left(180))
    return reach_outcome(got.rc, got.out, need_cuda=not ctx.smoke)


def reach_outcome(rc: int, out: str, *, need_cuda: bool) -> dict[str, Any]:
    """Each case's verdict from pytest's ``-v`` lines; raises when one failed, or when the
    device case did not run where it must."""
    verdicts = {}
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        if "::" in head and rest.split(" ")[0] in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            verdicts[head.split("::", 1)[1]] = rest.split(" ")[0]
    cuda = {k: v for k, v in verdicts.items() if k.endswith("[cuda]")}
    if rc not in (0,) or not verdicts or any(v in ("FAILED", "ERROR") for v in verdicts.values()):
        raise StageFailed(f"the recorder's device cases failed: {last_line(out)}")
    if need_cuda and (not cuda or any(v != "PASSED" for v in cuda.values())):
        raise StageFailed(f"the [cuda] case did not run on the device: {cuda or 'absent'}")
    return {"cases": verdicts}


def _git(ctx: Ctx, *args: str, cwd: Path | None = None, timeout: float = 120) -> Ran:
    env = ctx.env(GIT_AUTHOR_NAME="gpu-check", GIT_AUTHOR_EMAIL="gpu-check@localhost",
                  GIT_COMMITTER_NAME="gpu-check", GIT_COMMITTER_EMAIL="gpu-check@localhost")
    got = run(["git", *args], cwd=cwd or ctx.scratch or ctx.root, env=env, timeout=timeout)
    if got.rc != 0:
        raise StageFailed(f"git {' '.join(args[:2])} failed: {last_line(got.out)}")
    return got


_SKIP = {".git", ".venv", ".venv-buildgrid", ".whl", "build", "__pycache__", ".pytest_cache",
         ".mypy_cache", ".hypothesis"}


def make_scratch(ctx: Ctx) -> Path:
    """A git repository holding this tree (the device's copy may have no ``.git``)."""
    if not shutil.which("git"):
        raise StageFailed("git is not installed on this host: plans need a base commit")
    dest = ctx.out / "repo"
    if dest.exists():
        shutil.rmtree(dest)

    def ignore(directory: str, names: list[str]) -> set[str]:
        rel = Path(directory).resolve().relative_to(ctx.root)
        skip = {n for n in names if n in _SKIP or n.startswith("bazel-")}
        if rel == Path(".fastci"):
            skip |= {n for n in names if n != "BUILD.bazel"}  # no store, plan or runs of this host
        return skip

    shutil.copytree(ctx.root, dest, ignore=ignore, symlinks=True)
    # pytest's default collection is what `fastci eval` takes as the universe: the example's
    # suite here, not FastCI's own tests (pyproject's testpaths).
    pyproject = dest / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    if 'testpaths = ["tests"]' not in text:
        raise StageFailed("pyproject.toml: no testpaths = [\"tests\"] to point at the example suite")
    pyproject.write_text(text.replace('testpaths = ["tests"]', f'testpaths = ["{SUITE_DIR}"]'), encoding="utf-8")
    ctx.scratch = dest
    _git(ctx, "init", "-q")
    _git(ctx, "add", "-A")
    _git(ctx, "commit", "-q", "-m", "gpu-check base")
    return dest


def stage_record(ctx: Ctx) -> dict[str, Any]:
    """Record the subset at full workload on the device; ingest into the scratch store."""
    scratch = make_scratch(ctx)
    traces = ctx.out / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    lines = ctx.out / "record.jsonl"
    lines.unlink(missing_ok=True)
    got = run([ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "fastci.pytest.plugin", "--fastci-record",
               "--fastci-trace-dir", str(traces), "--fastci-results", str(lines),
               *node_ids(scratch, ctx.tests)], cwd=scratch, env=ctx.env(scratch), timeout=ctx.left(600))
    rows = read_result_lines(lines)
    failed = [r["id"] for r in rows if r.get("outcome") != "passed"]
    if got.rc != 0 or failed or len(rows) != len(ctx.tests):
        raise StageFailed(f"recording the subset: {len(rows)} ran, failed {failed} ({last_line(got.out)})")
    ing = run([ctx.python, "-m", "fastci", "ingest", str(traces), "--source", "pytest"],
              cwd=scratch, env=ctx.env(scratch), timeout=ctx.left(300))
    if ing.rc != 0:
        raise StageFailed(f"fastci ingest failed: {last_line(ing.out)}")
    in_test = sum(seconds(r) for r in rows)
    # How much of the recorded run is the tests' own work, not interpreter start and imports:
    # the declared full workload should dominate on the GPU (sizing evidence for suite.bzl).
    return {"tests": list(ctx.tests), "workload": "declared (full)", "device": ctx.device,
            "seconds": {r["id"]: round(seconds(r), 3) for r in rows},
            "process_s": round(got.seconds, 3), "in_test_s": round(in_test, 3),
            "in_test_share": round(in_test / got.seconds, 3) if got.seconds else None,
            "ingest": last_line(ing.out)}


def stage_blind_spot(ctx: Ctx) -> dict[str, Any]:
    """Bench change 06 edits ``_CopyToTP.backward``: every TP test of the subset must run."""
    assert ctx.scratch is not None
    patch = ctx.scratch / "bench" / "changes" / f"{BLIND_SPOT}.patch"
    _git(ctx, "apply", str(patch))
    plan = ctx.out / "blind_spot_plan.json"
    try:
        got = run([ctx.python, "-m", "fastci", "plan", "--no-bazel", "--worktree", "--out", str(plan)],
                  cwd=ctx.scratch, env=ctx.env(ctx.scratch), timeout=ctx.left(300))
    finally:
        _git(ctx, "checkout", "--", ".")
    if got.rc != 0 or not plan.is_file():
        raise StageFailed(f"fastci plan failed: {last_line(got.out)}")
    return blind_spot_outcome(json.loads(plan.read_text(encoding="utf-8")),
                              tp_tests(load_suite(ctx.scratch), ctx.tests), ctx.tests)


def blind_spot_outcome(plan: Mapping[str, Any], tp: Sequence[str], subset: Sequence[str]) -> dict[str, Any]:
    """Which subset tests the plan runs; raises when a TP test is left out."""
    planned = {str(t["id"]) for t in plan.get("tests", [])}
    everything = plan.get("mode") == "all"

    def runs(name: str) -> bool:
        return everything or any(f"/{name}.py" in t or t.endswith(f":{name}") for t in planned)

    selected = [n for n in subset if runs(n)]
    missed = [n for n in tp if not runs(n)]
    result = {"change": BLIND_SPOT, "mode": plan.get("mode"), "tp_tests": list(tp),
              "selected": selected, "tp_missed": missed, "reason": plan.get("reason", "")}
    if missed:
        raise StageFailed(f"an edit to _CopyToTP.backward left TP tests out of the plan: {missed}")
    if everything:
        result["note"] = "the plan ran everything: the TP tests run, but not because evidence saw them"
    return result


def stage_calibrate(ctx: Ctx) -> dict[str, Any]:
    """``fastci calibrate --no-bazel``, one process per test, several at a time.

    A test's rungs are one pytest process each (start, imports, CUDA init: seconds apiece),
    about a dozen a test: one after the other they would not fit the check's minutes. The
    processes share the calibration store (SQLite, WAL). Rung costs measured side by side
    are inflated alike; the plans' GPU-seconds are measured by ``fastci eval``'s own runs.
    """
    assert ctx.scratch is not None
    scratch = ctx.scratch
    nodes = node_ids(scratch, ctx.tests)
    jobs = max(1, min(len(nodes), (os.cpu_count() or 2) // 2, 6))

    def one(node: str) -> Ran:
        return run([ctx.python, "-m", "fastci", "calibrate", "--no-bazel", node],
                   cwd=scratch, env=ctx.env(scratch), timeout=ctx.left(900))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        got = dict(zip(nodes, pool.map(one, nodes)))
    # A rung that fails is never chosen (docs/REDUCTION.md): calibrate says so and exits 1;
    # only a calibration that could not run at all fails the stage.
    rungs_failed = {n: last_line(r.out) for n, r in got.items() if r.rc != 0 and "did not pass" in r.out}
    failed = {n: last_line(r.out) for n, r in got.items() if r.rc != 0 and n not in rungs_failed}
    if failed:
        raise StageFailed(f"fastci calibrate failed for {len(failed)} test(s): "
                          + "; ".join(f"{n}: {why}" for n, why in failed.items()))
    return {"summary": {n: last_line(r.out) for n, r in got.items()}, "jobs": jobs,
            "rungs_failed": rungs_failed,
            "seconds": {n: round(r.seconds, 1) for n, r in got.items()}, "device": ctx.device,
            "workload": "declared (full) and its rungs"}


def stage_plans(ctx: Ctx) -> dict[str, Any]:
    """``fastci eval`` of the bench changes on the subset (one GPU slot)."""
    assert ctx.scratch is not None
    out = ctx.out / "eval"
    shutil.rmtree(out, ignore_errors=True)
    # eval's scratch worktree belongs to the scratch repository of this run, never an earlier one.
    shutil.rmtree(ctx.out / "eval-work", ignore_errors=True)
    patches = [str(ctx.scratch / "bench" / "changes" / f"{c}.patch") for c in ctx.changes]
    got = run([ctx.python, "-m", "fastci", "eval", *patches, "--no-bazel", "--gpu-slots", "1",
               "--tests", *node_ids(ctx.scratch, ctx.tests), "--out", str(out),
               "--workdir", str(ctx.out / "eval-work")],
              cwd=ctx.scratch, env=ctx.env(ctx.scratch), timeout=ctx.left(900))
    jsonl = out / "results.jsonl"
    if not jsonl.is_file():
        raise StageFailed(f"fastci eval wrote no results: {last_line(got.out)}")
    sys.path.insert(0, str(ctx.scratch / "analyzer"))
    from fastci.eval.results import read_results

    return summarize_plans(read_results(jsonl))


def summarize_plans(results: Sequence[Any]) -> dict[str, Any]:
    """GPU-seconds of the reduced runs against the same tests at full workload, escapes, latency."""
    per_test: list[dict[str, Any]] = []
    reduced_s = full_s = 0.0
    escapes: list[str] = []
    changes = []
    for r in results:
        for t in r.tests:
            if not (t.planned and t.overrides):
                continue
            slots = max(int(t.gpus), 1)
            per_test.append({"change": r.change, "test": t.id, "overrides": dict(t.overrides),
                             "reduced_gpu_s": round(t.plan_s * slots, 3), "full_gpu_s": round(t.all_s * slots, 3),
                             "ratio": round(t.plan_s / t.all_s, 3) if t.all_s else None})
            reduced_s += t.plan_s * slots
            full_s += t.all_s * slots
        escapes.extend(f"{r.change}: {m.get('test', m)}" for m in r.missed)
        changes.append({"change": r.change, "plan_mode": r.plan_mode, "tests": r.fastci.tests,
                        "gpu_s": round(r.fastci.gpu_s, 3), "all_gpu_s": round(r.run_all.gpu_s, 3),
                        "latency_s": round(r.fastci.latency_s, 3),
                        "all_latency_s": round(r.run_all.latency_s, 3),
                        "detected": r.detected, "detected_by_all": r.detected_by_all,
                        "note": r.note})
    return {"per_test": per_test, "reduced_gpu_s": round(reduced_s, 3), "full_gpu_s": round(full_s, 3),
            "reduced_over_full": round(reduced_s / full_s, 3) if full_s else None,
            "escapes": escapes, "changes": changes}


#: Asks the host's Python which engine its recorder uses, its version and which audit hook
#: carries the recorder's events (``c`` where run.sh built it, else ``python``; issue 35).
_ENGINE_QUERY = ("import sys; from fastci.evidence.record.monitor import backend; "
                 "from fastci.evidence.record.files import native_hook; "
                 "print(backend(), '%d.%d' % sys.version_info[:2], "
                 "'python' if native_hook() is None else 'c')")


def recording_engine(ctx: Ctx) -> tuple[str, str, str]:
    """The recorder's engine on this host (``monitoring`` or ``coverage``), its Python and
    its audit hook (``c`` or ``python``)."""
    got = run([ctx.python, "-c", _ENGINE_QUERY], cwd=ctx.root, env=ctx.env(), timeout=ctx.left(60))
    words = got.out.strip().splitlines()[-1].split() if got.rc == 0 and got.out.strip() else []
    if len(words) != 3:
        raise StageFailed(f"cannot tell the recorder's engine: {last_line(got.out)}")
    return words[0], words[1], words[2]


def engine_problem(engine: str, version: str) -> str | None:
    """Why the overhead measured here is not the one wanted: on Python 3.12+ it must be
    the ``sys.monitoring`` engine's (None: it is, or this Python has no other)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    if (major, minor) >= (3, 12) and engine != "monitoring":
        return (f"Python {version} records with {engine}, not sys.monitoring "
                "(is FASTCI_RECORDER set?): the overhead would not be the 3.12 recorder's")
    return None


def stage_overhead(ctx: Ctx) -> dict[str, Any]:
    """Plain against recorded, alternating, in-test seconds of one training test at full."""
    engine, version, hook = recording_engine(ctx)
    problem = engine_problem(engine, version)
    if problem:
        raise StageFailed(problem)
    node = node_ids(ctx.root, [OVERHEAD_TEST])[0]
    plain: list[float] = []
    recorded: list[float] = []
    for i in range(ctx.pairs):
        for mode in ("plain", "recorded"):
            with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
                lines = Path(tmp) / "r.jsonl"
                extra = ["--fastci-record", "--fastci-trace-dir", str(Path(tmp) / "t")] if mode == "recorded" else []
                got = run([ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "fastci.pytest.plugin", "--fastci-results", str(lines),
                           *extra, node], cwd=ctx.root, env=ctx.env(), timeout=ctx.left(300))
                rows = read_result_lines(lines)
                if got.rc != 0 or not rows or rows[0].get("outcome") != "passed":
                    raise StageFailed(f"{OVERHEAD_TEST} ({mode}, pair {i + 1}) did not pass: {last_line(got.out)}")
                (plain if mode == "plain" else recorded).append(seconds(rows[0]))
    return overhead_outcome(plain, recorded,
                            engine=f"{engine} (Python {version}, {hook} audit hook)")


def overhead_outcome(plain: Sequence[float], recorded: Sequence[float],
                     engine: str = "") -> dict[str, Any]:
    ratio = statistics.median(recorded) / statistics.median(plain) if plain and min(plain) > 0 else None
    return {"test": OVERHEAD_TEST, "engine": engine, "plain_s": [round(x, 3) for x in plain],
            "recorded_s": [round(x, 3) for x in recorded],
            "recording_over_plain": round(ratio, 3) if ratio is not None else None,
            "method": "medians of in-test seconds (pytest call phases), runs alternating plain/recorded"}


# The cheap, independent measurements first: a run stopped at the deadline loses the last.
STAGES: tuple[tuple[str, Callable[[Ctx], dict[str, Any]]], ...] = (
    ("references", stage_references), ("floors", stage_floors), ("reach", stage_reach),
    ("record", stage_record),
    ("blind_spot", stage_blind_spot), ("overhead", stage_overhead), ("calibrate", stage_calibrate),
    ("plans", stage_plans))
#: Stages that need the scratch repository ``record`` makes.
NEEDS_RECORD = {"blind_spot", "calibrate", "plans"}


# --------------------------------------------------------------------------- report


def targets(results: Mapping[str, Any]) -> dict[str, Any]:
    """Each target with the measured value and whether it was met (None: not measured)."""
    plans = results.get("plans") or {}
    over = results.get("overhead") or {}
    ratio = plans.get("reduced_over_full")
    rec = over.get("recording_over_plain")
    esc = plans.get("escapes")
    return {
        "reduced_over_full": {"target": f"<= {TARGETS['reduced_over_full']}", "value": ratio,
                              "met": None if ratio is None else ratio <= TARGETS["reduced_over_full"]},
        "recording_over_plain": {"target": f"<= {TARGETS['recording_over_plain']}", "value": rec,
                                 "met": None if rec is None else rec <= TARGETS["recording_over_plain"]},
        "escapes": {"target": "0", "value": None if esc is None else len(esc),
                    "met": None if esc is None else not esc},
        "floors_all_pass": {"target": "every test", "value": (results.get("floors") or {}).get("passed"),
                            "met": None if "floors" not in results else not (results["floors"].get("failed")
                                                                             or results["floors"].get("missing"))},
    }


def markdown(doc: Mapping[str, Any]) -> str:
    """The results table for docs (README's measured section, docs/REDUCTION.md)."""
    env = doc.get("probe") or {}
    tg = doc["targets"]

    def cell(key: str) -> str:
        t = tg[key]
        mark = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        return f"{t['value']} ({mark}; target {t['target']})"

    title = "CPU SMOKE of make gpu-check (not GPU numbers)" if doc.get("smoke") else "make gpu-check"
    lines = [f"### {title}: {env.get('card', '?')}", "",
             "| card | driver | torch (CUDA) | date | floors pass | reduced / full GPU-s | escapes | "
             "recording / plain | check |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| {env.get('card', '?')} | {env.get('driver') or '-'} | {env.get('torch', '?')} "
             f"({env.get('cuda') or '-'}) | {env.get('date', '?')} | {cell('floors_all_pass')} | "
             f"{cell('reduced_over_full')} | {cell('escapes')} | {cell('recording_over_plain')} | "
             f"{'passed' if doc.get('ok') else 'FAILED'} |", "",
             "| stage | seconds | budget | outcome |", "|---|---|---|---|"]
    for name, st in doc["stages"].items():
        lines.append(f"| {name} | {st['seconds']} | {st['budget_s']} | {st['outcome']} |")
    engine = (doc.get("overhead") or {}).get("engine")
    if engine:
        lines += ["", f"Recording overhead measured with the recorder's {engine} engine."]
    per = (doc.get("plans") or {}).get("per_test") or []
    if per:
        lines += ["", "| change | reduced test | overrides | reduced GPU-s | full GPU-s | ratio |",
                  "|---|---|---|---|---|---|"]
        for p in per:
            lines.append(f"| {p['change']} | {p['test']} | {json.dumps(p['overrides'], sort_keys=True)} | "
                         f"{p['reduced_gpu_s']} | {p['full_gpu_s']} | {p['ratio']} |")
    return "\n".join(lines) + "\n"


def write_report(ctx: Ctx, stages: Mapping[str, Any], ok: bool) -> dict[str, Any]:
    doc = {"smoke": ctx.smoke, "device": ctx.device, "ok": ok, "subset": list(ctx.tests),
           "changes": list(ctx.changes), "stages": dict(stages), **ctx.results}
    doc["targets"] = targets(ctx.results)
    ctx.out.mkdir(parents=True, exist_ok=True)
    (ctx.out / "results.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (ctx.out / "results.md").write_text(markdown(doc), encoding="utf-8")
    return doc


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="CPU smoke of every stage (fewer tests; needs --device cpu; NOT the check)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default build/gpu-check, build/gpu-check-smoke for the smoke)")
    p.add_argument("--tests", nargs="+", default=None, help=f"the recorded subset (default {' '.join(SUBSET)})")
    p.add_argument("--changes", nargs="+", default=None, help=f"bench changes (default {' '.join(CHANGES)})")
    p.add_argument("--pairs", type=int, default=None, help="plain/recorded pairs (default 3; smoke 1)")
    p.add_argument("--stages", nargs="+", default=None, choices=[s for s, _ in STAGES],
                   help="run only these stages (record runs too when a later stage needs it)")
    p.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                   help=f"start no stage after this many seconds (default {DEADLINE_S:.0f}: the device "
                        "allows 600 s a command); results are written after every stage")
    args = p.parse_args(argv)
    if args.device == "cpu" and not args.smoke:
        p.error("--device cpu is only the smoke (--smoke): the check itself measures a GPU")
    if args.smoke and args.device != "cpu":
        p.error("--smoke runs on CPU: add --device cpu")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = (args.out or Path("build/gpu-check-smoke" if args.smoke else "build/gpu-check"))
    out = out if out.is_absolute() else ROOT / out
    ctx = Ctx(root=ROOT, out=out, device=args.device, smoke=args.smoke,
              tests=tuple(args.tests or (SUBSET[:2] if args.smoke else SUBSET)),
              changes=tuple(args.changes or (CHANGES[:1] if args.smoke else CHANGES)),
              pairs=args.pairs or (1 if args.smoke else 3))
    began = time.perf_counter()
    ctx.ends_at = began + args.deadline_s + 60  # the last stage's commands end by then
    try:
        probe = stage_probe(ctx)
    except NoGpu as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return NO_GPU_EXIT
    except StageFailed as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 1
    if probe["missing_modules"]:
        print(f"gpu-check: missing Python modules {probe['missing_modules']}: carry them as wheels "
              "(make gpu-wheels here, then tools/gpu_check/run.sh there)", file=sys.stderr)
        return 1
    ctx.results["probe"] = probe
    print(f"gpu-check{' (CPU SMOKE: not the GPU check)' if ctx.smoke else ''}: {probe['card']} "
          f"driver {probe['driver'] or '-'} torch {probe['torch']} cuda {probe['cuda']} -> {out}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.stages or [s for s, _ in STAGES])
    if wanted & NEEDS_RECORD:
        wanted.add("record")
    stages: dict[str, Any] = {}
    ok = True
    for name, fn in STAGES:
        if name not in wanted:
            continue
        if not ok and name in NEEDS_RECORD and "record" in stages and stages["record"]["outcome"] != "passed":
            stages[name] = {"seconds": 0.0, "budget_s": BUDGET_S[name], "outcome": "not run: record failed"}
            continue
        if time.perf_counter() - began > args.deadline_s:
            ok = False
            stages[name] = {"seconds": 0.0, "budget_s": BUDGET_S[name],
                            "outcome": f"not run: past the {args.deadline_s:.0f} s deadline (rerun with --stages)"}
            print(f"gpu-check: {name:<10} not run: past the deadline", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            ctx.results[name] = fn(ctx)
            outcome = "passed"
        except StageFailed as exc:
            ok, outcome = False, f"FAILED: {exc}"
        secs = round(time.perf_counter() - t0, 1)
        over = " (OVER BUDGET)" if secs > BUDGET_S[name] else ""
        stages[name] = {"seconds": secs, "budget_s": BUDGET_S[name], "outcome": outcome}
        print(f"gpu-check: {name:<10} {secs:7.1f}s (budget {BUDGET_S[name]}s){over}: {outcome}", flush=True)
        write_report(ctx, stages, ok)  # a command killed at its limit still leaves what was measured
    doc = write_report(ctx, stages, ok)
    escaped = bool((ctx.results.get("plans") or {}).get("escapes"))
    doc_ok = ok and not escaped
    if doc_ok != ok:
        doc = write_report(ctx, stages, doc_ok)
    print(f"gpu-check: {'passed' if doc_ok else 'FAILED'} in {time.perf_counter() - began:.0f}s; "
          f"{out / 'results.json'}, {out / 'results.md'}")
    for key, t in doc["targets"].items():
        print(f"gpu-check: target {key}: {t['value']} ({t['target']}): "
              f"{ {True: 'met', False: 'MISSED', None: 'not measured'}[t['met']] }")
    return 0 if doc_ok else 1


if __name__ == "__main__":
    sys.exit(main())
