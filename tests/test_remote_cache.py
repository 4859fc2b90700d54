"""The loopback remote cache, end to end: the real BuildGrid (``make remote-cache-start``)
and the real Bazel 4.2.3 with ``--config=remote_cache`` on tests/bazel_fixture.

(a) tests run from one output base come back as remote cache hits from a second, fresh
one; (b) a plan that changes one test's overrides re-runs that test only;
(c) ``--config=fastci_record`` writes nothing into the cache, and a plan-skipped test
never reaches it; (d) the server dies mid-run: the build warns, runs locally, passes.

BuildGrid lives in its own virtualenv (``.venv-buildgrid``, ``make remote-cache-setup``),
never in the project's ``.venv``. When it is missing the module creates it through that
make target (about a minute), and fails, never skips, when that does not work.

One workspace copy and two output bases (two Bazel servers) for the module; each server
gets a free port and its own state directory; every server is stopped at teardown.
The order of the tests matters only for speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.bep import parse_bep
from fastci.integrations.bazel.runner import Bazel, BazelResult
from plan_support import tie_json
from bazel_support import fixture_workspace, remove_tree, require_bazel

require_bazel()  # skips without bazel; fails under CI

REPO = Path(__file__).resolve().parents[1]
TESTS = ("//gputests:a_test", "//gputests:b_test", "//gputests:c_test")
# Every run: fake GPUs so the 1-GPU tests can run side by side (2-core CI).
COMMON = ("--test_env=FASTCI_FAKE_GPUS=0,1", "--jobs=4", "--local_test_jobs=3", "--local_cpu_resources=4")


def _make(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class Cache:
    """One BuildGrid server started and stopped through the Makefile."""

    state: Path
    port: int = field(default_factory=_free_port)
    pid: int | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def start(self) -> None:
        res = _make("remote-cache-start", f"REMOTE_CACHE_PORT={self.port}", f"REMOTE_CACHE_DIR={self.state}", timeout=120)
        assert res.returncode == 0, f"make remote-cache-start failed:\n{res.stdout}{res.stderr}"
        self.pid = int((self.state / "server.pid").read_text())
        assert _alive(self.pid)

    def stop(self) -> None:
        _make("remote-cache-stop", f"REMOTE_CACHE_DIR={self.state}", timeout=60)
        if self.pid is not None and _alive(self.pid):  # never leave a server behind
            os.kill(self.pid, signal.SIGKILL)
        assert not (self.state / "server.pid").exists()

    def blobs(self) -> list[Path]:
        """The blobs the server holds on disk (BuildGrid's disk storage, not its temp files)."""
        root = self.state / "cas"
        return [p for p in root.rglob("*") if p.is_file() and "tmp" not in p.relative_to(root).parts]

    def blobs_naming(self, text: str) -> list[Path]:
        return [p for p in self.blobs() if text.encode() in p.read_bytes()]


@dataclass
class Workspace:
    root: Path
    bases: dict[str, Bazel]
    locks: Path

    def bazel(self, base: str) -> Bazel:
        if base not in self.bases:
            self.bases[base] = Bazel(self.root, startup=[f"--output_base={self.root.parent / base}"],
                                     python=sys.executable)
        return self.bases[base]

    def use(self, cache: Cache) -> None:
        """Point --config=remote_cache at ``cache`` the documented way: user.bazelrc."""
        (self.root / "user.bazelrc").write_text(f"build:remote_cache --remote_cache={cache.url}\n")

    def write_plan(self, plan: dict[str, Any] | None) -> None:
        path = self.root / ".fastci" / "plan.json"
        if plan is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(tie_json(plan, self.root)))  # obeyed on its tree only

    def flags(self, *extra: str) -> list[str]:
        return [*COMMON, f"--test_env=FASTCI_GPU_LOCK_DIR={self.locks}", *extra]

    def test(self, base: str, *extra: str) -> tuple[BazelResult, dict[str, dict[str, Any]]]:
        bep = self.root.parent / f"{base}.bep.json"
        res = self.bazel(base).test(("//gputests:all",), flags=self.flags(*extra), bep_path=bep)
        return res, _results(bep)

    def workload(self, base: str, label: str) -> dict[str, Any]:
        out = self.root.parent / base / "execroot" / "fastci_fixture" / "bazel-out" / "k8-fastbuild" / "testlogs"
        data = testlogs.read_output(out, label, "fastci_workload.json")
        assert data is not None, f"no fastci_workload.json for {label} in {base}"
        return json.loads(data)["workload"]


