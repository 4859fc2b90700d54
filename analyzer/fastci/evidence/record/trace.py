"""Read and write framed trace files (``trace.proto``).

On disk a trace is ``MAGIC | u32 length | u32 crc32 | payload`` so a truncated
or corrupt file is detected instead of half-parsed (protobuf happily parses a
prefix of a message). Files are written to a temporary name and renamed into
place, so a reader sees either the old or the new content, never a mix.
"""

from __future__ import annotations

import array
import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import quote, unquote

from fastci.errors import TraceError
from fastci.evidence.record import trace_pb2

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MAGIC = b"FCITRC1\n"
#: What this recorder writes: 2 holds a file's units as columns (``FileTrace.qualnames``);
#: 3, the same fields, from a recorder that records the frames dynamo traces as units
#: (context ``traced(dynamo)``, :mod:`fastci.evidence.record.traced`).
FORMAT_VERSION = 3
#: What ingest reads: 1 (units as messages) and 2 (no traced frames), written before, too.
READABLE = (1, 2, 3)
#: The first format whose recorder records the frames dynamo traces.
TRACED_FRAMES_FORMAT = 3
SUFFIX = ".trace"
_HEADER = struct.Struct(">II")
_NAME_LIMIT = 120
_NATIVE_LE = sys.byteorder == "little" and array.array("I").itemsize == 4

# trace_pb2 builds its message classes at run time, so mypy cannot see them
# (and protobuf ships no stubs): they are typed as Any here, once.
Trace: Any = getattr(trace_pb2, "Trace")
Environment: Any = getattr(trace_pb2, "Environment")
_TRACE_HEAD: Any = getattr(trace_pb2, "TraceHead")
TraceMsg = Any


def encode(trace: TraceMsg) -> bytes:
    """Serialize ``trace`` with its frame."""
    payload: bytes = trace.SerializeToString(deterministic=True)
    return MAGIC + _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode(data: bytes, *, origin: str = "<bytes>") -> TraceMsg:
    """Parse a framed trace; raise :class:`TraceError` naming ``origin`` if it is bad."""
    trace = _parse(Trace(), _payload(data, origin), origin)
    problem = _column_problem(trace)
    if problem:
        raise TraceError(f"{origin}: corrupt trace file ({problem})")
    return trace


def decode_head(data: bytes, *, origin: str = "<bytes>") -> TraceMsg:
    """The header of a framed trace (``TraceHead``: test and run ids, role, segment keys),
    the frame checked as :func:`decode` checks it; the rest is checked by :func:`decode`."""
    return _parse(_TRACE_HEAD(), _payload(data, origin), origin)


def _payload(data: bytes, origin: str) -> bytes:
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
    return payload


def _parse(msg: TraceMsg, payload: bytes, origin: str) -> TraceMsg:
    try:
        msg.ParseFromString(payload)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise TraceError(f"{origin}: corrupt trace file ({exc})") from exc
    if msg.format_version not in READABLE:
        raise TraceError(f"{origin}: trace format {msg.format_version}, "
                         f"expected one of {', '.join(map(str, READABLE))}; "
                         "re-record with this FastCI")
    return msg


def u32(values: Iterable[int]) -> bytes:
    """``values`` as the little-endian uint32 of a format-2 column."""
    if _NATIVE_LE:
        return array.array("I", values).tobytes()
    return b"".join(struct.pack("<I", v) for v in values)


def u32_column(blob: bytes) -> npt.NDArray[np.uint32]:
    """A format-2 uint32 column as an array (no copy)."""
    # numpy is imported here, not at the top: the recorder imports this module in every
    # recorded child process (numpy costs ~70 ms there), and only readers need arrays.
    import numpy

    return numpy.frombuffer(blob, dtype="<u4")


def names(column: str) -> list[str]:
    """A format-2 column of names (joined by newlines) as a list."""
    return column.split("\n") if column else []


class ContextTable:
    """The context signatures (``Trace.contexts``) and sets of them (``Trace.set_sizes``
    and ``set_contexts``) of one trace, each written once, as units name them;
    :meth:`close` writes the sets."""

    def __init__(self, msg: TraceMsg) -> None:
        self.msg = msg
        self.sigs: dict[str, int] = {}
        self.sets: dict[tuple[int, ...], int] = {}

    def sig(self, sig: str) -> int:
        """``sig``'s index in ``Trace.contexts`` (appended when new)."""
        got = self.sigs.get(sig)
        if got is None:
            got = self.sigs[sig] = len(self.sigs)
            self.msg.contexts.append(sig)
        return got

    def set_of(self, sigs: Iterable[str]) -> int:
        """The index of the set ``sigs`` among the trace's sets (numbered when new)."""
        ids = tuple(sorted({self.sig(s) for s in sorted(sigs)}))
        return self.sets.setdefault(ids, len(self.sets))

    def close(self) -> None:
        """Write the sets into the trace."""
        self.msg.set_sizes = u32(len(ids) for ids in self.sets)
        self.msg.set_contexts = u32(i for ids in self.sets for i in ids)


def write_file(files: Any, path: str, digest: str, units: Iterable[tuple[str, int]]) -> Any:
    """Add a file to ``files`` (a trace's or a segment's) with ``units``, each a qualname
    and its set of contexts (:meth:`ContextTable.set_of`), as format 2's columns."""
    pairs = list(units)
    return files.add(path=path, digest=digest, qualnames="\n".join(q for q, _ in pairs),
                     unit_sets=u32(s for _, s in pairs))


def _column_problem(trace: TraceMsg) -> str:
    """What is inconsistent in the unit columns of ``trace`` (format 2), or ''."""
    files = [*trace.files, *(ft for seg in trace.segments for ft in seg.files)]
    sizes, flat = trace.set_sizes, trace.set_contexts
    if len(sizes) % 4 or len(flat) % 4:
        return "a column of uint32 has a partial entry"
    sizes, flat = u32_column(sizes), u32_column(flat)
    if int(sizes.sum(dtype="int64")) != len(flat):
        return "context sets do not add up"
    if len(flat) and int(flat.max()) >= len(trace.contexts):
        return "a context set names an unknown context"
    for ft in files:
        quals, checksums = ft.qualnames, ft.checksums
        n = quals.count("\n") + 1 if quals else 0
        if len(ft.unit_sets) != 4 * n or (checksums and checksums.count("\n") + 1 != n):
            return f"unit columns of {ft.path} differ in length"
    used = u32_column(b"".join(ft.unit_sets for ft in files))
    if len(used) and int(used.max()) >= len(sizes):
        return "a unit names an unknown context set"
    return ""


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
