#!/usr/bin/env python3
"""Install, start and stop a loopback BuildGrid remote cache (stdlib only).

    python3 tools/remote_cache/server.py setup  [--venv .venv-buildgrid]
    python3 tools/remote_cache/server.py start  [--port 8980] [--dir build/remote_cache]
    python3 tools/remote_cache/server.py stop   [--dir build/remote_cache]
    python3 tools/remote_cache/server.py status [--dir build/remote_cache]

The Makefile's ``remote-cache-*`` targets call this (docs/REMOTE.md). BuildGrid is a
separate service: it lives in its own virtualenv (``.venv-buildgrid``), never in the
project's ``.venv``, so the tests' dependency set stays as it is.

``start`` renders nothing: ``tools/remote_cache/buildgrid.yml`` reads the port and the
state directory from ``FASTCI_REMOTE_CACHE_PORT`` and ``FASTCI_REMOTE_CACHE_DIR``.
The state directory holds ``cas/`` (the blobs), ``server.pid`` and ``server.log``.
``start`` fails with a clear message when the port is taken or a server from the
same directory still runs, and waits until the port accepts connections.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIG = HERE / "buildgrid.yml"
REQUIREMENTS = HERE / "requirements.txt"
DEFAULT_VENV = REPO / ".venv-buildgrid"
DEFAULT_DIR = REPO / "build" / "remote_cache"
DEFAULT_PORT = 8980
HOST = "127.0.0.1"
STAMP = ".fastci-requirements"


class Error(Exception):
    """A failure with a message for a person (printed without a traceback)."""


def _say(msg: str) -> None:
    print(f"remote-cache: {msg}", file=sys.stderr, flush=True)


def requirements_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def venv_ready(venv: Path) -> bool:
    """Whether ``venv`` holds ``bgd`` installed from the current requirements."""
    stamp = venv / STAMP
    return (venv / "bin" / "bgd").is_file() and stamp.is_file() and \
        stamp.read_text().strip() == requirements_digest()


def setup(venv: Path) -> None:
    """Create ``venv`` and install BuildGrid into it (idempotent: a stamp keys it)."""
    if venv_ready(venv):
        (venv / STAMP).touch()  # make compares its mtime with requirements.txt
        return
    _say(f"installing BuildGrid into {venv} (its own virtualenv; about a minute)")
    if not (venv / "bin" / "python").exists():
        res = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
        if res.returncode != 0:
            raise Error(f"`{sys.executable} -m venv {venv}` failed (exit {res.returncode}); "
                        "on Debian install python3-venv (`make setup` does it)")
    res = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                          "-r", str(REQUIREMENTS)], check=False)
    if res.returncode != 0:
        raise Error(f"pip install -r {REQUIREMENTS} into {venv} failed (exit {res.returncode})")
    (venv / STAMP).write_text(requirements_digest() + "\n")


def port_in_use(port: int) -> bool:
    """Whether something already listens on HOST:port (or the port cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) BuildGrid server process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and b"bgd" in cmdline


def read_pid(state: Path) -> int | None:
    try:
        return int((state / "server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def start(venv: Path, state: Path, port: int, timeout: float = 60.0) -> int:
    """Start the server in the background; returns its pid once the port accepts connections."""
    bgd = venv / "bin" / "bgd"
    if not bgd.is_file():
        raise Error(f"{bgd} not found: run `make remote-cache-setup` first")
    state.mkdir(parents=True, exist_ok=True)
    pid = read_pid(state)
    if pid is not None and _alive(pid):
        raise Error(f"a server from {state} already runs (pid {pid}): `make remote-cache-stop` first")
    if port_in_use(port):
        raise Error(f"port {port} on {HOST} is taken by another process: pick another one, "
                    f"e.g. `make remote-cache-start REMOTE_CACHE_PORT={port + 1}`, and point "
                    f"--remote_cache there (user.bazelrc: build:remote_cache "
                    f"--remote_cache=grpc://{HOST}:{port + 1})")
    log = state / "server.log"
    env = dict(os.environ, FASTCI_REMOTE_CACHE_PORT=str(port), FASTCI_REMOTE_CACHE_DIR=str(state.resolve()))
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(bgd), "server", "start", str(CONFIG)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    (state / "server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            (state / "server.pid").unlink(missing_ok=True)
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
            raise Error(f"the server exited at start (exit {proc.returncode}); {log} ends with:\n{tail}")
        if accepts(port):
            _say(f"BuildGrid serves grpc://{HOST}:{port} (pid {proc.pid}, log {log}, blobs {state / 'cas'})")
            return proc.pid
        time.sleep(0.1)
    stop(state)
    raise Error(f"the server did not accept connections on {HOST}:{port} within {timeout:.0f}s (log {log})")


def stop(state: Path, timeout: float = 15.0) -> bool:
    """Stop the server whose pid is in ``state``; returns whether one was running."""
    pid = read_pid(state)
    pid_file = state / "server.pid"
    if pid is None or not _alive(pid):
        pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
    _say(f"stopped the server (pid {pid})")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["setup", "start", "stop", "status"])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (blobs, pid, log)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            setup(args.venv)
        elif args.command == "start":
            start(args.venv, args.dir, args.port)
        elif args.command == "stop":
            if not stop(args.dir):
                _say(f"no server running from {args.dir}")
        else:
            pid = read_pid(args.dir)
            if pid is None or not _alive(pid):
                _say(f"no server running from {args.dir}")
                return 1
            _say(f"running (pid {pid}, log {args.dir / 'server.log'})")
    except Error as exc:
        _say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