def _results(bep: Path) -> dict[str, dict[str, Any]]:
    """label -> {status, remote: served from the remote cache, local: cached locally}."""
    out: dict[str, dict[str, Any]] = {}
    for line in bep.read_text().splitlines():
        event = json.loads(line)
        result = event.get("testResult")
        if result is None:
            continue
        label = event["id"]["testResult"]["label"]
        out[label] = {
            "status": result.get("status"),
            "remote": bool(result.get("executionInfo", {}).get("cachedRemotely", False)),
            "local": bool(result.get("cachedLocally", False)),
        }
    return out


def _plan(tests: list[dict[str, Any]], skipped: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"version": 1, "mode": "selective", "reason": "remote cache test",
            "tests": tests, "skipped": list(skipped)}


@pytest.fixture(scope="module")
def buildgrid() -> None:
    """BuildGrid's own virtualenv, made by the make target when missing (never a skip)."""
    res = _make("remote-cache-setup")
    if res.returncode != 0 or not (REPO / ".venv-buildgrid" / "bin" / "bgd").is_file():
        pytest.fail("BuildGrid is not installed and `make remote-cache-setup` could not install it "
                    f"into .venv-buildgrid:\n{res.stdout[-2000:]}{res.stderr[-2000:]}", pytrace=False)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, buildgrid: None) -> Iterator[Workspace]:
    base = tmp_path_factory.mktemp("remote_cache")
    root = base / "ws"
    fixture_workspace(root)
    workspace = Workspace(root, {}, base / "locks")
    try:
        yield workspace
    finally:
        for bazel in workspace.bases.values():
            bazel.shutdown()
        remove_tree(base)


@pytest.fixture(scope="module")
def shared_cache(ws: Workspace) -> Iterator[Cache]:
    cache = Cache(ws.root.parent / "cache_shared")
    cache.start()
    try:
        yield cache
    finally:
        cache.stop()


@pytest.fixture()
def fresh_cache(ws: Workspace) -> Iterator[Cache]:
    cache = Cache(ws.root.parent / f"cache_{time.monotonic_ns()}")
    cache.start()
    try:
        yield cache
    finally:
        cache.stop()


