"""Should ``prune: safe`` be the default? Measured on a mix of changes shaped like real CI.

Most CI changes pass. A prune costs nothing on a passing change (its savings are all
kept) and, under the rerun-after-any-failure rule ``fastci run`` enforces, nothing on a
failing one either, as long as some kept test fails. So the mix decides: **passing
changes** (bug-free edits) and **failing changes** (injected bugs), at least two passing
for one failing (:data:`MIN_PASSING_PER_FAILING`).

In the scratch workspace of ``make demo`` (evidence recorded on its base commit):

1. the bench changes (``bench/changes/*.patch``: injected bugs, a refactor, a docs-only
   edit...), each applied and planned twice, prune ``off`` and ``safe``;
2. ``--benign N`` seeded bug-free edits: an unused local assignment at the top of a
   function 2 to ``--max-tests`` tests reach (the unit changes, its behaviour does not);
3. ``--mutants N`` seeded single-site mutants (:mod:`fastci.eval.faults`) of such units.

Every test the ``off`` plan selects runs at full workload through Bazel (not recorded,
never cached): its outcome and measured cost (seconds x GPUs). :func:`score` then replays
what each runner would have run with the ``safe`` plan:

* ``fastci run``: the kept tests; when one of them fails, every pruned test too
  (:func:`fastci.run.runner.execute`). A **miss** is a failing test that did not run:
  a pruned test of a change whose kept tests all passed. Counted per failing test
  (0 allowed).
* plain ``bazel test --config=fastci`` / ``pytest --fastci-plan``: pruned tests run (a
  prune is conditional), so the savings are 0 and so are the misses.

The report gives GPU-seconds against unit selection (prune off), the misses, and the
verdict: ``safe`` may become the default only with 0 misses on a mix of at least 2
passing changes for each failing one. ``python -m bench.prune_mix``; about one run of
the selected tests per change (a change, several minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

import libcst as cst

from fastci.select.test_rules import DeclaredTest, EvidenceReader
from fastci.units.index import split_unit_id
from fastci.plan.inputs import Given, declared_test

T = TypeVar("T")

#: The mix has at least this many passing changes for each failing one.
MIN_PASSING_PER_FAILING = 2


@dataclasses.dataclass
class MixRow:
    """One change of the mix: what unit selection ran, what safe pruning pruned."""

    name: str
    kind: str  # "bench", "benign" or "mutant"
    selected: tuple[str, ...] = ()  # prune off
    pruned: tuple[str, ...] = ()  # of them, pruned by ``safe``
    failing: tuple[str, ...] = ()  # of the selected, failing at full workload
    costs: dict[str, float] = dataclasses.field(default_factory=dict)  # measured GPU-s
    note: str = ""


@dataclasses.dataclass(frozen=True)
class MixScore:
    """What ``safe`` pruning does to a mix under the rerun rule (see the module docstring)."""

    passing: int
    failing: int
    unit_gpu_s: float
    pruned_gpu_s: float  # what fastci run runs with the safe plans
    misses: tuple[tuple[str, str], ...]  # (change, failing test never run)
    reruns: int  # failing changes whose pruned tests ran after a kept test failed

    @property
    def ratio(self) -> float:
        return self.pruned_gpu_s / self.unit_gpu_s if self.unit_gpu_s else 1.0

    @property
    def shaped(self) -> bool:
        """At least :data:`MIN_PASSING_PER_FAILING` passing changes per failing one."""
        return self.failing > 0 and self.passing >= MIN_PASSING_PER_FAILING * self.failing

    def verdict(self) -> str:
        """Whether the measurement supports ``safe`` as the default, and why."""
        if not self.shaped:
            return (f"no verdict: {self.passing} passing and {self.failing} failing change(s); "
                    f"the mix needs at least {MIN_PASSING_PER_FAILING} passing per failing one")
        if self.misses:
            return f"keep prune: off ({len(self.misses)} failing test(s) never ran)"
        return (f"safe may be the default: 0 misses, {self.ratio:.2f}x the GPU-seconds of "
                "unit selection under fastci run (plain runners run pruned tests: 1.00x)")


def score(rows: Iterable[MixRow]) -> MixScore:
    """Replay ``rows`` as ``fastci run`` would run their safe plans."""
    passing = failing = reruns = 0
    unit = pruned_run = 0.0
    misses: list[tuple[str, str]] = []
    for r in rows:
        if r.note or not r.selected:
            continue
        cost = {t: r.costs.get(t, 0.0) for t in r.selected}
        unit += sum(cost.values())
        kept = [t for t in r.selected if t not in r.pruned]
        failed_kept = any(t in r.failing for t in kept)
        ran = list(r.selected) if failed_kept else kept
        pruned_run += sum(cost[t] for t in ran)
        if r.failing:
            failing += 1
            reruns += bool(failed_kept and r.pruned)
        else:
            passing += 1
        misses.extend((r.name, t) for t in r.failing if t not in ran)
    return MixScore(passing, failing, unit, pruned_run, tuple(misses), reruns)


def report(rows: Sequence[MixRow]) -> list[str]:
    """The per-change lines, the totals and the verdict."""
    out = [f"  {'change':<48} {'kind':<7} {'sel':>4} {'pruned':>6} {'fail':>4} {'GPU-s':>8}"]
    for r in rows:
        out.append(f"  {r.name[:48]:<48} {r.kind:<7} {len(r.selected):>4} {len(r.pruned):>6} "
                   f"{len(r.failing):>4} {sum(r.costs.get(t, 0.0) for t in r.selected):>8.1f}"
                   + (f"  ({r.note})" if r.note else ""))
    s = score(rows)
    out.append(f"  mix: {s.passing} passing, {s.failing} failing change(s)")
    out.append(f"  safe under fastci run: {s.pruned_gpu_s:.0f} of {s.unit_gpu_s:.0f} GPU-s "
               f"({s.ratio:.2f}x unit selection); pruned tests rerun after a failure in "
               f"{s.reruns} failing change(s); failing tests never run: {len(s.misses)}"
               + (f" ({', '.join(f'{c}: {t}' for c, t in s.misses[:5])})" if s.misses else ""))
    out.append(f"  verdict: {s.verdict()}")
    return out


class _Noop(cst.CSTTransformer):
    """Insert ``_unused = 0`` first in the body of the function ``qualname`` (after its
    docstring): the unit's checksum changes, its behaviour does not."""

    def __init__(self, qualname: str) -> None:
        self.path = qualname.split(".")
        self.stack: list[str] = []
        self.done = False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append(node.name.value)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.stack.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.stack.append(node.name.value)

    def leave_FunctionDef(self, original: cst.FunctionDef,
                          updated: cst.FunctionDef) -> cst.FunctionDef:
        here = self.stack == self.path
        self.stack.pop()
        if not here or self.done or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        body = list(updated.body.body)
        at = 1 if body and _is_docstring(body[0]) else 0
        body.insert(at, cst.parse_statement("_unused = 0\n"))
        self.done = True
        return updated.with_changes(body=updated.body.with_changes(body=body))


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def benign_edit(source: str, qualname: str) -> str | None:
    """``source`` with a bug-free edit in function ``qualname`` (None: no such function)."""
    noop = _Noop(qualname)
    out = cst.parse_module(source).visit(noop).code
    return out if noop.done else None


