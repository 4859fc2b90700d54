"""Runtime evidence: what each test executed, in which contexts, and the store.

``recorder`` runs inside a test process and writes one ``trace`` file per
process; ``store`` is the SQLite evidence store that ``fastci ingest`` merges
trace files into and selection reads from.
"""

from __future__ import annotations
