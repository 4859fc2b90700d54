"""What runs inside a test process: the recorder and everything it imports.

``recorder.Recorder`` measures one test process with coverage.py (plus the
``covplugin`` contexts plug-in, the ``files`` read audit, ``children`` for started
interpreters, ``autograd`` and ``traced`` for code the tracer cannot see) and writes
one ``trace`` file per process. This code is on the cost-critical path of every
recorded test: it imports only the standard library, coverage.py, the generated
``trace_pb2`` with its protobuf runtime, and FastCI's own in-test leaves
(``tests/test_layout.py`` checks it), never ``fastci.evidence.store``.
"""

from __future__ import annotations
