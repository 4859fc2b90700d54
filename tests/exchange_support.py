"""Importing an evidence file in one call, as ``fastci evidence import`` does."""

from __future__ import annotations

from pathlib import Path

from fastci.evidence.store.db import EvidenceStore
from fastci.evidence.store.exchange import ImportReport, Manifest, import_runs, load_export


def import_store(store: EvidenceStore, path: Path) -> tuple[Manifest, ImportReport]:
    """Check the evidence file ``path`` whole, then merge its runs into ``store``."""
    manifest, runs = load_export(path)
    return manifest, import_runs(store, runs, where=str(path))
