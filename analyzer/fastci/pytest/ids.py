"""The test id FastCI gives a pytest item, shared by recording and plan obeying.

The recorder names a test's evidence with it and the plan plugin looks tests up
by it, so both must compute it the same way: here, below both of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_id_for(item: pytest.Item, root: Path) -> str:
    """The item's node id with its file path relative to the repo root.

    An item outside ``root`` keeps its node id unchanged.
    """
    nodeid = item.nodeid
    _, sep, rest = nodeid.partition("::")
    try:
        rel = Path(str(item.path)).resolve().relative_to(root).as_posix()
    except ValueError:
        return nodeid
    return f"{rel}{sep}{rest}"
