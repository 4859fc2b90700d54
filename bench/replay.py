"""Replay benchmark: a scripted history on a scratch copy of the example, recorded as CI would.

A CI that records on every merge keeps its evidence fresh from the tests it ran: after each
commit only the selected tests are re-recorded, so the store holds evidence from many
commits at once. This benchmark replays such a history and checks the two properties that
mixed-commit evidence puts at risk (issue 12):

* **misses**: a test that fails when every test runs, but is not in the plan (must be 0);
* **re-selections**: a test selected only because of an *earlier* commit's change: it was
  re-recorded at the previous commit, and none of its reasons names a path the new commit
  changed (must be 0: the cost of a change stops once its tests were re-recorded).

Setup: ``examples/microllm`` is copied into a scratch git repository (same relative paths,
so ``bench/changes/*.patch`` apply as they are), every test runs recorded at the first
commit and is ingested. Then, for each step of :data:`HISTORY` (model, parallel, data,
optimizer, config, test-file, dependency-pin, metadata and documentation edits, an
injected bug and its fix), one commit:

1. ``fastci plan`` the commit against the previous one (the pytest runner), timed;
2. run *every* test at its floors, recorded (``--fastci-record``), to learn what fails;
3. ingest the traces of the plan's tests only, at this commit: the evidence refresh a CI
   running the plan would make (the run-all traces of the other tests are discarded).

Running every test once per commit, recorded, serves both the miss check and the refresh;
a test's evidence does not depend on which other tests ran in its session (shared set-up
is attributed to every test that uses it). ``python -m bench replay`` exits 1 on a miss
or a re-selection. About one recorded run of the suite per commit (a minute or two each on
a 2-core machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from fastci.evidence.record import trace
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze_change
from fastci.plan.analysis import Analysis
from fastci.select.decisions import Decision, DecisionKind

REPO = Path(__file__).resolve().parents[1]
CHANGES = Path(__file__).resolve().parent / "changes"
EXAMPLE = "examples/microllm"

#: Reasons that select a test on their own account, not because of a changed path.
STANDING_KINDS = frozenset({
    DecisionKind.NO_EVIDENCE, DecisionKind.INCOMPLETE_EVIDENCE, DecisionKind.ENVIRONMENT_CHANGED,
    DecisionKind.ENVIRONMENT_PACKAGES, DecisionKind.FAILED_LAST, DecisionKind.NEW_TEST,
    DecisionKind.RUN_ALL_PATH, DecisionKind.UNKNOWN_PATH, DecisionKind.ERROR})
FAILING = frozenset({"failed", "error"})


@dataclass(frozen=True)
class Step:
    """One commit of the history: a name, what it touches, and how to make it."""

    name: str
    kind: str
    apply: Callable[[Path], None]


def patch(name: str, kind: str, *, reverse: bool = False) -> Step:
    """A step that applies (or reverts) ``bench/changes/<name>.patch`` with ``git apply``."""
    path = CHANGES / f"{name}.patch"

    def apply(root: Path) -> None:
        _git(root, "apply", *(["-R"] if reverse else []), str(path))
    return Step(f"{'revert ' if reverse else ''}{name}", kind, apply)


def edit(name: str, kind: str, rel: str, old: str, new: str) -> Step:
    """A step that replaces ``old`` (which must occur once) by ``new`` in ``rel``."""
    def apply(root: Path) -> None:
        path = root / rel
        text = path.read_text() if path.exists() else ""
        if old and text.count(old) != 1:
            raise RuntimeError(f"replay step {name!r}: {old!r} is not in {rel} exactly once")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(old, new, 1) if old else text + new)
    return Step(name, kind, apply)


#: The scripted history. Steps build on each other; two of them edit a file an earlier
#: step edited (evidence recorded at different commits meets a second change).
HISTORY: tuple[Step, ...] = (
    patch("09_causal_mask_refactor", "model"),
    edit("all-reduce loop bound spelled out", "parallel",
         f"{EXAMPLE}/microllm/parallel/comm.py", "    for v in vals[1:]:\n",
         "    for v in vals[1:len(vals)]:\n"),
    patch("05_data_resume_rewinds", "bug (data)"),
    patch("05_data_resume_rewinds", "fix (data)", reverse=True),
    patch("08_weight_decay_on_norms", "bug (optimizer)"),
    patch("08_weight_decay_on_norms", "fix (optimizer)", reverse=True),
    patch("12_norm_eps_default", "config"),
    edit("lr schedule test checks the first step", "test file",
         f"{EXAMPLE}/tests/lr_schedule_test.py",
         "    assert lr_at(anchor, opt, anchor) == opt.min_lr\n",
         "    assert lr_at(anchor, opt, anchor) == opt.min_lr\n"
         "    assert full.lrs[0] > 0, \"the first step trains\"\n"),
    patch("11_kv_cache_int_length", "model, same file again"),
    edit("torch pin raised", "dependency pin", f"{EXAMPLE}/pyproject.toml",
         'dependencies = ["torch>=2.1"]', 'dependencies = ["torch>=2.4"]'),
    patch("10_trainer_docs_only", "docs only"),
    edit("pre-commit config", "metadata", ".pre-commit-config.yaml", "",
         "repos:\n  - repo: local\n    hooks: []\n"),
    patch("02_rotary_cache_off_by_one", "bug (model)"),
    patch("02_rotary_cache_off_by_one", "fix (model)", reverse=True),
)


@dataclass(frozen=True)
class Row:
    """One commit's result."""

    step: str
    kind: str
    selected: int
    total: int
    failing: tuple[str, ...]
    missed: tuple[str, ...]
    reselected: tuple[str, ...]
    plan_s: float
    mode: str


