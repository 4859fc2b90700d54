"""Evidence recorded from a modified tree is stamped ``dirty:<tree>``, never ``HEAD``.

A test process records a real trace of ``pkg/model.py`` while the working tree
holds an uncommitted edit of it; ``fastci ingest`` (and ``fastci record``) must
not pass that evidence off as ``HEAD``'s, so a later plan on the clean commit
compares the recorded checksums and runs the test whose unit differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from fastci import cli
from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.integrations.bazel.runner import BazelResult
from fastci.evidence.fill import record
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore
from fastci.select import DecisionKind
from fastci.integrations.git.tree import worktree_tree
from selection_support import MODEL, OTHER, Repo

RUNNER = """\
import sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd()))
from fastci.evidence.record.recorder import Recorder
rec = Recorder(sys.argv[2], Path(sys.argv[1]), repo_root=Path.cwd(), workload={}, gpus=1)
rec.start()
import pkg.model
pkg.model.scale(1)
rec.stop("passed")
"""
#: An uncommitted edit of the unit //t:a executes (another size: see the report on tree.py).
DIRTY = MODEL.replace("return x * 2", "return x * 2 + 1")


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Repo:
    r = Repo(tmp_path / "repo")
    r.commit({"pkg/__init__.py": "", "pkg/model.py": MODEL, "pkg/other.py": OTHER,
              ".gitignore": "__pycache__/\n"})
    (tmp_path / "runner.py").write_text(RUNNER)
    monkeypatch.chdir(r.root)
    return r


def run_test(repo: Repo, out: Path, test: str = "//t:a") -> None:
    """Run ``test`` (it calls pkg.model.scale) under the recorder, traces into ``out``."""
    subprocess.run([sys.executable, str(repo.root.parent / "runner.py"), str(out), test],
                   cwd=repo.root, check=True, capture_output=True, timeout=120)


def plan_on_clean_head(repo: Repo, store: EvidenceStore) -> dict[str, set[DecisionKind]]:
    """Test -> reason kinds of a plan for the clean ``HEAD`` (the recorded environment)."""
    fp = store.latest_runs()["//t:a"].env_fingerprint
    a = analyze(repo.root, Config(), base="HEAD", declared=Given(None), environment=KnownFingerprint(fp), store=store)
    return {d.test: {r.kind for r in d.reasons} for d in a.selection.decisions}


def test_ingest_from_a_dirty_tree_is_stamped_dirty_and_compared(
        repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = repo.git("rev-parse", "HEAD")
    repo.write({"pkg/model.py": DIRTY})
    run_test(repo, tmp_path / "traces")
    tree = worktree_tree(repo.root)
    db = tmp_path / "e.db"
    assert cli.main(["ingest", str(tmp_path / "traces"), "--store", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"recorded from a modified tree: evidence stamped dirty:{tree[:12]}" in out
    assert "plans compare every recorded file" in out
    with EvidenceStore.open(db) as store:
        assert store.evidence_commits() == {f"dirty:{tree}"}
        assert store.latest_runs()["//t:a"].commit == f"dirty:{tree}"
        repo.write({"pkg/model.py": MODEL})  # back to the clean commit
        assert worktree_tree(repo.root) == repo.git("rev-parse", "HEAD^{tree}")
        kinds = plan_on_clean_head(repo, store)
    # The evidence describes the edit, not HEAD: scale's recorded checksum differs.
    assert DecisionKind.CHANGED_UNIT in kinds["//t:a"], kinds
    with EvidenceStore.open(db) as store:
        fp = store.latest_runs()["//t:a"].env_fingerprint
        notes = analyze(repo.root, Config(), base="HEAD", declared=Given(None), environment=KnownFingerprint(fp),
                        store=store).selection.notes
    assert any(n.startswith("some evidence was recorded from a modified tree (dirty:")
               for n in notes), notes

    # Recorded again from the clean tree: stamped HEAD, trusted, nothing to run.
    run_test(repo, tmp_path / "traces2")
    assert cli.main(["ingest", str(tmp_path / "traces2"), "--store", str(db)]) == 0
    assert "modified tree" not in capsys.readouterr().out
    with EvidenceStore.open(db) as store:
        assert store.evidence_commits() == {base}
        assert plan_on_clean_head(repo, store) == {"//t:a": {DecisionKind.NOT_AFFECTED}}


def test_an_explicit_commit_still_wins(repo: Repo, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    repo.write({"pkg/model.py": DIRTY})
    run_test(repo, tmp_path / "traces")
    db = tmp_path / "e.db"
    assert cli.main(["ingest", str(tmp_path / "traces"), "--store", str(db),
                     "--commit", "c0ffee"]) == 0
    assert "modified tree" not in capsys.readouterr().out
    with EvidenceStore.open(db) as store:
        assert store.evidence_commits() == {"c0ffee"}


class FakeBazel:
    """Stands in for ``bazel test --config=fastci_record``: runs the test, writes the BEP."""

    def __init__(self, repo: Repo, testlogs: Path) -> None:
        self.repo, self.testlogs = repo, testlogs

    def test(self, targets: Sequence[str], *, flags: Sequence[str] = (),
             bep_path: Path | None = None, **_: Any) -> BazelResult:
        assert bep_path is not None and "--config=fastci_record" in flags
        run_test(self.repo, self.testlogs / "t" / "a" / "test.outputs" / "fastci_traces")
        bep_path.write_text(json.dumps({
            "id": {"testSummary": {"label": "//t:a"}},
            "testSummary": {"overallStatus": "PASSED", "totalRunDurationMillis": "1000"}}) + "\n")
        return BazelResult(("bazel", "test"), 0, "", "", bep_path)

    def info(self, key: str) -> str:
        assert key == "bazel-testlogs"
        return str(self.testlogs)


def test_record_from_a_dirty_tree_is_stamped_dirty(repo: Repo, tmp_path: Path) -> None:
    repo.write({"pkg/model.py": DIRTY})
    tree = worktree_tree(repo.root)
    db = tmp_path / "e.db"
    summary = record(repo.root, ["//t:a"], db, bazel=FakeBazel(repo, tmp_path / "testlogs"))  # type: ignore[arg-type]
    assert summary.splitlines()[0] == "1 passed, 0 failed"
    assert summary.splitlines()[-1].startswith(
        f"recorded from a modified tree: evidence stamped dirty:{tree[:12]}")
    with EvidenceStore.open(db) as store:
        assert store.evidence_commits() == {f"dirty:{tree}"}
        repo.write({"pkg/model.py": MODEL})
        assert DecisionKind.CHANGED_UNIT in plan_on_clean_head(repo, store)["//t:a"]
