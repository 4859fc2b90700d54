"""Runtime evidence: what each test executed, in which contexts, and the store of it.

Two rooms, one direction. ``record/`` runs inside every test process (the recorder,
its coverage plug-in, contexts, file audit, children, the trace format): it imports
the standard library, coverage.py and protobuf, never the store. ``store/`` is the
SQLite evidence store and what fills and reads it (ingest of trace files, exchange
of exported runs, the calibration store); it reads the trace format of ``record/``.
``fill`` joins them for ``fastci record`` and ``fastci ingest``: run tests under the
recorder, then merge their traces into the store.
"""

from __future__ import annotations