def _git(root: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout.strip()


def commit(root: Path, message: str) -> str:
    """Commit everything in the worktree; the new commit's hash."""
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=replay", "-c", "user.email=replay@fastci", "commit", "-q",
         "--allow-empty", "-m", message)
    return _git(root, "rev-parse", "HEAD")


def changed_paths(root: Path, old: str, new: str) -> set[str]:
    """Paths that differ between two commits."""
    return set(filter(None, _git(root, "diff", "--name-only", old, new).splitlines()))


def outcomes(traces: Path) -> dict[str, str]:
    """Test id -> outcome, from the main-process traces of one recorded run."""
    out: dict[str, str] = {}
    for blob in find_traces([traces]):
        t = trace.decode(blob.data, origin=blob.origin)
        if t.role == "main":
            out[t.test_id] = t.outcome
    return out


def reselected(decisions: Iterable[Decision], refreshed: set[str],
               changed: set[str]) -> list[str]:
    """Selected tests re-recorded at the previous commit whose every reason names a path
    (or a unit in a path) the new commit did not change."""
    out = []
    for d in decisions:
        if not d.selected or d.test not in refreshed:
            continue
        if any(r.kind in STANDING_KINDS for r in d.reasons):
            continue
        paths = {r.path or (r.unit.split("::")[0] if r.unit else None) for r in d.reasons}
        if None not in paths and not paths & changed:
            out.append(d.test)
    return sorted(out)


@dataclass(frozen=True)
class Replayed:
    """One replayed commit, as a benchmark measures it before its evidence is refreshed."""

    n: int
    step: Step
    analysis: Analysis
    plan_s: float
    #: Test id -> outcome, from running every test at this commit.
    results: Mapping[str, str]
    #: The tests whose evidence this commit refreshes: the ones the plan runs.
    chosen: frozenset[str]
    #: Paths that differ from the previous commit.
    changed: frozenset[str]
    #: The tests whose evidence was re-recorded at the previous commit.
    refreshed: frozenset[str]


R = TypeVar("R")


