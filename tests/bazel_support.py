"""The one gate every test that runs the real Bazel goes through.

Locally a machine without ``bazel`` skips those tests (``make setup`` installs it);
under ``CI`` (any value but empty, ``0`` or ``false``) a missing ``bazel`` fails the
module instead: a CI job that silently skipped every end-to-end test would pass
while checking nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def on_ci() -> bool:
    """Whether ``$CI`` says this is a CI job (GitHub, GitLab and most others set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_bazel() -> None:
    """Call at module level: skip the module without ``bazel``, or fail it under CI."""
    if shutil.which("bazel") is not None:
        return
    if on_ci():
        pytest.fail("bazel not found on PATH and CI is set: the Bazel end-to-end tests "
                    "cannot be skipped in CI (install it: `make setup`)", pytrace=False)
    pytest.skip("bazel not found on PATH (installed by `make setup`); "
                "under CI=true this is a failure", allow_module_level=True)


def remove_tree(base: Path) -> None:
    """Delete a test's Bazel scratch tree (its output base holds read-only files)."""
    subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def fixture_workspace(root: Path) -> Path:
    """A copy of ``tests/bazel_fixture`` at ``root`` that loads this checkout's rules and
    settings: its ``WORKSPACE`` points at the repository and its ``.bazelrc`` imports the
    repository's, with this interpreter as the venv toolchain. Returns ``root``."""
    import sys

    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "tests" / "bazel_fixture", root)
    ws = root / "WORKSPACE"
    ws.write_text(ws.read_text().replace('path = "../.."', f'path = "{repo}"'))
    (root / ".bazelrc").write_text(f"import {repo}/.bazelrc\n"
                                   f"build --repo_env=FASTCI_PYTHON={sys.executable}\n")
    return root
