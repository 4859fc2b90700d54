"""Declared inputs at plan time: a file ``inputs:`` names that the evidence lacks.

The recording hashed each test's declared files into its evidence as files it read
(:mod:`fastci.evidence.record.inputs`), so a *changed* or *removed* one is found by the
rules for recorded reads: :func:`fastci.select.test_rules.ignored_read_rules` for files
git does not track (ignored ones, and absolute paths outside the repository), the
baseline's read rule for tracked ones. What those rules cannot see is a file that
now matches a test's declaration but that its recording did not hash (added since,
or declared after it was recorded), and a glob too large to expand: this rule
selects the declaring tests for both, with the reason.

The globs come from the base revision's config (``inputs`` is a decision key): a
change cannot add or drop its own declarations. Each distinct glob is expanded
once per plan, whatever the number of tests; only the tests whose ids match a
declaration are looked up in the store.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from fastci.changes.scan import ChangeSet
from fastci.config import Config
from fastci.evidence.record.inputs import expand_all, globs_for
from fastci.integrations.git.repository import shown
from fastci.select.decisions import DecisionKind, Reason
from fastci.select.test_rules import EvidenceReader, Hits, add_hit
from fastci.types import TestId

LOG = logging.getLogger(__name__)


def declared_input_rules(changes: ChangeSet, store: EvidenceReader, config: Config,
                         tests: Iterable[TestId]) -> Hits:
    """Tests (with evidence) whose declared inputs hold a file their recording did not
    hash, or a glob over the expansion cap."""
    hits: Hits = {}
    if not config.inputs or changes.tree is None:
        return hits
    root = Path(changes.tree.git.root)
    declaring = {t: g for t in tests if (g := globs_for(t, config.inputs))}
    if not declaring:
        return hits
    expansions = expand_all((g for globs in declaring.values() for g in globs), root)
    keys = sorted({k for e in expansions.values() for k in e.files})
    recorded = {(path, test) for path, test, _ in store.file_digests(keys)} if keys else set()
    for test, globs in sorted(declaring.items()):
        for glob in globs:
            e = expansions[glob]
            where = f"fastci.yaml inputs {glob!r}"
            if e.overflow:
                _select(hits, test, f"its declared inputs {glob!r} are not hashed "
                        f"({e.overflow}), so nothing shows they are unchanged", path=glob,
                        change="not hashed",
                        via=f"{where}: a glob over the cap selects the tests that declare it")
                continue
            for key in e.files:
                if (key, test) not in recorded:
                    _select(hits, test, f"declares {shown(key)} as an input ({where}), and its "
                            "evidence holds no digest of it (added since it was recorded)",
                            path=key, change="added",
                            via=f"{where}: a declared file the recording did not hash")
    return hits


def _select(hits: Hits, test: TestId, sentence: str, *, path: str, change: str,
            via: str) -> None:
    """Select ``test`` for a declared input, with the reason."""
    add_hit(hits, test, Reason(DecisionKind.DECLARED_INPUT, sentence, path=path,
                               change=change, via=via))
