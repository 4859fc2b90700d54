"""The recorder in real processes: units, files read, children, kills, runfiles paths."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastci.evidence.record import trace
from trace_support import file_units
from fastci.evidence.record.files import PathMapper
from fastci.evidence.store.ingest import Checksums, merge_run
from fastci.units.index import FileUnits, index_source

ANALYZER = Path(__file__).resolve().parents[1] / "analyzer"

WORK = '''
import os
import torch


def compute(n):
    total = 0
    for i in range(n):
        total += helper(i)
    return total


def helper(i):
    return i * 2


def never_called():
    return 0


def child_only():
    return "child"


def rank_main(rank, world):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        reduce_grads(torch.ones(4))
    finally:
        dist.destroy_process_group()


def reduce_grads(t):
    import torch.distributed as dist
    dist.all_reduce(t)
    return t
'''

DRIVER = '''
import os, signal, subprocess, sys
from pathlib import Path
from fastci.evidence.record.recorder import Recorder


def main():
    mode, out = sys.argv[1], Path(sys.argv[2])
    rec = Recorder("//t:x_test", out, repo_root=Path(__file__).parent,
                   workload={"steps": 2}, gpus=0)
    rec.start()
    import pkg.work as w
    w.compute(3)
    with open(os.path.join(os.path.dirname(__file__), "data", "config.json")) as f:
        f.read()
    if mode == "subprocess":
        subprocess.run([sys.executable, "-c", "import pkg.work as w; w.child_only()"], check=True)
    elif mode == "spawn":
        import socket
        import torch.multiprocessing as mp
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ["MASTER_PORT"] = str(port)
        mp.spawn(w.rank_main, args=(2,), nprocs=2, join=True)
    elif mode == "fork":
        import multiprocessing as mproc
        p = mproc.get_context("fork").Process(target=w.child_only)
        p.start()
        p.join()
        assert p.exitcode == 0
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "segment":
        rec.begin_segment("sess/fx1:setup")
        w.child_only()
        with open(os.path.join(os.path.dirname(__file__), "data", "seg.txt")) as f:
            f.read()
        rec.begin_segment("sess/fx2:setup")  # a fixture set up by another: nested
        w.helper(7)
        assert rec.end_segment() == "sess/fx2:setup"
        assert rec.end_segment() == "sess/fx1:setup"
        w.never_called()
        rec.shared.add("sess/c3")
    print(rec.stop("passed"))


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recrepo")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "work.py").write_text(textwrap.dedent(WORK))
    (root / "data").mkdir()
    (root / "data" / "config.json").write_text('{"lr": 0.1}\n')
    (root / "data" / "seg.txt").write_text("x\n")
    (root / "drive.py").write_text(textwrap.dedent(DRIVER))
    return root


def drive(repo: Path, mode: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(repo / "drive.py"), mode, str(out)], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=300)


def traces(out: Path) -> list[trace.Trace]:
    return [trace.read(p) for p in sorted(out.glob("*.trace"))]


def units_of(t: trace.Trace) -> dict[str, list[str]]:
    return {f"{f.path}::{q}": sigs for f in t.files for q, _, sigs in file_units(t, f)}


def test_records_units_files_and_environment(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "plain", tmp_path)
    assert res.returncode == 0, res.stderr
    (t,) = traces(tmp_path)
    assert (t.test_id, t.role, t.complete, t.outcome, t.gpus) == ("//t:x_test", "main", True,
                                                                   "passed", 0)
    assert json.loads(t.workload_json) == {"steps": 2}
    units = units_of(t)
    # drive.py::main called start(): frames running before start() are not traced.
    assert {"pkg/work.py::compute", "pkg/work.py::helper", "pkg/work.py::<module>"} <= set(units)
    assert "pkg/work.py::never_called" not in units
    assert all(not u.startswith((".venv", "/")) and "site-packages" not in u for u in units)
    assert any("caller=pkg/work.py::compute" in s for s in units["pkg/work.py::helper"])
    work = next(f for f in t.files if f.path == "pkg/work.py")
    source = (repo / "pkg" / "work.py").read_bytes()
    assert work.digest == hashlib.sha256(source).hexdigest()
    assert not any(c for _, c, _ in file_units(t, work))  # computed at ingest
    run = merge_run([t], source="bazel", commit=None, checksums=Checksums(repo))
    full = index_source("pkg/work.py", source)
    assert isinstance(full, FileUnits)
    assert run.units["pkg/work.py::compute"][0] == full.by_qualname()["compute"].checksum
    # Once the file changed, the recorded checksums are unknown (''), never today's.
    moved = tmp_path / "moved"
    shutil.copytree(repo, moved)
    (moved / "pkg" / "work.py").write_bytes(source + b"\nX = 1\n")
    stale = merge_run([t], source="bazel", commit=None, checksums=Checksums(moved))
    assert stale.units["pkg/work.py::compute"][0] == ""
    assert [r.path for r in t.reads] == ["data/config.json"]
    env = t.environment
    assert env.fingerprint and env.python.startswith("3.") and env.torch.startswith("2.")
    assert t.duration_s > 0


def test_subprocess_child_is_recorded_and_merged(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "subprocess", tmp_path)
    assert res.returncode == 0, res.stderr
    ts = traces(tmp_path)
    assert sorted(t.role for t in ts) == ["child", "main"]
    assert len({t.run_id for t in ts}) == 1
    child = next(t for t in ts if t.role == "child")
    assert child.complete and child.parent_pid != child.pid
    run = merge_run(ts, source="pytest", commit=None)
    assert run.complete and "pkg/work.py::child_only" in run.units
    assert "pkg/work.py::compute" in run.units
    # The child's environment variables did not leak past stop().
    assert "FASTCI_RECORD_CHILD" not in os.environ


def test_torch_spawned_ranks_are_recorded_with_rank_contexts(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "spawn", tmp_path)
    assert res.returncode == 0, res.stderr
    ts = traces(tmp_path)
    assert sorted(t.role for t in ts) == ["child", "child", "main"]
    assert all(t.complete for t in ts)
    run = merge_run(ts, source="bazel", commit=None)
    sigs = run.units["pkg/work.py::reduce_grads"][1]
    assert {s.split("rank=")[1].split("|")[0] for s in sigs} == {"0/2", "n/2"}
    assert any("T(f32,1d,cpu,s)" in s for s in sigs)


def test_forked_child_is_recorded(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "fork", tmp_path)
    assert res.returncode == 0, res.stderr
    ts = traces(tmp_path)
    assert sorted(t.role for t in ts) == ["child", "main"] and all(t.complete for t in ts)
    child = next(t for t in ts if t.role == "child")
    assert "pkg/work.py::child_only" in units_of(child)
    main = next(t for t in ts if t.role == "main")
    assert "pkg/work.py::child_only" not in units_of(main)


def test_killed_process_leaves_incomplete_trace(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "kill", tmp_path)
    assert res.returncode == -9
    (t,) = traces(tmp_path)
    assert not t.complete and t.test_id == "//t:x_test" and not t.files
    run = merge_run([t], source="bazel", commit=None)
    assert not run.complete and run.outcome == "error"


def test_runfiles_symlinks_map_to_repo_paths(repo: Path, tmp_path: Path) -> None:
    runfiles = tmp_path / "x_test.runfiles"
    ws = runfiles / "fastci"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "work.py").symlink_to(repo / "pkg" / "work.py")
    (ws / "external" / "dep").mkdir(parents=True)
    (ws / "external" / "dep" / "d.py").write_text("")
    (runfiles / "pypi" / "site-packages").mkdir(parents=True)
    env = {"RUNFILES_DIR": str(runfiles), "TEST_WORKSPACE": "fastci"}
    from fastci.evidence.record import files

    roots = files.runfiles_roots(env)
    assert str(ws) in roots
    mapper = PathMapper(ws, extra_roots=roots + files.symlink_source_roots(str(ws)))
    assert mapper.rel(str(ws / "pkg" / "work.py")) == "pkg/work.py"
    assert mapper.rel(str(repo / "pkg" / "work.py")) == "pkg/work.py"  # resolved name
    assert mapper.rel(str(ws / "external" / "dep" / "d.py")) is None
    assert mapper.rel(str(runfiles / "pypi" / "site-packages" / "m.py")) is None
    assert mapper.rel("/usr/lib/python3.11/os.py") is None
    assert mapper.rel("<string>") is None


def test_environment_fingerprint_tracks_packages_not_cwd(tmp_path: Path) -> None:
    from fastci.evidence.record import environment

    site = tmp_path / "site-packages"
    (site / "torch-2.13.0.dist-info").mkdir(parents=True)
    first = environment.packages_digest([str(site)])
    (site / "numpy-2.0.dist-info").mkdir()
    second = environment.packages_digest([str(site)])
    (site / "torch-2.13.0.dist-info").rename(site / "torch-2.14.0.dist-info")
    third = environment.packages_digest([str(site)])
    assert len({first, second, third}) == 3
    code = "from fastci.evidence.record.environment import current_fingerprint as f; print(f())"
    prints = {subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                             text=True, check=True).stdout for cwd in (tmp_path, Path.cwd())}
    assert len(prints) == 1


def test_segments_take_what_runs_between_begin_and_end(repo: Path, tmp_path: Path) -> None:
    res = drive(repo, "segment", tmp_path)
    assert res.returncode == 0, res.stderr
    (t,) = traces(tmp_path)
    own = units_of(t)
    assert "pkg/work.py::never_called" in own and "pkg/work.py::compute" in own
    assert "pkg/work.py::child_only" not in own  # it ran only inside the segment
    assert [r.path for r in t.reads] == ["data/config.json"]
    segs = {s.key: s for s in t.segments}
    assert set(segs) == {"sess/fx1:setup", "sess/fx2:setup"}
    outer, inner = segs["sess/fx1:setup"], segs["sess/fx2:setup"]
    assert list(outer.includes) == ["sess/fx2:setup"] and not inner.includes
    assert {q for f in outer.files for q, _, _ in file_units(t, f)} == {"child_only"}
    assert [r.path for r in outer.reads] == ["data/seg.txt"]
    assert {q for f in inner.files for q, _, _ in file_units(t, f)} == {"helper"}
    (sig,) = [s for f in inner.files for _, _, sigs in file_units(t, f) for s in sigs]
    assert sig.startswith("args(i=7)|caller=drive.py::main")  # not the test's own calls
    assert list(t.shared) == ["sess/c3"]


def test_files_a_test_writes_or_removes_are_not_its_inputs(tmp_path: Path) -> None:
    from fastci.evidence.record.files import OpenRecorder, PathMapper

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.txt").write_text("input\n")
    rec = OpenRecorder(PathMapper(tmp_path, extra_roots=[]))
    rec.start()
    try:
        (tmp_path / "data" / "in.txt").read_text()
        ckpt = tmp_path / "iter_0000002"
        ckpt.write_bytes(b"weights")  # saved, then loaded back: output, not input
        ckpt.read_bytes()
        scratch = tmp_path / "scratch.tmp"
        scratch.write_text("x")
        os.chmod(scratch, 0o644)
        with open(scratch) as f:
            f.read()
        scratch.unlink()
    finally:
        reads = rec.stop()
    assert reads == {"data/in.txt": hashlib.sha256(b"input\n").hexdigest()}


LINE_MODE_LIB = '''
import threading


def branchy(x):
    if x > 0:
        return x
    return -x


def in_thread(out):
    out.append(branchy(3))


def run():
    out = []
    t = threading.Thread(target=in_thread, args=(out,))
    t.start()
    t.join()
    return out
'''

LINE_MODE_DRIVE = '''
import sys
from pathlib import Path
from fastci.evidence.record.recorder import Recorder
rec = Recorder("t::line_mode", Path(sys.argv[1]), repo_root=Path("."), workload={}, gpus=0)
rec.start()
import lm
assert lm.run() == [3]
rec.stop("passed")
'''


@pytest.mark.parametrize("line_mode", [True, False])
def test_line_mode_records_lines_arcs_and_contexts(tmp_path: Path, line_mode: bool) -> None:
    # What `fastci calibrate` needs (issue 13): executed lines and arcs per file, and
    # the units' contexts, also from threads. Without line mode: units and contexts only.
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "lm.py").write_text(LINE_MODE_LIB)
    (proj / "drive.py").write_text(LINE_MODE_DRIVE)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(proj), str(ANALYZER)]),
               FASTCI_RECORD_LINES="1" if line_mode else "0")
    res = subprocess.run([sys.executable, "drive.py", str(out)], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    (t,) = traces(out)
    lm = next(f for f in t.files if f.path == "lm.py")
    units = units_of(t)
    assert {"lm.py::branchy", "lm.py::in_thread", "lm.py::run"} <= set(units)
    assert any("args(x=int)" in s or "x=" in s for s in units["lm.py::branchy"])
    text = LINE_MODE_LIB.splitlines()
    taken, not_taken = text.index("        return x") + 1, text.index("    return -x") + 1
    ran = trace.delta_decode(list(lm.line_deltas))
    pairs = list(zip(lm.arcs[::2], lm.arcs[1::2]))
    if line_mode:
        assert taken in ran and not_taken not in ran
        assert (taken - 1, taken) in pairs and (taken - 1, not_taken) not in pairs
    else:
        assert ran == [] and pairs == []


QUALNAME_SOURCE = '''
import functools

square = lambda x: x * x
values = [v for v in range(3)]


class Outer:
    attr = {k: k for k in range(2)}

    class Inner:
        def method(self):
            return (i for i in range(2))

    @functools.cache
    def cached(self):
        def nested():
            return lambda: 1
        return nested


async def agen():
    yield [z async for z in agen()]


def outer():
    class Local:
        def m(self):
            return sorted(range(3), key=lambda n: -n)
    return Local
'''


def test_unit_qualnames_without_parsing_agree_with_the_line_index() -> None:
    # A call-event-only trace keeps the qualnames of code objects that name units
    # (trace_files._is_unit_qualname), without parsing the file: the same set as the index's.
    from fastci.evidence.record.trace_files import _is_unit_qualname
    from fastci.units.lines import LineIndex, line_index

    index = line_index("q.py", QUALNAME_SOURCE)
    assert isinstance(index, LineIndex)
    codes, todo = [], [compile(QUALNAME_SOURCE, "q.py", "exec")]
    while todo:
        code = todo.pop()
        codes.append(code)
        todo.extend(c for c in code.co_consts if hasattr(c, "co_qualname"))
    seen = {c.co_qualname if c.co_name != "<module>" else "<module>" for c in codes}
    assert {q for q in seen if _is_unit_qualname(q)} == set(index.qualnames)
    assert any("<lambda>" in q for q in seen) and any("<genexpr>" in q for q in seen)
