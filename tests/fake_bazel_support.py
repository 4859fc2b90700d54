"""A stand-in ``bazel`` for command tests that need Bazel's answers, not Bazel.

:func:`install_fake_bazel` writes a Python script as ``$FASTCI_BAZEL`` into a fresh
one-commit repository and points the script at an empty testlogs folder and the
outcomes it should report (``$FAKE_TESTLOGS``, ``$FAKE_OUTCOMES``); the script itself
(how it answers ``bazel test``) is the caller's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from selection_support import Repo


def install_fake_bazel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str,
                       outcomes: dict[str, str]) -> Repo:
    """``script`` (``{python}`` filled in) as ``$FASTCI_BAZEL``; cwd is a new repository."""
    repo = Repo(tmp_path / "repo")
    repo.commit({"WORKSPACE": "", "README": "x\n"})
    fake = tmp_path / "fake_bazel"
    fake.write_text(script.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "testlogs").mkdir()
    monkeypatch.setenv("FASTCI_BAZEL", str(fake))
    monkeypatch.setenv("FAKE_TESTLOGS", str(tmp_path / "testlogs"))
    monkeypatch.setenv("FAKE_OUTCOMES", json.dumps(outcomes))
    monkeypatch.delenv("FASTCI_STORE", raising=False)
    monkeypatch.chdir(repo.root)
    return repo
