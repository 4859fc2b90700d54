"""The names code under test imports from FastCI stay where the docs say, whatever the layout."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_annotate_is_reachable_at_its_stable_path_and_labels_contexts() -> None:
    import fastci
    from fastci.evidence.record import contexts

    assert fastci.annotate is contexts.annotate
    with fastci.annotate(phase="eval", tp=2):
        assert contexts._labels == {"phase": "eval", "tp": "2"}
    assert contexts._labels == {}


def test_an_unknown_name_is_an_attribute_error() -> None:
    import fastci

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fastci.nope  # noqa: B018


def test_importing_fastci_loads_no_recorder_until_annotate_is_used() -> None:
    code = ("import sys, fastci\n"
            "assert 'fastci.evidence.record.contexts' not in sys.modules\n"
            "fastci.annotate\n"
            "assert 'fastci.evidence.record.contexts' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
