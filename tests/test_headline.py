"""The headline command, end to end: ``bazel test //... --config=fastci`` at the repository root.

A fresh copy of this checkout (``bench.demo.make_workspace``: tracked and untracked,
not ignored files, as one git commit) gets a plan that runs one cheap gpu_test and
skips every other; then exactly the command the README promises runs in it, through
the copy's ``tools/bazel`` wrapper (the ``bazel`` launcher picks it up), and the build
event file says what ran. The nested fixture workspaces under ``tests/`` must stay
out of ``//...`` (``.bazelignore``), and plain ``bazel build //...`` must pass too.

Flags the command does not carry (own output base, build event file) go into the
copy's ``user.bazelrc``, which ``.bazelrc`` imports and git ignores (so the tree the
plan is tied to does not change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bazel_support import remove_tree, require_bazel
from bench.demo import make_workspace
from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.git.tree import worktree_tree

require_bazel()

REPO = Path(__file__).resolve().parents[1]
#: The one gpu_test the plan keeps: cheap (config checks, ~2 s) and part of the example suite.
KEEP = "//examples/microllm/tests:config_validation_test"
#: gpu_tests carry a ``gpus:<n>`` tag (rules/private/gpu_test.bzl).
GPU_TESTS = 'attr(tags, "gpus:", tests(//...))'


def _bazel(ws: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # FASTCI_PYTHON: the wrapper digests this interpreter's venv (the copy has no .venv).
    env = dict(os.environ, FASTCI_PYTHON=sys.executable)
    return subprocess.run(["bazel", *args], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_bazel_test_all_with_fastci_config_obeys_the_plan_at_the_root(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    make_workspace(REPO, ws)
    bep = tmp_path / "bep.json"
    with (ws / "user.bazelrc").open("a") as rc:
        rc.write(f"startup --output_base={tmp_path / 'out'}\n"
                 f"test --build_event_json_file={bep}\n")
    try:
        query = _bazel(ws, "query", GPU_TESTS)
        assert query.returncode == 0, query.stderr[-2000:]
        gpu_tests = set(query.stdout.split())
        assert KEEP in gpu_tests and len(gpu_tests) > 1
        assert not any(label.startswith("//tests/") for label in gpu_tests), \
            "fixture workspaces under tests/ leak into //... (.bazelignore)"
        plan = {"version": 1, "mode": "selective", "reason": "headline test",
                "tree": worktree_tree(ws),
                "tests": [{"id": KEEP, "why": "the one test this plan runs"}],
                "skipped": [{"id": t, "why": "not affected"} for t in sorted(gpu_tests - {KEEP})]}
        (ws / ".fastci" / "plan.json").write_text(json.dumps(plan))

        res = _bazel(ws, "test", "//...", "--config=fastci")
        assert res.returncode == 0, res.stderr[-3000:]
        report = parse_bep(bep)
        ran = {label for label in report.outcomes if label in gpu_tests}
        assert ran == {KEEP}, f"gpu_tests that ran: {sorted(ran)}"
        assert report.outcomes[KEEP].passed
        assert set(report.skipped) == gpu_tests - {KEEP}
        # The rest of //... (Starlark unit tests of rules/tests) is not under the plan: it runs.
        others = set(report.outcomes) - gpu_tests
        assert others and all(label.startswith("//rules/tests:") for label in others), sorted(others)
        assert all(report.outcomes[label].passed for label in others)
        # The kept test ran under the plan (not a fallback to everything).
        record = testlogs.read_output(ws / "bazel-testlogs", KEEP, "fastci_workload.json")
        assert record is not None
        assert json.loads(record)["plan_status"].startswith("ok: selective plan"), record
        assert "FastCI plan: WARNING" not in res.stderr

        built = _bazel(ws, "build", "//...")
        assert built.returncode == 0, built.stderr[-3000:]
    finally:
        _bazel(ws, "shutdown", timeout=60)
        remove_tree(tmp_path)
