"""Read a test's undeclared outputs under ``bazel-testlogs``.

Bazel 4.2.3 always zips them into ``test.outputs/outputs.zip``
(``--nozip_undeclared_test_outputs`` does not exist before Bazel 5), so a
reader looks for the plain file first and then inside the zip.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from fastci.types import parse_label


def test_dir(testlogs: Path, label: str) -> Path:
    """``bazel-testlogs`` directory of a test label (``//p:t`` or ``@repo//p:t``).

    Raises:
        LabelError: ``label`` is not a well-formed label.
    """
    return parse_label(label).testlogs_dir(testlogs)


def read_output(testlogs: Path, label: str, name: str) -> bytes | None:
    """Return the undeclared output ``name`` of a test's last run, or None."""
    outputs = test_dir(testlogs, label) / "test.outputs"
    plain = outputs / name
    if plain.is_file():
        return plain.read_bytes()
    archive = outputs / "outputs.zip"
    if not archive.is_file():
        return None
    with zipfile.ZipFile(archive) as zf:
        try:
            return zf.read(name)
        except KeyError:
            return None