def benign_units(recorded: Iterable[tuple[str, str, str]], package: str, *, count: int,
                 seed: int, max_tests: int,
                 editable: Callable[[str], bool] = lambda unit: True) -> list[str]:
    """``count`` seeded function units of ``package`` that 2 to ``max_tests`` tests reach,
    among those ``editable`` accepts (a class body is a unit too, but not a function)."""
    reach: dict[str, set[str]] = {}
    for test, unit, _checksum in recorded:
        if split_unit_id(unit)[0].startswith(package) and not unit.endswith("::<module>"):
            reach.setdefault(unit, set()).add(test)
    narrow = sorted(u for u, tests in reach.items()
                    if 2 <= len(tests) <= max_tests and editable(u))
    return sorted(random.Random(seed).sample(narrow, min(len(narrow), count)))


def measure(sc, name: str, kind: str, apply: Callable[[], None], cfg,  # type: ignore[no-untyped-def]
            declared: Mapping[str, DeclaredTest], gpus: Mapping[str, int]) -> MixRow:
    """Apply a change, plan it with prune off and safe, run the off plan's tests at full
    workload (Bazel, not recorded, never cached)."""
    from fastci.evidence.store.db import EvidenceStore
    from fastci.integrations.bazel.bep import parse_bep
    from fastci.integrations.bazel.plan_repo import override_flag, write_plan_repo
    from fastci.plan.planner import analyze

    row = MixRow(name, kind)
    try:
        try:
            apply()
        except Exception as exc:  # noqa: BLE001 - a change that does not apply is reported
            row.note = f"does not apply: {exc}"
            return row
        with EvidenceStore.open(sc.store_path) as store:
            off = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store, prune="off")
            safe = analyze(sc.ws, cfg, base=sc.commit, declared=Given(declared), store=store,
                           prune="safe")
        if off.plan.mode != "selective":
            row.note = f"plan {off.plan.mode}: not scored"
            return row
        row.selected = tuple(t.id for t in off.plan.tests)
        row.pruned = tuple(sorted(d.test for d in safe.selection.decisions if d.pruned))
        if not row.selected:
            return row
        with tempfile.TemporaryDirectory(prefix="fastci-bench-prune-") as tmp:
            repo = write_plan_repo(Path(tmp) / "plan", {t: {} for t in row.selected},
                                   status="bench prune mix: full workload")
            bep = Path(tmp) / "bep.json"
            sc.bazel.test(list(row.selected), flags=["--config=fastci", override_flag(repo),
                                                     "--keep_going", "--nocache_test_results"],
                          bep_path=bep)
            outcomes = parse_bep(bep).outcomes if bep.is_file() else {}
    finally:
        subprocess.run(["git", "-C", str(sc.ws), "checkout", "-q", "--", "."], check=False)
    row.costs = {t: o.duration_s * max(gpus.get(t, 1), 1) for t, o in outcomes.items()}
    row.failing = tuple(sorted(t for t in row.selected
                               if t not in outcomes or not outcomes[t].passed))
    return row


