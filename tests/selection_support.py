"""Shared helpers for the selection tests: a temporary git repo and a real store."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pytest

from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.config import Config
from fastci.evidence.store.db import EvidenceStore, RunEvidence
from fastci.select import DeclaredTest, Selection
from fastci.units.index import FileUnits, index_source


class Repo:
    """A throwaway git repository with helpers to write files and commit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.email", "t@example.com")
        self.git("config", "user.name", "t")
        self.git("config", "commit.gpgsign", "false")

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    def write(self, files: Mapping[str, str | None]) -> None:
        for rel, text in files.items():
            p = self.root / rel
            if text is None:
                p.unlink()
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)

    def commit(self, files: Mapping[str, str | None] | None = None, msg: str = "c") -> str:
        if files:
            self.write(files)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", msg)
        return self.git("rev-parse", "HEAD")


def units_of(root: Path, paths: Iterable[str]) -> dict[str, str]:
    """Unit id -> checksum for every unit of the given files (as on disk)."""
    out: dict[str, str] = {}
    for rel in paths:
        idx = index_source(rel, (root / rel).read_bytes())
        assert isinstance(idx, FileUnits), idx
        out.update({u.id: u.checksum for u in idx.units})
    return out


def model_repo(root: Path, *keep: str) -> tuple[Repo, str, dict[str, str]]:
    """A repository at ``root`` with :data:`MODEL` committed as ``pkg/model.py``: the
    repo, the commit, and the units (id -> checksum) whose qualname ends with one of
    ``keep`` (all of them without ``keep``)."""
    repo = Repo(root)
    base = repo.commit({"pkg/model.py": MODEL})
    units = units_of(repo.root, ["pkg/model.py"])
    return repo, base, {u: c for u, c in units.items() if not keep or u.endswith(keep)}


def env_now() -> str:
    """The current environment fingerprint (what the CLI compares with)."""
    from fastci.evidence.record.environment import current_fingerprint

    return current_fingerprint()


def ingest(store: EvidenceStore, test: str, units: Mapping[str, str], *, commit: str | None,
           env: str | None = None, outcome: str = "passed", complete: bool = True,
           files: Mapping[str, str] | None = None, workload: Mapping[str, object] | None = None,
           gpus: int = 1, duration_s: float = 10.0, contexts: Iterable[str] = ("ctx",)) -> None:
    """Ingest one recorded run of ``test`` that executed ``units``."""
    store.ingest(RunEvidence(
        test=test, run_key=f"{test}:{time.time_ns()}", outcome=outcome, complete=complete,
        duration_s=duration_s, gpus=gpus, workload=dict(workload or {}),
        recorded_at=time.time(), env_fingerprint=env or env_now(), commit=commit,
        units={u: (c, frozenset(contexts)) for u, c in units.items()}, files=dict(files or {})))


MODEL = '''"""Model code."""
HIDDEN = 4


def scale(x):
    return x * 2


def shift(x):
    return x + HIDDEN
'''
DATA = '''import json


def load(path):
    with open(path) as f:
        return json.load(f)
'''
OTHER = '''def other():
    return 3
'''


class World:
    """A repo with three recorded tests: a (model.scale), b (data + cfg.json), c (other)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = Repo(root)
        self.base = self.repo.commit({"pkg/model.py": MODEL, "pkg/data.py": DATA,
                                      "pkg/other.py": OTHER, "data/cfg.json": "{}\n",
                                      "docs/x.md": "doc\n", "README.md": "r\n"})
        units = units_of(root, ["pkg/model.py", "pkg/data.py", "pkg/other.py"])
        self.store = EvidenceStore.open(root / ".fastci/evidence.db", create=True)
        pick = lambda *ids: {u: units[u] for u in ids}  # noqa: E731
        ingest(self.store, "//t:a", pick("pkg/model.py::<module>", "pkg/model.py::scale"),
               commit=self.base)
        ingest(self.store, "//t:b", pick("pkg/data.py::<module>", "pkg/data.py::load"),
               commit=self.base, files={"data/cfg.json": "d1"})
        ingest(self.store, "//t:c", pick("pkg/other.py::<module>", "pkg/other.py::other"),
               commit=self.base)
        self.declared = {t: DeclaredTest(t, 1, {}, ()) for t in ("//t:a", "//t:b", "//t:c")}

    def plan(self, config: Config | None = None, env: str | None = None, **kw: object) -> Selection:
        declared = kw.pop("declared", self.declared)
        a = analyze(self.root, config or Config(), base=self.base, declared=Given(declared),  # type: ignore[arg-type]
                    environment=KnownFingerprint(env or env_now()), store=self.store, **kw)  # type: ignore[arg-type]
        return a.selection


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A fresh :class:`World` in a temporary directory."""
    w = World(tmp_path)
    yield w
    w.store.close()
