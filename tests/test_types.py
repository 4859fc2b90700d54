"""fastci.types: the one parser of test ids (Bazel labels and pytest node ids).

The accept/reject decisions and normalized forms are held to the shared corpus
in tests/test_plan_corpus.py; this file covers what only Python has.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci.errors import FastCIError
from fastci.types import Label, LabelError, as_label, normalize_test_id, parse_label


def test_parse_label_parts() -> None:
    assert parse_label("//p/q:t") == Label("", "p/q", "t")
    assert parse_label("@//p/q") == Label("", "p/q", "q")
    assert parse_label("@r//:t") == Label("r", "", "t")
    assert parse_label("@r") == Label("r", "", "r")
    assert str(Label("r", "p", "t")) == "@r//p:t" and str(Label("", "", "t")) == "//:t"


def test_source_path_of_this_repository_only() -> None:
    assert parse_label("//p/q:sub/x.py").source_path() == "p/q/sub/x.py"
    assert parse_label("@//p:x.py").source_path() == "p/x.py"
    assert parse_label("//:top.py").source_path() == "top.py"
    assert parse_label("@r//p:x.py").source_path() is None


def test_testlogs_dir(tmp_path: Path) -> None:
    assert parse_label("//p/q:t").testlogs_dir(tmp_path) == tmp_path / "p" / "q" / "t"
    assert parse_label("//:t").testlogs_dir(tmp_path) == tmp_path / "t"
    assert parse_label("@r//p:t").testlogs_dir(tmp_path) == tmp_path / "external" / "r" / "p" / "t"


def test_label_error_is_one_line_and_catchable_both_ways() -> None:
    with pytest.raises(LabelError) as info:
        parse_label("//p:t\nrm -rf /")
    assert isinstance(info.value, FastCIError) and isinstance(info.value, ValueError)
    assert str(info.value) == "'//p:t\\nrm -rf /' is not a valid Bazel label: it contains whitespace"


def test_as_label_and_normalize_never_raise() -> None:
    assert as_label("tests/t.py::x") is None and as_label("//p:") is None
    assert as_label("@//p") == Label("", "p", "p")
    for text in ("//p:", "@", "tests/t.py::x", "//p/q", "@r"):
        once = normalize_test_id(text)
        assert normalize_test_id(once) == once
