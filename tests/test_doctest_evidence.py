"""A doctest is code: editing one selects the tests that run it (issue 34 item 7).

Checksums drop docstrings, so an edit to a doctest's examples or expected output
selected nothing. A docstring holding a doctest (``>>>``) now counts as the unit's
``doctest`` part; any other docstring edit stays free. End to end: a module with
doctests and a test file, recorded with ``pytest --doctest-modules``, planned after
each kind of edit.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fastci.changes.semantic_diff import ChangeKind
from fastci.evidence.store.db import EvidenceStore
from fastci.units.index import index_source

MATHX = textwrap.dedent('''\
    """Small maths.

    >>> 2 * 2
    4
    """


    def double(x):
        """Twice x.

        >>> double(2)
        4
        """
        return 2 * x


    def const():
        """A doctest that never calls its own function.

        >>> 1 + 1
        2
        """
        return 0


    def plain(x):
        """Prose only: no example."""
        return x
    ''')
TEST_M = textwrap.dedent('''\
    from mathx import double, plain


    def test_plain():
        assert plain(3) == 3


    def test_double():
        assert double(1) == 2
    ''')


def _checksums(source: str) -> dict[str, str]:
    idx = index_source("mathx.py", source)
    return {u.qualname: u.checksum for u in idx.units}  # type: ignore[union-attr]


def test_a_doctest_counts_in_the_checksum_and_prose_does_not() -> None:
    before = _checksums(MATHX)
    doctest = _checksums(MATHX.replace(">>> double(2)\n    4", ">>> double(3)\n    6"))
    assert doctest["double"] != before["double"]
    assert {q: c for q, c in doctest.items() if q != "double"} == \
        {q: c for q, c in before.items() if q != "double"}
    prose = _checksums(MATHX.replace("Prose only: no example.", "Prose, edited."))
    assert prose == before  # an ordinary docstring edit stays free
    module = _checksums(MATHX.replace(">>> 2 * 2\n4", ">>> 2 * 3\n6"))
    assert module["<module>"] != before["<module>"]


class Recorded:
    def __init__(self, root: Path, store: EvidenceStore, base: str) -> None:
        self.root, self.store, self.base = root, store, base

    def selected_after(self, old: str, new: str) -> dict[str, str]:
        from record_support import edited, plan_now

        with edited(self.root / "mathx.py", old, new):
            a = plan_now(self.root, self.base, self.store)
        assert a.plan.mode == "selective", a.plan.reason
        return {d.test: "; ".join(r.sentence for r in d.reasons) for d in a.selection.selected}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    from record_support import record

    root = tmp_path_factory.mktemp("doctests") / "repo"
    _, store, base = record(root, {"mathx.py": MATHX, "test_m.py": TEST_M,
                                   ".gitignore": "__pycache__/\n"},
                            "--doctest-modules", "mathx.py", "test_m.py", passed=5)
    yield Recorded(root, store, base)
    store.close()


def test_editing_a_doctest_selects_the_doctest_that_runs_it(recorded: Recorded) -> None:
    got = recorded.selected_after(">>> double(2)\n    4", ">>> double(3)\n    6")
    assert "mathx.py::mathx.double" in got, got
    assert ChangeKind.DOCTEST.value in got["mathx.py::mathx.double"]
    assert "test_m.py::test_plain" not in got


def test_a_doctest_that_never_calls_its_function_is_selected_too(recorded: Recorded) -> None:
    got = recorded.selected_after(">>> 1 + 1\n    2", ">>> 1 + 2\n    3")
    assert "mathx.py::mathx.const" in got, got
    assert set(got) <= {"mathx.py::mathx.const", "mathx.py::mathx.double", "mathx.py::mathx"}


def test_a_prose_docstring_edit_selects_nothing(recorded: Recorded) -> None:
    assert recorded.selected_after("Prose only: no example.", "Prose, edited.") == {}
