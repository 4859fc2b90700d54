"""Child processes that end with FastCI, however FastCI is stopped.

A CI system cancels a job by signalling the one process it started (SIGTERM from
most cancel buttons, SIGINT, SIGHUP when the runner's terminal goes). A pytest or
Bazel child left behind is re-parented to PID 1 and goes on holding GPUs, locks and
scratch folders. So every long-running child FastCI starts (a test run, a
calibration rung, an evaluation's run-all) is started here:

- in a session of its own, so that stopping it reaches its whole process group
  (pytest's rank processes, Bazel's client) and a terminal's Ctrl-C reaches FastCI
  first, which then stops the group in order;
- on Linux, with a parent-death signal (``PR_SET_PDEATHSIG``: SIGKILL), so that it
  dies even when FastCI itself is killed with SIGKILL and no handler can run;
- listed while it runs, so that :func:`cancellable` can stop every one of them
  (SIGINT to the group, the way a terminal asks pytest and Bazel to stop cleanly,
  then SIGKILL after a grace period) before the cancelling signal unwinds FastCI's
  own ``finally`` blocks and scratch folders.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from fastci.errors import FastCIError

LOG = logging.getLogger(__name__)

#: Seconds a stopped child's group gets to end after SIGINT before SIGKILL.
GRACE_S = 5.0

#: The signals that cancel a FastCI command (SIGINT: Ctrl-C or a CI's cancel).
CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_LIVE: set[subprocess.Popen[Any]] = set()
_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1


class Cancelled(FastCIError):
    """A cancelling signal reached FastCI; its children were stopped."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"cancelled by {signal.Signals(signum).name}: its child processes "
                         "were stopped")


@functools.lru_cache(maxsize=1)
def _die_with_parent() -> Callable[[], None] | None:
    """The child's hook that asks Linux for a parent-death signal (None elsewhere).

    ``prctl`` is looked up once, here in the parent: between fork and exec the child
    should only make the call (and ``ctypes`` stays unimported for commands that start
    no child)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:  # pragma: no cover - runs in the child, before exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook


def start(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start ``cmd`` (``subprocess.Popen`` keyword arguments) as a child that ends with
    FastCI; :func:`finish` or :func:`stop` must follow."""
    extra: dict[str, Any] = {"start_new_session": True}
    hook = _die_with_parent()
    if hook is not None:
        extra["preexec_fn"] = hook
    proc: subprocess.Popen[Any] = subprocess.Popen(list(cmd), **extra, **popen)
    with _LOCK:
        _LIVE.add(proc)
    return proc


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen[Any], grace_s: float = GRACE_S) -> None:
    """End ``proc`` and its process group: SIGINT, then SIGKILL after ``grace_s``."""
    try:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGINT)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Whatever of its group is left (a rank that ignored SIGINT) goes too.
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    finally:
        with _LOCK:
            _LIVE.discard(proc)


def finish(proc: subprocess.Popen[Any]) -> None:
    """Forget ``proc`` once it has ended on its own; what its group left running (a rank
    process it did not wait for) is killed."""
    if proc.poll() is None:
        stop(proc)
        return
    _signal_group(proc, signal.SIGKILL)
    with _LOCK:
        _LIVE.discard(proc)


def stop_all() -> int:
    """Stop every child started here that still runs; how many there were."""
    with _LOCK:
        live = list(_LIVE)
    for proc in live:
        stop(proc)
    return len(live)


def run(cmd: Sequence[str], *, timeout: float | None = None, input: str | bytes | None = None,
        **popen: Any) -> subprocess.CompletedProcess[Any]:
    """Like ``subprocess.run(cmd, check=False)``, the child started by :func:`start`.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` passed; the child's group was stopped.
    """
    if input is not None:
        popen["stdin"] = subprocess.PIPE
    proc = start(cmd, **popen)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    except BaseException:
        stop(proc)
        raise
    finish(proc)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


@contextlib.contextmanager
def cancellable() -> Iterator[None]:
    """While inside, a cancelling signal stops every child and raises :class:`Cancelled`
    in the main thread (so ``finally`` blocks and scratch folders run their clean-up).

    Outside the main thread (signal handlers cannot be installed there) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        n = stop_all()
        LOG.warning("%s: stopped %d child process(es)", signal.Signals(signum).name, n)
        raise Cancelled(signum)

    old: dict[signal.Signals, Any] = {}
    for sig in CANCEL_SIGNALS:
        old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, was in old.items():
            signal.signal(sig, was if was is not None else signal.SIG_DFL)


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``timeout_s`` (for tests and
    diagnostics)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


__all__ = ["Cancelled", "cancellable", "run", "start", "stop", "finish", "stop_all", "wait_gone"]