def interleave(passing: Sequence[T], others: Sequence[T], per: int) -> list[T]:
    """``per`` of ``passing`` before each of ``others``, then the rest: any prefix of the
    run is a mix of the same shape, so an interrupted run still scores."""
    out: list[T] = []
    i = 0
    for item in others:
        out.extend(passing[i:i + per])
        i += per
        out.append(item)
    out.extend(passing[i:])
    return out


def save_row(path: Path, row: MixRow) -> None:
    """Append one measured row (JSON lines) so an interrupted run keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(dataclasses.asdict(row)) + "\n")


def load_rows(path: Path) -> list[MixRow]:
    """The rows :func:`save_row` wrote (none when the file is absent)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        out.append(MixRow(name=str(d["name"]), kind=str(d["kind"]),
                          selected=tuple(d["selected"]), pruned=tuple(d["pruned"]),
                          failing=tuple(d["failing"]),
                          costs={str(k): float(v) for k, v in d["costs"].items()},
                          note=str(d.get("note", ""))))
    return out


def red_at_base(store: EvidenceReader) -> list[str]:
    """The tests whose recorded run at the base failed (safe pruning is off for them)."""
    from fastci.types import is_failure

    return sorted(t for t, r in store.latest_runs().items() if is_failure(r.outcome))


