"""``make bench`` fails on a miss and never measures old code (issue 11 item 13); no Bazel."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import demo, evidence, selection
from fastci.evidence.store.db import EvidenceStore
from selection_support import Repo


def test_evidence_bench_fails_over_target() -> None:
    ok = ["recording overhead (x):", "  recorder / plain = 1.10x CPU (target <= 1.5x: OK)"]
    over = ["recording overhead (x):", "  recorder / plain = 2.10x CPU (target <= 1.5x: OVER TARGET)"]
    assert evidence.exit_code(ok) == 0
    assert evidence.exit_code(over) == 1


def test_selection_report_labels_cost_as_cpu_seconds_times_gpus() -> None:
    row = selection.Outcome("p", "bug", 1, 3, 2.0, 6.0, ("//t:a",), (), 0.1, "")
    lines = selection.report([row], full=False)
    assert "GPU-s" not in "\n".join(lines)
    assert "CPU-s x GPUs" in lines[0] and "not GPU time" in lines[0]
    assert "CPU-s x GPUs 2 vs 6" in lines[-1]


def _snapshot(tmp_path: Path) -> tuple[Repo, Path]:
    src = Repo(tmp_path / "src")
    src.commit({"examples/m.py": "X = 1\n", "docs/a.md": "a\n", "bench/b.py": "B = 1\n"})
    ws = tmp_path / "ws"
    demo.make_workspace(src.root, ws)
    return src, ws


@pytest.mark.parametrize("edit", ["docs/a.md", "bench/b.py", "examples/m.py", "new_file.py"])
def test_snapshot_is_reused_only_with_the_checkouts_sources(tmp_path: Path, edit: str) -> None:
    src, ws = _snapshot(tmp_path)
    assert demo.snapshot_is_current(src.root, ws, echo=lambda _: None)
    src.write({edit: "changed = True\n"})  # any source the benchmark could measure
    said: list[str] = []
    assert not demo.snapshot_is_current(src.root, ws, echo=said.append)
    assert said and "not the checkout's" in said[0]


def test_prepare_with_reuse_copies_again_when_the_checkout_moved_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = _snapshot(tmp_path)
    monkeypatch.setenv("FASTCI_DEMO_DIR", str(tmp_path / "scratch"))
    monkeypatch.setattr(demo, "REPO", src.root)
    ws = tmp_path / "scratch" / "workspace"
    demo.make_workspace(src.root, ws)
    cfg = demo.load_config(ws, overrides={"targets": demo.TARGETS})
    cfg.path(ws, "store").parent.mkdir(parents=True, exist_ok=True)
    EvidenceStore.open(cfg.path(ws, "store"), create=True).close()

    class Copied(Exception):
        pass

    def refuse_copy(repo: Path, dest: Path) -> tuple[str, str]:
        raise Copied

    said: list[str] = []
    monkeypatch.setattr(demo, "make_workspace", refuse_copy)
    assert demo.prepare(said.append, reuse=True).ws == ws  # same sources: reused
    assert any("reusing the scratch snapshot" in line for line in said)
    src.write({"examples/m.py": "X = 2\n"})
    with pytest.raises(Copied):
        demo.prepare(said.append, reuse=True)
