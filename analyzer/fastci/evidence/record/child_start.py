"""The entry point a recorded test's child process runs at start-up.

:mod:`fastci.evidence.record.children` exports the ``FASTCI_RECORD_*`` variables and a
``sitecustomize.py`` that imports this module and calls :func:`start_child`. It
lives apart from :mod:`fastci.evidence.record.children` because it starts a
:class:`~fastci.evidence.record.recorder.Recorder`, and the recorder itself uses
:class:`~fastci.evidence.record.children.ChildEnvironment`: the order is
``child_start -> recorder -> children``, never back.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

from fastci.evidence.record.children import ENV_DIR, ENV_META, ENV_REPO, ENV_RUN, ENV_TEST
from fastci.evidence.record.recorder import Recorder

_CHILD: Recorder | None = None  # this process's child recorder, if any

_INFRASTRUCTURE = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def is_infrastructure() -> bool:
    """Whether this process is multiprocessing's helper (resource tracker, fork server).

    Those outlive the test's main process; recording them would race the test's
    end and could leave a trace that looks incomplete.
    """
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes()
    except OSError:
        return False
    return any(marker in cmdline for marker in _INFRASTRUCTURE)


def start_child() -> None:
    """Start recording this process as a child of a recorded test (from sitecustomize)."""
    out_dir = os.environ.get(ENV_DIR)
    test_id = os.environ.get(ENV_TEST)
    if not out_dir or not test_id or is_infrastructure():
        return
    meta = json.loads(os.environ.get(ENV_META) or "{}")
    rec = Recorder(test_id, Path(out_dir), repo_root=Path(os.environ.get(ENV_REPO) or "."),
                   workload=meta.get("workload", {}), gpus=int(meta.get("gpus", 0)),
                   role="child", run_id=os.environ.get(ENV_RUN) or None)
    rec.start()
    atexit.register(_stop_child, rec)
    global _CHILD
    _CHILD = rec


def _stop_child(rec: Recorder) -> None:
    try:
        rec.stop("")
    except Exception as exc:  # at exit: report, never raise
        sys.stderr.write(f"fastci: child trace not written: {exc!r}\n")
