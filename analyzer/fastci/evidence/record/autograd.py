"""Keep autograd's backward passes where the recorder sees them (issue 32).

On an accelerator, torch's autograd engine runs backward passes on its own
device threads: custom ``torch.autograd.Function.backward`` bodies, tensor and
module hooks, DDP/FSDP communication hooks. coverage.py's tracer, which the
recorder wraps, never traces those threads, so on CUDA that code was missing
from evidence (on CPU the engine runs them on the calling thread, and they are
recorded). While a process records, :class:`AutogradSwitch` turns autograd's
multithreading off (``torch.autograd.set_multithreading_enabled(False)``, the
same switch through ``torch._C``), so backward runs on the thread that called it.

It never imports torch: a process that has not loaded torch's extension module
(``torch._C``) pays nothing; one that loads it while recording (a child rank of
``torch.multiprocessing.spawn`` or ``torchrun``, started by ``sitecustomize``
before anything else) is switched at the next module import, which torch's own
``__init__`` makes long before any backward can run (the recorder hands
:meth:`AutogradSwitch.on_import` the ``import`` audit events).

The switch is thread-local in torch: it is set in the thread that starts
recording (the test's) and in every thread that imports a module while
recording; :meth:`AutogradSwitch.restore` gives the recording thread its value
back. A torch without the switch (before 2.0) cannot keep backward on the
calling thread: :meth:`AutogradSwitch.unseen` then says so when the process
used CUDA, and the recorder marks its evidence incomplete.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

LOG = logging.getLogger(__name__)

#: The audit event after which torch may have become loaded.
IMPORT_EVENT = "import"


class AutogradSwitch:
    """Autograd multithreading off in the recording process's threads while recording."""

    def __init__(self) -> None:
        # Thread ident -> the value it had before (None: torch has no switch).
        self._saved: dict[int, bool | None] = {}
        self._owner = threading.get_ident()
        self._active = False

    def start(self) -> None:
        """Begin: switch the calling thread now if torch is loaded (else at its import)."""
        self._owner = threading.get_ident()
        self._active = True
        self._apply()

    def on_import(self) -> None:
        """An ``import`` audit event in some thread: switch it if torch is loaded by now."""
        if self._active and threading.get_ident() not in self._saved:
            self._apply()

    def _apply(self) -> None:
        ext = sys.modules.get("torch._C")
        if ext is None:
            return
        ident = threading.get_ident()
        if ident in self._saved:
            return
        get = getattr(ext, "_is_multithreading_enabled", None)
        put = getattr(ext, "_set_multithreading_enabled", None)
        if get is None or put is None:
            self._saved[ident] = None
            return
        try:
            self._saved[ident] = bool(get())
            put(False)
        except Exception as exc:  # a torch half-loaded or odd: keep recording, say why
            LOG.debug("autograd multithreading not switched off: %r", exc)
            self._saved[ident] = None

    def restore(self) -> None:
        """Stop: the calling thread gets its value back (other threads keep it off)."""
        self._active = False
        prev = self._saved.pop(threading.get_ident(), None)
        ext = sys.modules.get("torch._C")
        put = getattr(ext, "_set_multithreading_enabled", None) if ext is not None else None
        if prev is not None and put is not None:
            try:
                put(prev)
            except Exception as exc:
                LOG.debug("autograd multithreading not restored: %r", exc)
        self._saved.clear()

    def unseen(self) -> str:
        """Why backward code may be missing from the evidence (``""``: it is not).

        Only when torch lacks the switch and CUDA ran in this process: on CPU autograd
        runs backward on the calling thread anyway.
        """
        ext = sys.modules.get("torch._C")
        if ext is None or hasattr(ext, "_set_multithreading_enabled"):
            return ""
        cuda: Any = sys.modules.get("torch.cuda")
        try:
            used = bool(cuda is not None and cuda.is_initialized())
        except Exception:  # cannot tell: assume it was
            used = True
        if not used:
            return ""
        version = getattr(sys.modules.get("torch"), "__version__", "?")
        return (f"torch {version} has no torch.autograd.set_multithreading_enabled, so "
                "backward passes and hooks ran on autograd's CUDA device threads, which "
                "the recorder does not see")
