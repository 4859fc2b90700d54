"""Shared helpers for tests that plan against real recorded evidence: a small pytest project
committed, run with ``--fastci-record``, its traces ingested; then an edit planned."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from fastci.config import Config
from fastci.evidence.store.ingest import find_traces, ingest
from fastci.evidence.store.db import EvidenceStore
from fastci.plan.planner import analyze
from fastci.plan.analysis import Analysis
from fastci.plan.inputs import Given, KnownFingerprint
from selection_support import Repo, env_now


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pytest -q args`` in ``root``, its modules importable, no cache or bytecode left."""
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def record(root: Path, files: Mapping[str, str], *args: str,
           passed: int) -> tuple[Repo, EvidenceStore, str]:
    """Commit ``files`` as a git repository at ``root``, run ``pytest args`` in it recorded,
    and ingest its traces at that commit into a new store next to ``root``.

    Asserts that ``passed`` tests passed and that each left one complete run.

    Returns:
        The repository, the open store (the caller closes it) and the commit.
    """
    repo = Repo(root)
    base = repo.commit(files)
    traces = root.parent / "traces"
    res = run_pytest(root, "-p", "fastci.pytest.plugin", "--fastci-record",
                     f"--fastci-trace-dir={traces}", *args)
    assert f"{passed} passed" in res.stdout, res.stdout + res.stderr
    store = EvidenceStore.open(root.parent / "e.db", create=True)
    report = ingest(store, find_traces([traces]), source="pytest", commit=base, root=root)
    assert report.runs_added == passed and not report.corrupt \
        and not report.incomplete_tests, report
    return repo, store, base


@contextmanager
def edited(path: Path, old: str, new: str) -> Iterator[None]:
    """``path`` with ``old`` (which must be in it) replaced by ``new``, restored after."""
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    try:
        yield
    finally:
        path.write_text(text)


def plan_now(root: Path, base: str, store: EvidenceStore) -> Analysis:
    """The plan of the working tree at ``root`` against ``base``, in this environment."""
    return analyze(root, Config(), base=base, declared=Given(None), environment=KnownFingerprint(env_now()),
                   store=store)