def replay_commits(root: Path, steps: Sequence[Step], run_all: Callable[[Path], None],
                   work: Path, *, choose: Callable[[Analysis, Mapping[str, str]], Iterable[str]],
                   measure: Callable[[Replayed, EvidenceStore], R],
                   line: Callable[[int, R], str],
                   echo: Callable[[str], None] = print) -> list[R]:
    """Replay ``steps`` on the git repository ``root`` (its HEAD is the first commit), as a
    CI that records on every merge would: the loop both replay benchmarks share.

    Every test runs recorded at the first commit and is ingested. Then, per step: commit
    it, plan it against the previous commit (timed), run every test recorded, let
    ``measure`` make the benchmark's row from what it learned (the store still holding
    the evidence the plan was made from), then ingest the traces of the tests
    ``choose(analysis, results)`` names only, at this commit.

    Args:
        root: The git repository the steps apply to.
        steps: The history, one commit each.
        run_all: ``run_all(traces)`` runs every test recorded, its traces in ``traces``.
        work: Where the store, the plan and the traces live.
        choose: The tests a CI running the plan would run (and so re-record).
        measure: The benchmark's row for one commit.
        line: The row as the line echoed for it (``n`` counts commits from 1).
        echo: Where progress lines go.

    Returns:
        One row per step, in order.
    """
    work.mkdir(parents=True, exist_ok=True)
    store_path = work / "evidence.db"
    head = _git(root, "rev-parse", "HEAD")
    traces = work / "traces-0"
    run_all(traces)
    with EvidenceStore.open(store_path, create=True) as store:
        report = ingest(store, find_traces([traces]), source="pytest", commit=head, root=root)
    shutil.rmtree(traces, ignore_errors=True)
    refreshed = frozenset(report.tests)
    echo(f"  recorded every test at the first commit: {len(refreshed)} tests")
    rows: list[R] = []
    for n, step in enumerate(steps, 1):
        step.apply(root)
        prev, head = head, commit(root, step.name)
        t0 = time.perf_counter()
        _, analysis = analyze_change(root, base=prev, head=head, store=str(store_path),
                                     plan=str(work / "plan.json"), runner="pytest")
        plan_s = time.perf_counter() - t0
        traces = work / f"traces-{n}"
        run_all(traces)
        results = outcomes(traces)
        replayed = Replayed(n, step, analysis, plan_s, results,
                            frozenset(choose(analysis, results)),
                            frozenset(changed_paths(root, prev, head)), refreshed)
        with EvidenceStore.open(store_path) as store:
            row = measure(replayed, store)
            report = ingest(store, find_traces([traces]), source="pytest", commit=head,
                            root=root, only=set(replayed.chosen))
        shutil.rmtree(traces, ignore_errors=True)
        refreshed = frozenset(report.tests)
        rows.append(row)
        echo(line(n, row))
    return rows


def _plan_tests(analysis: Analysis, results: Mapping[str, str]) -> set[str]:
    """The tests the plan runs: its selected ones, every decided one when it widens."""
    mode = analysis.plan.mode
    return {d.test for d in analysis.selection.decisions if d.selected or mode != "selective"}


def _row(c: Replayed, store: EvidenceStore) -> Row:
    mode = c.analysis.plan.mode
    failing = sorted(t for t, o in c.results.items() if o in FAILING)
    again = reselected(c.analysis.selection.decisions, set(c.refreshed), set(c.changed)) \
        if mode == "selective" else []
    return Row(c.step.name, c.step.kind, len(c.chosen), len(c.results), tuple(failing),
               tuple(t for t in failing if t not in c.chosen), tuple(again), c.plan_s, mode)


def replay(root: Path, steps: Sequence[Step], run_all: Callable[[Path], None], work: Path,
           *, echo: Callable[[str], None] = print) -> list[Row]:
    """Replay ``steps`` on the git repository ``root`` (its HEAD is the first commit).

    ``run_all(traces)`` runs every test recorded, its traces in ``traces``. The store and
    traces live in ``work``.
    """
    return replay_commits(root, steps, run_all, work, choose=_plan_tests, measure=_row,
                          line=format_row, echo=echo)


