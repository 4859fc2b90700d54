"""A lock-file pool of local GPUs, so parallel Bazel tests never share a device.

Each device has a lock file ``<lock dir>/gpu-<id>.lock``; a test holds an
exclusive ``fcntl.flock`` on the files of the devices it uses for as long as
its process lives (the kernel drops the locks when it exits, even on a crash).
Devices are taken all-or-nothing, so two multi-GPU tests cannot deadlock.

The device list comes from, in order: ``FASTCI_FAKE_GPUS`` (comma-separated
ids, for tests and dry runs), ``CUDA_VISIBLE_DEVICES`` (a restriction passed
with ``--test_env``), ``nvidia-smi -L``. No devices means a CPU-only host:
a test that needs GPUs fails there, unless the user opts in to running it on
CPU with ``FASTCI_ALLOW_CPU=1`` (``bazel test --test_env=FASTCI_ALLOW_CPU=1``;
this repository's own .bazelrc does, because its CI has no GPU). A green run
on CPU is not evidence that the GPU path works, so it is never the default.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Sequence

from fastci.errors import FastCIError

LOG = logging.getLogger(__name__)

DEFAULT_LOCK_DIR = "/tmp/fastci-gpus"
ALLOW_CPU_ENV = "FASTCI_ALLOW_CPU"
DEFAULT_WAIT_S = 6 * 3600.0
WAIT_ENV = "FASTCI_GPU_WAIT_S"


class GpuPoolError(FastCIError):
    """The GPUs a test needs cannot be had on this host."""


@dataclass(frozen=True)
class DeviceSource:
    """Where the device list came from, with the ids found."""

    devices: tuple[str, ...]
    source: str


def _split_ids(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def discover_devices(environ: Mapping[str, str]) -> DeviceSource:
    """Return the host's usable GPU ids and where they came from."""
    if "FASTCI_FAKE_GPUS" in environ:
        return DeviceSource(_split_ids(environ["FASTCI_FAKE_GPUS"]), "FASTCI_FAKE_GPUS")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() not in ("", "-1"):
        return DeviceSource(_split_ids(visible), "CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return DeviceSource((), "no nvidia-smi")
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        LOG.warning("nvidia-smi -L failed (%s): treating the host as CPU-only", exc)
        return DeviceSource((), "nvidia-smi failed")
    ids = tuple(m.group(1) for m in re.finditer(r"^GPU (\d+):", out.stdout, re.MULTILINE))
    return DeviceSource(ids, "nvidia-smi -L")


def lock_dir(environ: Mapping[str, str]) -> Path:
    """Return the directory holding the pool's lock files."""
    return Path(environ.get("FASTCI_GPU_LOCK_DIR") or DEFAULT_LOCK_DIR)


def _lock_name(device: str) -> str:
    return "gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "_", device) + ".lock"


def _try_lock(path: Path) -> IO[bytes] | None:
    """Lock ``path`` exclusively without waiting and write this process's PID into it.

    Returns the open handle (the lock lives as long as it does), or None if another
    process holds the lock; the PID lets that process's waiters say who holds it.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise GpuPoolError(f"cannot open the GPU lock file {path}: {exc.strerror}") from exc
    handle = os.fdopen(fd, "r+b")  # noqa: SIM115 - kept open while the lock is held
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    with contextlib.suppress(OSError):  # the PID is for messages only; the lock is what counts
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n".encode())
        handle.flush()
    return handle


def holder(path: Path) -> int | None:
    """The PID written into the lock file ``path`` by the process that took it (None: unknown)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _holders(devices: Sequence[str], directory: Path) -> str:
    """``"0 (pid 42), 1 (pid 43)"``: the devices of ``devices`` that are held, and by whom."""
    out = []
    for device in devices:
        path = directory / _lock_name(device)
        if path.exists() and _try_probe(path):
            pid = holder(path)
            out.append(f"{device} (pid {pid})" if pid else f"{device} (pid unknown)")
    return ", ".join(out)


def _try_probe(path: Path) -> bool:
    """Whether another process holds the lock on ``path`` (a shared probe, released at once)."""
    try:
        with open(path, "rb") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def _lock_directory(directory: Path) -> None:
    """Make the lock directory (shared by every user's tests); one-line error if it cannot be."""
    if directory.exists() and not directory.is_dir():
        raise GpuPoolError(f"the GPU lock directory {directory} is not a directory; remove it or "
                           "set FASTCI_GPU_LOCK_DIR to a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuPoolError(f"cannot make the GPU lock directory {directory}: {exc.strerror}; set "
                           "FASTCI_GPU_LOCK_DIR to a writable directory") from exc
    with contextlib.suppress(PermissionError):
        os.chmod(directory, 0o1777)


@dataclass
class Lease:
    """Devices held by this process; release() (or process exit) frees them."""

    devices: tuple[str, ...]
    _handles: list[IO[bytes]]

    def release(self) -> None:
        """Unlock and close every lock file."""
        for handle in self._handles:
            handle.close()
        self._handles.clear()


def try_acquire(count: int, devices: Sequence[str], directory: Path) -> Lease | None:
    """Lock ``count`` free devices at once, or none (returns None)."""
    if count == 0:
        return Lease((), [])
    _lock_directory(directory)
    taken: list[str] = []
    handles: list[IO[bytes]] = []
    for device in devices:
        handle = _try_lock(directory / _lock_name(device))
        if handle is None:
            continue
        taken.append(device)
        handles.append(handle)
        if len(taken) == count:
            return Lease(tuple(taken), handles)
    for handle in handles:
        handle.close()
    return None


def free_count(devices: Sequence[str], directory: Path) -> int:
    """How many of ``devices`` no process holds now (a snapshot: it may change at once)."""
    return sum(1 for device in devices if not _try_probe(directory / _lock_name(device)))


#: ``turn(free)``: whether a test may try to take its GPUs now, ``free`` of them
#: being unheld (:meth:`fastci.run.schedule.Ticket.turn`, list scheduling).
Turn = Callable[[int], bool]


def acquire(
    count: int,
    devices: Sequence[str],
    directory: Path,
    *,
    wait_s: float = DEFAULT_WAIT_S,
    poll_s: float = 0.2,
    turn: Turn | None = None,
) -> Lease:
    """Wait until ``count`` devices are free (and, with ``turn``, it is this test's turn); lock them.

    ``turn`` only decides when to *try*: the locks stay what keeps two tests off
    one device, and the wait for a turn counts against ``wait_s``.

    Raises:
        GpuPoolError: the host has fewer devices than ``count``, or they stayed
            busy for ``wait_s`` seconds.
    """
    if count > len(devices):
        raise GpuPoolError(
            f"test needs {count} GPU(s), this host has {len(devices)} ({', '.join(devices) or 'none'})"
        )
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        if turn is None or turn(free_count(devices, directory)):
            lease = try_acquire(count, devices, directory)
            if lease is not None:
                return lease
        if time.monotonic() >= deadline:
            held = _holders(devices, directory)
            raise GpuPoolError(f"{count} of GPUs {', '.join(devices)} stayed busy for {wait_s:.0f}s "
                               f"({directory}; held: {held or 'none any more'})")
        if not waited:
            LOG.warning("waiting up to %.0f s for %d GPU(s); held: %s", wait_s, count,
                        _holders(devices, directory) or "none any more")
            waited = True
        time.sleep(poll_s)


def wait_seconds(environ: Mapping[str, str]) -> float:
    """How long to wait for busy GPUs: ``FASTCI_GPU_WAIT_S`` seconds (default six hours).

    Raises:
        GpuPoolError: the variable is not a non-negative number.
    """
    raw = environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise GpuPoolError(f"{WAIT_ENV}={raw!r}: expected a number of seconds (0 or more)")
    return value


def allow_cpu(environ: Mapping[str, str]) -> bool:
    """Whether the user opted in to running GPU tests on a host without GPUs."""
    return environ.get(ALLOW_CPU_ENV, "").strip().lower() in ("1", "true", "yes")


@contextlib.contextmanager
def gpus_for(count: int, environ: Mapping[str, str], *,
             turn: Turn | None = None) -> Iterator[tuple[str, ...]]:
    """Yield the device ids to use for a test needing ``count`` GPUs.

    ``turn`` (see :func:`acquire`) makes it wait its turn in a scheduled run
    before it takes devices from the pool; it is not asked without devices.

    On a host without GPUs, a test needing some runs on CPU (yields ``()``)
    only when :func:`allow_cpu`; otherwise it fails.

    Raises:
        GpuPoolError: no GPUs and no opt-in, or (from :func:`acquire`) too few
            GPUs or all busy for too long.
    """
    if count == 0:
        yield ()
        return
    found = discover_devices(environ)
    if not found.devices:
        if not allow_cpu(environ):
            raise GpuPoolError(
                f"test needs {count} GPU(s) and this host has none ({found.source}); to run it on CPU "
                f"anyway, opt in with {ALLOW_CPU_ENV}=1 (bazel test --test_env={ALLOW_CPU_ENV}=1)"
            )
        LOG.warning("no GPUs found (%s): running on CPU (%s=1)", found.source, ALLOW_CPU_ENV)
        yield ()
        return
    wait_s = wait_seconds(environ)
    lease = acquire(count, found.devices, lock_dir(environ), wait_s=wait_s, turn=turn)
    try:
        LOG.info("using GPU(s) %s of %s (%s)", ",".join(lease.devices), ",".join(found.devices), found.source)
        yield lease.devices
    finally:
        lease.release()
