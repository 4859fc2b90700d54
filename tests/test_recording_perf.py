"""Recording overhead cuts keep the evidence: engine reuse, cached probes, trace cleanup."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastci.evidence.record import environment, recorder, trace


def _units(path: Path) -> dict[str, list[str]]:
    """Repo file -> the units a trace says ran in it (coverage.py also names the
    importable files of measured packages that did not run: those have none)."""
    msg = trace.read(path)
    return {f.path: sorted(trace.names(f.qualnames)) for f in msg.files if f.qualnames}


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "ma.py").write_text(textwrap.dedent("""
        def fa(x):
            return x + 1
    """))
    (root / "pkg" / "mb.py").write_text(textwrap.dedent("""
        def fb(x):
            return x * 2
    """))
    monkeypatch.syspath_prepend(str(root))
    for name in ("pkg", "pkg.ma", "pkg.mb"):
        sys.modules.pop(name, None)
    return root


def _record(root: Path, out: Path, name: str, fn: str) -> tuple[Path, Any]:
    rec = recorder.Recorder(name, out, repo_root=root, workload={}, gpus=0, children=False)
    rec.start()
    engine = rec._cov
    mod = importlib.import_module("pkg.m" + fn[1])  # fa -> pkg.ma
    getattr(mod, fn)(1)
    return rec.stop("passed"), engine


def test_successive_recorders_reuse_one_engine_and_keep_evidence_apart(
        repo: Path, tmp_path: Path) -> None:
    import pkg.ma  # noqa: F401  (imported before: only the calls are each test's)
    import pkg.mb  # noqa: F401

    first, engine1 = _record(repo, tmp_path / "t", "t1", "fa")
    second, engine2 = _record(repo, tmp_path / "t", "t2", "fb")
    third, engine3 = _record(repo, tmp_path / "t", "t3", "fa")
    # One coverage engine for the process: building one costs ~20 ms per test.
    assert engine1 is engine2 is engine3
    assert _units(first).get("pkg/ma.py") == ["fa"]
    assert "pkg/mb.py" not in _units(first)
    # Nothing of the first recording leaks into the next ones.
    assert _units(second).get("pkg/mb.py") == ["fb"]
    assert "pkg/ma.py" not in _units(second)
    assert _units(third).get("pkg/ma.py") == ["fa"]
    assert "pkg/mb.py" not in _units(third)


def test_a_recorder_inside_another_gets_its_own_engine(repo: Path, tmp_path: Path) -> None:
    import pkg.ma
    import pkg.mb

    outer = recorder.Recorder("outer", tmp_path / "t", repo_root=repo, workload={}, gpus=0,
                              children=False)
    outer.start()
    pkg.ma.fa(1)
    inner_path, inner_engine = _record(repo, tmp_path / "t", "inner", "fb")
    outer_engine = outer._cov
    outer_path = outer.stop("passed")
    assert inner_engine is not outer_engine
    assert "pkg/ma.py" in _units(outer_path)
    assert _units(inner_path).get("pkg/mb.py") == ["fb"]
    assert "pkg/ma.py" not in _units(inner_path)


def test_reused_engine_traces_match_fresh_engine_traces(repo: Path, tmp_path: Path) -> None:
    import pkg.ma  # noqa: F401
    import pkg.mb  # noqa: F401

    _record(repo, tmp_path / "warm", "w1", "fa")
    warm, _ = _record(repo, tmp_path / "warm", "w2", "fb")
    recorder._ENGINES.clear()  # a fresh engine, as every test had before
    fresh, _ = _record(repo, tmp_path / "fresh", "w2", "fb")
    a, b = trace.read(warm), trace.read(fresh)
    assert [(f.path, list(f.line_deltas), [(u.qualname, list(u.contexts)) for u in f.units])
            for f in a.files] == \
        [(f.path, list(f.line_deltas), [(u.qualname, list(u.contexts)) for u in f.units])
         for f in b.files]
    assert list(a.contexts) == list(b.contexts)


def test_engine_built_without_coverage_call_stack_records_the_same(
        repo: Path, tmp_path: Path) -> None:
    """coverage.py's collector keeps no call stack for FastCI's engine (inspect.stack(),
    ~30 ms a process), its module is left as it was, and the evidence is unchanged."""
    from coverage import collector

    import pkg.ma  # noqa: F401

    before = collector.short_stack
    recorder._ENGINES.clear()
    path, engine = _record(repo, tmp_path / "t", "t1", "fa")
    assert collector.short_stack is before
    assert engine._collector.origin == "(call stack not kept by fastci)"
    assert _units(path).get("pkg/ma.py") == ["fa"]


def test_a_recorded_child_process_starts_without_numpy(tmp_path: Path) -> None:
    """What a child recorder imports at start-up is paid in every recorded process:
    numpy (~70 ms) and importlib.metadata are only needed by readers of traces."""
    analyzer = Path(__file__).resolve().parents[1] / "analyzer"
    code = ("import sys\nfrom fastci.evidence.record import child_start\n"
            "print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTCI_")}
    env["PYTHONPATH"] = str(analyzer)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


# ------------------------------------------------------------------ probe caching

@pytest.fixture
def probe_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(environment.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path / environment._PROBE_CACHE.format(uid=os.getuid())


def test_probe_output_is_kept_between_processes_by_key(
        probe_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str]) -> str:
        calls.append(cmd)
        return f"answer {len(calls)}\n"

    monkeypatch.setattr(environment, "_run", fake_run)
    cache = tmp_path / "ld.so.cache"
    cache.write_text("one")
    key = lambda: [environment._file_key(str(cache))]  # noqa: E731
    assert environment._cached_run(["/sbin/ldconfig", "-p"], key()) == "answer 1\n"
    # A new process (nothing in memory) reads the kept answer: the tool does not run.
    assert environment._cached_run(["/sbin/ldconfig", "-p"], key()) == "answer 1\n"
    assert len(calls) == 1
    cache.write_text("two, longer")  # the linker cache changed: ask again
    assert environment._cached_run(["/sbin/ldconfig", "-p"], key()) == "answer 2\n"
    # A missing key file: never cached.
    missing = [environment._file_key(str(tmp_path / "nope"))]
    environment._cached_run(["/sbin/ldconfig", "-p"], missing)
    environment._cached_run(["/sbin/ldconfig", "-p"], missing)
    assert len(calls) == 4
    assert probe_dir.stat().st_mode & 0o777 == 0o700


def test_failed_probe_is_not_kept(probe_dir: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(environment, "_run", lambda cmd: calls.append(1) or "")
    key = [environment._file_key(str(tmp_path))]
    assert environment._cached_run(["nvidia-smi"], key) == ""
    assert environment._cached_run(["nvidia-smi"], key) == ""
    assert len(calls) == 2


def test_probe_cache_in_a_folder_others_can_write_is_not_trusted(
        probe_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe_dir.mkdir()
    probe_dir.chmod(0o777)
    calls: list[int] = []
    monkeypatch.setattr(environment, "_run", lambda cmd: calls.append(1) or "x\n")
    key = [environment._file_key(str(tmp_path))]
    environment._cached_run(["ldconfig", "-p"], key)
    environment._cached_run(["ldconfig", "-p"], key)
    assert len(calls) == 2
    assert list(probe_dir.iterdir()) == []


def test_libraries_come_from_the_kept_listing(probe_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libcudart.so.12.4.127"
    lib.write_text("")
    link = tmp_path / "libcudart.so.12"
    link.symlink_to(lib)
    listing = (f"\tlibcudart.so.12 (libc6,x86-64) => {link}\n"
               "\tlibfoo.so.1 (libc6,x86-64) => /lib/libfoo.so.1\n")
    calls: list[int] = []
    monkeypatch.setattr(environment, "_run", lambda cmd: calls.append(1) or listing)
    monkeypatch.setattr(environment, "_find", lambda name, fb: "/sbin/ldconfig")
    ldcache = tmp_path / "ld.so.cache"
    ldcache.write_text("x")
    monkeypatch.setattr(environment, "_LD_SO_CACHE", str(ldcache))
    first = environment._libraries()
    assert environment._libraries() == first
    assert calls == [1]
    assert first == (f"libcudart.so.12 (libc6,x86-64) => {lib}",)
    # Only the lines that can matter are kept.
    kept = "".join(p.read_text() for p in probe_dir.iterdir())
    assert "libfoo" not in kept and "libcudart" in kept


def test_torch_distribution_version_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    environment._torch_distribution.cache_clear()
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: calls.append(name) or "9.9")
    try:
        assert environment._torch_versions() == ("9.9", "")
        assert environment._torch_versions() == ("9.9", "")
        assert calls == ["torch"]
    finally:
        environment._torch_distribution.cache_clear()


# ------------------------------------------------------------------ trace cleanup

def test_remove_ingested_deletes_only_trace_files(tmp_path: Path) -> None:
    msg = trace.Trace(format_version=trace.FORMAT_VERSION, test_id="t", run_id="r",
                      complete=True)
    done = trace.write_atomic(tmp_path / trace.file_name("t", "r", 1), msg)
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    gone = tmp_path / ("gone" + trace.SUFFIX)
    assert trace.remove_ingested([done, other, gone]) == 1
    assert not done.exists() and other.exists()