def format_row(n: int, row: Row) -> str:
    """One line per commit."""
    text = (f"  {n:2d} {row.step[:44]:44s} {row.kind:16s} selected {row.selected:3d}/"
            f"{row.total:<3d} failing {len(row.failing)} missed {len(row.missed)} "
            f"re-selected {len(row.reselected)} plan {row.plan_s:.2f} s"
            f"{'' if row.mode == 'selective' else ' (' + row.mode + ')'}")
    for t in row.missed:
        text += f"\n       MISS: {t}"
    for t in row.reselected:
        text += f"\n       RE-SELECTED: {t}"
    return text


def summary(rows: Sequence[Row]) -> list[str]:
    """The totals and the verdict."""
    selected = sum(r.selected for r in rows)
    total = sum(r.total for r in rows)
    missed = sum(len(r.missed) for r in rows)
    again = sum(len(r.reselected) for r in rows)
    plan = sorted(r.plan_s for r in rows)
    verdict = "OK" if not missed and not again else "FAILED"
    return [f"  total: {selected} of {total} test runs selected "
            f"({100 * (1 - selected / max(total, 1)):.0f}% fewer); misses {missed} (target 0); "
            f"re-selections {again} (target 0); plan time median "
            f"{plan[len(plan) // 2] if plan else 0:.2f} s, max {plan[-1] if plan else 0:.2f} s: "
            f"{verdict}"]


def scratch_example(dest: Path) -> Path:
    """A git repository holding a copy of the example at its repository path."""
    (dest / EXAMPLE).parent.mkdir(parents=True)
    shutil.copytree(REPO / EXAMPLE, dest / EXAMPLE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "bazel-*"))
    (dest / ".gitignore").write_text("__pycache__/\n.fastci/\n")
    _git(dest, "init", "-q")
    commit(dest, "the example")
    return dest


def pytest_run_all(root: Path, paths: Sequence[str], env: Mapping[str, str],
                   extra: Sequence[str] = ()) -> Callable[[Path], None]:
    """``run_all`` for :func:`replay`: every test under ``paths``, recorded, with pytest."""
    def run(traces: Path) -> None:
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-p", "fastci.pytest.plugin", "--fastci-record",
             f"--fastci-trace-dir={traces}", *extra, *paths],
            cwd=root, env=dict(env), capture_output=True, text=True, check=False)
        if res.returncode not in (0, 1):  # 1: some tests failed, which the replay expects
            tail = (res.stdout + res.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"pytest exited {res.returncode}: {' | '.join(tail)}")
    return run


def pytest_env(*paths: Path) -> dict[str, str]:
    """The environment the recorded runs get: ``paths`` and the analyzer importable, one
    thread, no bytecode written into the scratch repository."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
                PYTHONPATH=os.pathsep.join([*map(str, paths), str(REPO / "analyzer")]))


@contextmanager
def scratch_work(prefix: str, argv: Sequence[str]) -> Iterator[Path]:
    """A scratch folder for one benchmark run, removed after it unless ``argv`` says
    ``--keep`` (then its path is printed)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if "--keep" in argv:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``python -m bench replay [-- --keep]``: exit 1 on a miss or a re-selection."""
    with scratch_work("fastci-replay-", argv) as work:
        root = scratch_example(work / "repo")
        env = pytest_env(root / EXAMPLE)
        print(f"replay benchmark: {len(HISTORY)} commits on a scratch copy of {EXAMPLE} "
              "(pytest, floors; evidence refreshed from the plan's tests)", flush=True)
        rows = replay(root, HISTORY, pytest_run_all(root, [f"{EXAMPLE}/tests"], env,
                                                     ["--at-floors"]), work,
                      echo=lambda s: print(s, flush=True))
        for line in summary(rows):
            print(line)
        return 1 if any(r.missed or r.reselected for r in rows) else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