def run(*, benign: int, mutants: int, seed: int, max_tests: int,
        rows_file: Path | None = None,
        echo: Callable[[str], None] = print) -> list[MixRow]:
    """Run the benchmark (see the module docstring); returns its rows."""
    from bench.demo import prepare
    from bench.priority import PACKAGE, _apply, held_out_faults
    from bench.selection import CHANGES
    from fastci.evidence.store.db import EvidenceStore
    from fastci.integrations.bazel.query import list_gpu_tests

    sc = prepare(echo, reuse=True)
    try:
        decls = list_gpu_tests(sc.bazel, sc.config.targets)
        declared = {d.id: declared_test(d) for d in decls}
        gpus = {d.id: d.gpus for d in decls}
        rows: list[MixRow] = []

        done = {r.name: r for r in load_rows(rows_file)} if rows_file else {}

        def add(name: str, kind: str, apply: Callable[[], None]) -> None:
            if name in done:  # measured by an earlier, interrupted run of the same mix
                rows.append(done[name])
                return
            t0 = time.perf_counter()
            rows.append(measure(sc, name, kind, apply, sc.config, declared, gpus))
            r = rows[-1]
            if rows_file:
                save_row(rows_file, r)
            echo(f"-- {name}: {len(r.selected)} selected, {len(r.pruned)} pruned, "
                 f"{len(r.failing)} failing ({time.perf_counter() - t0:.0f} s)")

        changes: list[tuple[str, str, Callable[[], None]]] = [
            (patch.stem, "bench", functools.partial(_apply, sc.ws, patch))
            for patch in sorted(CHANGES.glob("*.patch"))]
        with EvidenceStore.open(sc.store_path) as store:
            red = red_at_base(store)
            if red:  # safe pruning holds nothing while a selected test failed its last run
                echo(f"!! the base is red: {', '.join(red)} failed when recorded; safe "
                     "pruning prunes nothing in a change that selects one, so this mix "
                     "understates it (measure on a quiet machine)")
            units = benign_units(store.recorded_units(), PACKAGE, count=benign, seed=seed,
                                 max_tests=max_tests,
                                 editable=functools.partial(is_function, sc.ws))
            faults = held_out_faults(sc.ws, store, count=mutants, seed=seed, max_tests=max_tests)
        edits: list[tuple[str, str, Callable[[], None]]] = [
            (f"benign-{Path(path).stem}.{qualname}", "benign",
             functools.partial(_edit, sc.ws / path, qualname))
            for path, qualname in map(split_unit_id, units)]
        changes += [(m.name, "mutant", functools.partial(m.apply, sc.ws)) for m in faults]
        for name, kind, apply in interleave(edits, changes, MIN_PASSING_PER_FAILING):
            add(name, kind, apply)
        return rows
    finally:
        sc.bazel.shutdown()


def is_function(root: Path, unit: str) -> bool:
    """Whether ``unit`` is a function :func:`benign_edit` can edit in ``root``."""
    path, qualname = split_unit_id(unit)
    try:
        return benign_edit((root / path).read_text(), qualname) is not None
    except (OSError, cst.ParserSyntaxError):
        return False


def _edit(path: Path, qualname: str) -> None:
    edited = benign_edit(path.read_text(), qualname)
    if edited is None:
        raise ValueError(f"no function {qualname} in {path}")
    path.write_text(edited)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.prune_mix [--benign N] [--mutants N] [--seed S] [--max-tests K]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.prune_mix")
    parser.add_argument("--benign", type=int, default=24, metavar="N",
                        help="bug-free edits (default 24: with the bench's passing changes, "
                             "at least 2 passing changes per failing one)")
    parser.add_argument("--mutants", type=int, default=8, metavar="N", help="seeded mutants")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--max-tests", type=int, default=16, metavar="K")
    parser.add_argument("--rows", type=Path, default=Path("build/bench/prune_mix.jsonl"),
                        metavar="FILE", help="measured rows, appended one per change; a rerun "
                        "with the same mix resumes from them (default %(default)s)")
    parser.add_argument("--report-only", action="store_true",
                        help="score the rows already in --rows (an interrupted run) and stop")
    args = parser.parse_args(argv)
    if args.report_only:
        rows = load_rows(args.rows)
    else:
        rows = run(benign=args.benign, mutants=args.mutants, seed=args.seed,
                   max_tests=args.max_tests, rows_file=args.rows)
    print("== safe pruning on a CI-shaped mix (prune off vs safe; outcomes at full workload)")
    print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
