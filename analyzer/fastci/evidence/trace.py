"""Read and write framed trace files (``trace.proto``).

On disk a trace is ``MAGIC | u32 length | u32 crc32 | payload`` so a truncated
or corrupt file is detected instead of half-parsed (protobuf happily parses a
prefix of a message). Files are written to a temporary name and renamed into
place, so a reader sees either the old or the new content, never a mix.
"""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from fastci.errors import TraceError
from fastci.evidence import trace_pb2

MAGIC = b"FCITRC1\n"
FORMAT_VERSION = 1
SUFFIX = ".trace"
_HEADER = struct.Struct(">II")
_NAME_LIMIT = 120

# trace_pb2 builds its message classes at run time, so mypy cannot see them
# (and protobuf ships no stubs): they are typed as Any here, once.
Trace: Any = getattr(trace_pb2, "Trace")
Environment: Any = getattr(trace_pb2, "Environment")
TraceMsg = Any


def encode(trace: TraceMsg) -> bytes:
    """Serialize ``trace`` with its frame."""
    payload: bytes = trace.SerializeToString(deterministic=True)
    return MAGIC + _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode(data: bytes, *, origin: str = "<bytes>") -> TraceMsg:
    """Parse a framed trace; raise :class:`TraceError` naming ``origin`` if it is bad."""
    if not data.startswith(MAGIC):
        raise TraceError(f"{origin}: not a FastCI trace file (bad magic)")
    head = len(MAGIC) + _HEADER.size
    if len(data) < head:
        raise TraceError(f"{origin}: truncated trace file (no header)")
    length, crc = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise TraceError(f"{origin}: truncated trace file ({len(payload)} of {length} bytes)")
    if zlib.crc32(payload) != crc:
        raise TraceError(f"{origin}: corrupt trace file (checksum mismatch)")
    trace = Trace()
    try:
        trace.ParseFromString(payload)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise TraceError(f"{origin}: corrupt trace file ({exc})") from exc
    if trace.format_version != FORMAT_VERSION:
        raise TraceError(f"{origin}: trace format {trace.format_version}, "
                         f"expected {FORMAT_VERSION}; re-record with this FastCI")
    return trace


def write_atomic(path: Path, trace: TraceMsg) -> Path:
    """Write ``trace`` to ``path`` via a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode(trace))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read(path: Path) -> TraceMsg:
    """Read one trace file; :class:`TraceError` if it is missing, truncated or corrupt."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror}") from exc
    return decode(data, origin=str(path))


def file_name(test_id: str, run_id: str, pid: int) -> str:
    """A trace file name that encodes the test id when it is short enough to."""
    slug = quote(test_id, safe="").replace(".", "%2E")
    if len(slug) > _NAME_LIMIT:
        import hashlib

        slug = "h-" + hashlib.sha1(test_id.encode()).hexdigest()[:24]
    else:
        slug = "t-" + slug
    return f"{slug}.{run_id[:12]}.{pid}{SUFFIX}"


def test_id_from_name(name: str) -> str | None:
    """Recover the test id from a trace file name (``None`` for hashed names)."""
    if not name.startswith("t-"):
        return None
    return unquote(name[2:].split(".", 1)[0])


def delta_encode(lines: list[int]) -> list[int]:
    """Sorted line numbers -> first value and successive differences."""
    out: list[int] = []
    prev = 0
    for n in sorted(set(lines)):
        out.append(n - prev)
        prev = n
    return out


def delta_decode(deltas: list[int]) -> list[int]:
    """Inverse of :func:`delta_encode`."""
    out: list[int] = []
    acc = 0
    for d in deltas:
        acc += d
        out.append(acc)
    return out


def remove_ingested(paths: list[Path]) -> int:
    """Delete trace files that were ingested successfully; return how many went.

    Call it only with the traces of runs that ingested without error (a full
    recording leaves ~26 MB under ``.fastci/runs``); keep those that failed or
    were corrupt, so they can be looked at and ingested again. Only files named
    like traces (``*.trace``) are removed; a file already gone is not an error.
    """
    removed = 0
    for path in paths:
        if path.suffix != SUFFIX:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed += 1
    return removed