def test_tests_come_back_from_the_cache_in_a_fresh_output_base(ws: Workspace, shared_cache: Cache) -> None:
    ws.use(shared_cache)
    ws.write_plan(None)
    res, first = ws.test("base1", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert {k: v["status"] for k, v in first.items()} == dict.fromkeys(TESTS, "PASSED")
    assert not any(r["remote"] or r["local"] for r in first.values()), first
    assert shared_cache.blobs_naming("gputests/a_test"), "nothing was uploaded"

    # A second output base has no local action cache: every result comes from BuildGrid.
    res, second = ws.test("base2", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert second == {label: {"status": "PASSED", "remote": True, "local": False} for label in TESTS}, second
    # Every test spawn is served (its test.xml spawn usually too, but whether that one
    # was uploaded in time varies: seen 6 and 3 hits); no test ran here.
    hits = re.search(r"INFO: \d+ processes: (\d+) remote cache hit", res.stderr)
    assert hits and int(hits.group(1)) >= len(TESTS), res.stderr[-2000:]
    assert "Executed 0 out of 3 tests" in res.stdout + res.stderr


def test_changing_one_tests_overrides_reruns_that_test_only(ws: Workspace, shared_cache: Cache) -> None:
    ws.use(shared_cache)
    planned = [{"id": "//gputests:b_test", "overrides": {"train_iters": 5}}, {"id": "//gputests:c_test"}]
    ws.write_plan(_plan([{"id": "//gputests:a_test", "overrides": {"train_iters": 2}}, *planned]))
    res, first = ws.test("base1", "--config=fastci", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not any(r["remote"] or r["local"] for r in first.values()), first
    assert ws.workload("base1", "//gputests:a_test")["train_iters"] == 2

    # Only a_test's overrides change; the fresh output base gets b_test and c_test from BuildGrid.
    ws.write_plan(_plan([{"id": "//gputests:a_test", "overrides": {"train_iters": 4}}, *planned]))
    res, second = ws.test("base2", "--config=fastci", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert second["//gputests:a_test"] == {"status": "PASSED", "remote": False, "local": False}, second
    for label in ("//gputests:b_test", "//gputests:c_test"):
        assert second[label] == {"status": "PASSED", "remote": True, "local": False}, (label, second)
    assert ws.workload("base2", "//gputests:a_test")["train_iters"] == 4
    assert ws.workload("base2", "//gputests:b_test")["train_iters"] == 5


def test_recorded_and_skipped_runs_are_never_uploaded(ws: Workspace, fresh_cache: Cache) -> None:
    ws.use(fresh_cache)
    ws.write_plan(None)
    # Recording: every test runs (evidence) and nothing at all reaches the cache.
    res, recorded = ws.test("base1", "--config=fastci_record", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert recorded == {label: {"status": "PASSED", "remote": False, "local": False} for label in TESTS}
    assert fresh_cache.blobs() == [], "a recorded run wrote into the remote cache: " + ", ".join(
        repr(p.read_bytes()[:60]) for p in fresh_cache.blobs())

    # A plan that skips b_test: a_test and c_test are uploaded, b_test is not even built.
    ws.write_plan(_plan([{"id": "//gputests:a_test", "overrides": {"train_iters": 6}}],
                        [{"id": "//gputests:b_test", "why": "not affected"}]))
    res, planned = ws.test("base1", "--config=fastci", "--config=remote_cache")
    assert res.returncode == 0, res.stderr[-3000:]
    assert set(planned) == {"//gputests:a_test", "//gputests:c_test"}, planned
    assert parse_bep(ws.root.parent / "base1.bep.json").skipped == ("//gputests:b_test",)
    assert fresh_cache.blobs_naming("gputests/a_test") and fresh_cache.blobs_naming("gputests/c_test")
    assert fresh_cache.blobs_naming("gputests/b_test") == []

    # Control: with test:fastci_record's two upload flags turned back, the same recording
    # does reach the CAS (the test.xml spawns, and the build event uploader's copies of
    # the test outputs, traces included), so the flags are what keep it out.
    ws.write_plan(None)
    before = len(fresh_cache.blobs())
    res, _ = ws.test("base1", "--config=fastci_record", "--config=remote_cache", "--remote_upload_local_results",
                     "--experimental_build_event_upload_strategy=remote")
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(fresh_cache.blobs()) > before
    assert fresh_cache.blobs_naming("fastci_traces")


def _test_processes(output_base: Path) -> list[int]:
    """Pids of test spawns (test-setup.sh under a sandbox) of this output base."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(output_base).encode() in cmdline and b"test-setup.sh" in cmdline:
            pids.append(int(proc.name))
    return pids


def test_cache_dying_mid_run_falls_back_to_local_execution(ws: Workspace, fresh_cache: Cache) -> None:
    ws.use(fresh_cache)
    ws.write_plan(None)
    bazel = ws.bazel("base2")
    bep = ws.root.parent / "dies.bep.json"
    # A new test_env value: new keys, so the tests really run (4 s each) while the server dies.
    argv = bazel.argv("test", [f"--build_event_json_file={bep}", *ws.flags("--config=remote_cache", "--test_env=FIXTURE_SLEEP_S=4"),
                               "--", "//gputests:all"])
    proc = subprocess.Popen(argv, cwd=ws.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not _test_processes(ws.root.parent / "base2"):
            assert proc.poll() is None, f"bazel ended before any test started:\n{proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "no test started within 180 s"
            time.sleep(0.05)
        assert fresh_cache.pid is not None
        os.kill(fresh_cache.pid, signal.SIGKILL)  # the server crashes while the tests run
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    results = _results(bep)
    assert results == {label: {"status": "PASSED", "remote": False, "local": False} for label in TESTS}, results
    assert "WARNING: Writing to Remote Cache:" in stderr, stderr[-3000:]
    assert "UNAVAILABLE" in stderr


def test_start_refuses_a_taken_port_with_a_clear_error(ws: Workspace, shared_cache: Cache) -> None:
    other = ws.root.parent / "cache_other"
    res = _make("remote-cache-start", f"REMOTE_CACHE_PORT={shared_cache.port}", f"REMOTE_CACHE_DIR={other}", timeout=60)
    assert res.returncode != 0
    assert f"port {shared_cache.port} on 127.0.0.1 is taken" in res.stderr, res.stderr
    assert not (other / "server.pid").exists()
    # The same state directory twice: refused too, and the first server keeps running.
    res = _make("remote-cache-start", f"REMOTE_CACHE_PORT={_free_port()}", f"REMOTE_CACHE_DIR={shared_cache.state}", timeout=60)
    assert res.returncode != 0 and "already runs" in res.stderr, res.stderr
    assert shared_cache.pid is not None and _alive(shared_cache.pid)
