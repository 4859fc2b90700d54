"""The evidence store: SQLite tables of runs, units, contexts and reads, and their writers.

``db.EvidenceStore`` is the store selection reads; ``ingest`` merges trace files
(``fastci.evidence.record.trace``) and Bazel results into it; ``exchange`` exports
and imports runs between stores; ``postings``, ``columns`` and ``batch`` pack and
write its id sets; ``schema`` is the versioned SQL; ``calibrations`` is the separate
calibration store of ``fastci calibrate``. None of it runs inside a test process.
"""

from __future__ import annotations
