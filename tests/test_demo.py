"""Tests of the demo's pure helpers (the full demo runs Bazel for minutes: `make demo`)."""

from __future__ import annotations

from pathlib import Path

from bench import demo
from fastci.units.index import FileUnits, index_source
from selection_support import Repo


def test_make_workspace_copies_without_touching_the_checkout(tmp_path: Path) -> None:
    src = Repo(tmp_path / "src")
    src.commit({"examples/m.py": "X = 1\n", "docs/a.md": "a\n", ".gitignore": "/ignored.txt\n"})
    src.write({"untracked.py": "U = 1\n", "ignored.txt": "i\n", ".fastci/units.cache": "c"})
    status = src.git("status", "--porcelain")
    head = src.git("rev-parse", "HEAD")
    commit, digest = demo.make_workspace(src.root, tmp_path / "ws")
    ws = tmp_path / "ws"
    assert (ws / "untracked.py").exists() and not (ws / "ignored.txt").exists()
    assert not (ws / ".fastci/units.cache").exists()
    assert src.git("status", "--porcelain") == status and src.git("rev-parse", "HEAD") == head
    # Same sources, same commit (fixed dates) and same evidence key; docs do not matter.
    assert demo.make_workspace(src.root, ws) == (commit, digest)
    src.write({"docs/a.md": "changed\n"})
    assert demo.make_workspace(src.root, ws)[1] == digest
    src.write({"examples/m.py": "X = 2\n"})
    assert demo.make_workspace(src.root, ws)[1] != digest


def test_sample_change_falls_back_to_a_function_edit(tmp_path: Path) -> None:
    path = tmp_path / demo.SAMPLE[0]
    path.parent.mkdir(parents=True)
    path.write_text("def f(x):\n    return x\n\n\ndef g(y):\n    return y\n")
    before = index_source("a.py", path.read_text())
    what = demo.apply_sample_change(tmp_path)
    after = index_source("a.py", path.read_text())
    assert "g: added a no-op statement" in what
    assert isinstance(before, FileUnits) and isinstance(after, FileUnits)
    changed = {u.qualname for u, v in zip(before.units, after.units) if u.checksum != v.checksum}
    assert changed == {"g"}


def test_cached_evidence_is_restamped_to_the_new_snapshot(tmp_path: Path) -> None:
    from fastci.evidence.store.db import EvidenceStore
    from selection_support import ingest

    path = tmp_path / "e.db"
    with EvidenceStore.open(path, create=True) as store:
        ingest(store, "//t:a", {"a.py::<module>": "c1"}, commit="a" * 40)
    lines: list[str] = []
    demo._restamp(path, "b" * 40, lines.append)
    with EvidenceStore.open(path) as store:
        assert {r.commit for r in store.latest_runs().values()} == {"b" * 40}
    assert "re-stamped" in lines[0]
    demo._restamp(path, "b" * 40, lines.append)
    assert len(lines) == 1  # already current: nothing to say
