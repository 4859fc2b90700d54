"""End-to-end, real Bazel: `fastci run` starts tests in priority order on one GPU slot, and
`--fail-fast` stops at the first failure with the rest counted as not run.

Reuses test_run's workspace (tests/selection_fixture in a temporary git repository)
with five one-GPU tests of its own; each appends its name to an order file when its
main starts, so the order is read from a file, never from timings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from fastci.evidence.store.db import EvidenceStore
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan
from fastci.run.runner import RunReport, execute
from plan_support import tie
from bazel_support import remove_tree, require_bazel
from test_run import Ws

require_bazel()  # skips without bazel; fails under CI

NAMES = ("a_test", "b_test", "c_test", "d_test", "bad_test")
BUILD = 'load("@fastci//rules:defs.bzl", "gpu_test")\n' + "".join(
    f'gpu_test(name = "{n}", srcs = ["{n}.py"], gpus = 1, workload = {{"steps": 1}})\n'
    for n in NAMES)
MAIN = ('import os, sys\n'
        'with open(os.environ["ORDER_FILE"], "a") as f:\n'
        '    f.write(os.environ["TEST_TARGET"] + "\\n")\n')


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Ws, Path]]:
    base = tmp_path_factory.mktemp("ff")
    w = Ws(base)
    order = Path("/tmp") / f"fastci-ff-order-{base.name}-{id(w)}.txt"  # /tmp: writable in the sandbox
    files = {f"pkg/{n}.py": MAIN + ("sys.exit(1)\n" if n == "bad_test" else "") for n in NAMES}
    files["pkg/BUILD.bazel"] = BUILD
    rc = w.root / ".bazelrc"
    files[".bazelrc"] = rc.read_text() + (
        "# One fake GPU slot, a lock directory of this test's own, the order file.\n"
        f"test --test_env=FASTCI_FAKE_GPUS=0 --test_env=FASTCI_GPU_LOCK_DIR={base / 'locks'}\n"
        f"test --test_env=ORDER_FILE={order}\n")
    w.repo.commit(files)
    try:
        yield w, order
    finally:
        order.unlink(missing_ok=True)
        w.bazel.shutdown()
        remove_tree(base)


def _run(w: Ws, plan: Plan, **kw: object) -> tuple[list[str], RunReport]:
    lines: list[str] = []
    plan = tie(plan, w.root)  # a plan is obeyed on the tree it names
    dump_plan(plan, w.root / ".fastci/plan.json")
    with EvidenceStore.open(w.store_path, create=True) as store:
        report = execute(w.root, plan, w.config, store=store, bazel=w.bazel, echo=lines.append,
                         **kw)  # type: ignore[arg-type]
    return lines, report


def _plan(*names: str, skip: tuple[str, ...] = ()) -> Plan:
    return Plan("selective", reason="fast feedback", tests=tuple(
        PlannedTest(f"//pkg:{n}", priority=round(1.0 - i / 10, 2)) for i, n in enumerate(names)),
        skipped=tuple(SkippedTest(f"//pkg:{n}", "not today") for n in skip))


def test_fail_fast_stops_at_the_first_failure_and_counts_the_rest_not_run(
        ws: tuple[Ws, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    w, order = ws
    monkeypatch.setenv("FASTCI_FAKE_GPUS", "0")  # what `fastci run` sees on this host
    order.unlink(missing_ok=True)
    lines, report = _run(w, _plan("a_test", "bad_test", "b_test", "c_test", "d_test"),
                         fail_fast=True)
    # One slot, priority order: a, then bad fails and Bazel stops; the rest never started.
    assert order.read_text().split() == ["//pkg:a_test", "//pkg:bad_test"], lines
    assert set(report.stopped) == {"//pkg:b_test", "//pkg:c_test", "//pkg:d_test"}, lines
    assert lines[-1] == "1 passed, 1 failed, 3 not run", lines
    assert "fastci run: 5 planned test(s) in priority order on 1 GPU(s)" in lines
    assert "  NOT RUN    //pkg:c_test (--fail-fast stopped the run)" in lines
    assert report.first_failure is not None and report.first_failure[0] == "//pkg:bad_test"
    assert f"fastci run: time to first failure: {report.first_failure[1]:.1f}s (//pkg:bad_test)" \
        in lines
    with EvidenceStore.open(w.store_path) as store:
        assert set(store.latest_runs()) == {"//pkg:a_test", "//pkg:bad_test"}  # nothing else recorded
    assert not (w.root / ".fastci/runs/schedule.json").exists()


def test_one_slot_starts_tests_in_priority_order_and_stopped_ones_were_not_cached(
        ws: tuple[Ws, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    w, order = ws
    monkeypatch.setenv("FASTCI_FAKE_GPUS", "0")
    order.unlink(missing_ok=True)
    # Not the alphabetical order (nor any order Bazel has a reason to pick).
    lines, report = _run(w, _plan("d_test", "b_test", "c_test", skip=("a_test", "bad_test")))
    assert order.read_text().split() == ["//pkg:d_test", "//pkg:b_test", "//pkg:c_test"], lines
    assert report.report is not None
    assert not any(o.cached for o in report.report.outcomes.values()), lines
    assert report.first_failure is None and report.stopped == ()
    assert lines[-1] == "3 passed, 0 failed", lines
    # Priority is not in any cache key: the same tests in another order are all cache hits.
    order.unlink(missing_ok=True)
    lines, report = _run(w, _plan("c_test", "d_test", "b_test", skip=("a_test", "bad_test")))
    assert report.report is not None and len(report.report.outcomes) == 3
    assert all(o.cached for o in report.report.outcomes.values()), lines
    assert not order.exists()


def test_without_a_schedule_plain_bazel_runs_as_before(ws: tuple[Ws, Path]) -> None:
    w, order = ws
    order.unlink(missing_ok=True)
    (w.root / ".fastci/plan.json").unlink()  # the last plan skipped a_test
    res = w.bazel.test(["//pkg:a_test"], flags=("--config=fastci", "--nocache_test_results"))
    assert not res.no_tests and order.read_text().split() == ["//pkg:a_test"]
