"""Trace files: framing, atomic writes, names, and trace_pb2.py kept in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastci.errors import TraceError
from fastci.evidence.record import trace, trace_pb2
from trace_support import file_units

REPO = Path(__file__).resolve().parents[1]


def sample() -> trace_pb2.Trace:
    t = trace_pb2.Trace(format_version=trace.FORMAT_VERSION, test_id="//a:b_test", run_id="r1",
                        complete=True, outcome="passed", role="main", contexts=["c0", "c1"])
    f = t.files.add(path="pkg/m.py", digest="d")
    f.line_deltas.extend(trace.delta_encode([10, 3, 4, 4, 200]))
    f.units.add(qualname="f", checksum="x", contexts=[0, 1], calls_seen=5)
    return t


def test_round_trip_and_atomic_write(tmp_path: Path) -> None:
    path = trace.write_atomic(tmp_path / "sub" / "x.trace", sample())
    back = trace.read(path)
    assert back == sample()
    assert trace.delta_decode(list(back.files[0].line_deltas)) == [3, 4, 10, 200]
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["x.trace"]  # no temp left


@pytest.mark.parametrize("cut", [1, 5, 12, 20, -1, -7])
def test_truncated_file_is_detected(tmp_path: Path, cut: int) -> None:
    data = trace.encode(sample())
    path = tmp_path / "t.trace"
    path.write_bytes(data[:cut])
    with pytest.raises(TraceError, match=str(path)):
        trace.read(path)


def test_corrupt_payload_and_other_files_are_detected(tmp_path: Path) -> None:
    data = bytearray(trace.encode(sample()))
    data[-3] ^= 0xFF
    with pytest.raises(TraceError, match="checksum"):
        trace.decode(bytes(data))
    with pytest.raises(TraceError, match="magic"):
        trace.decode(b"PK\x03\x04 a zip file")
    with pytest.raises(TraceError, match="cannot read"):
        trace.read(tmp_path / "missing.trace")
    future = sample()
    future.format_version = 99
    with pytest.raises(TraceError, match="format 99"):
        trace.decode(trace.encode(future))


@pytest.mark.parametrize("test_id", ["//examples/microllm/tests:tp_parity_test",
                                     "tests/test_x.py::test_y[bf16-tp2]", "a.b.c"])
def test_file_names_encode_the_test_id(test_id: str) -> None:
    name = trace.file_name(test_id, "0123456789abcdef", 42)
    assert "/" not in name and name.endswith(".trace") and name.count(".") == 3
    assert trace.test_id_from_name(name) == test_id


def test_long_test_ids_get_hashed_names() -> None:
    name = trace.file_name("x" * 500, "run", 1)
    assert len(name) < 100 and trace.test_id_from_name(name) is None


def test_generated_module_is_in_sync_with_proto(tmp_path: Path) -> None:
    proto = REPO / "analyzer" / "fastci" / "evidence" / "record" / "trace.proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'analyzer'}",
                    f"--python_out={tmp_path}", str(proto)], check=True)
    for name in ("trace_pb2.py",):
        fresh = (tmp_path / "fastci" / "evidence" / "record" / name).read_bytes()
        committed = (REPO / "analyzer" / "fastci" / "evidence" / "record" / name).read_bytes()
        assert fresh == committed, f"{name} is stale: regenerate it (see trace.proto)"


def columns_sample() -> trace_pb2.Trace:
    """A format-2 trace as the recorder writes one: units as columns, sets shared."""
    t = trace_pb2.Trace(format_version=trace.FORMAT_VERSION, test_id="//a:b_test", run_id="r1",
                        complete=True, outcome="passed", role="main")
    table = trace.ContextTable(t)
    trace.write_file(t.files, "pkg/m.py", "d", [("<module>", table.set_of([])),
                                                  ("f", table.set_of(["tp=2", "bf16"])),
                                                  ("C.g", table.set_of(["bf16", "tp=2"]))])
    seg = t.segments.add(key="s/c1")
    trace.write_file(seg.files, "pkg/n.py", "e", [("h", table.set_of(["tp=1"]))])
    table.close()
    return t


def test_format_2_units_round_trip_with_shared_sets() -> None:
    t = trace.decode(trace.encode(columns_sample()))
    assert file_units(t, t.files[0]) == [
        ("<module>", "", []), ("f", "", ["bf16", "tp=2"]), ("C.g", "", ["bf16", "tp=2"])]
    assert file_units(t, t.segments[0].files[0]) == [("h", "", ["tp=1"])]
    assert len(trace.u32_column(t.set_sizes)) == 3  # {}, {bf16, tp=2} once, {tp=1}
    old = sample()  # format 1, as older recorders wrote: still read
    old.format_version = 1
    back = trace.decode(trace.encode(old))
    assert file_units(back, back.files[0]) == [("f", "x", ["c0", "c1"])]


@pytest.mark.parametrize("damage, problem", [
    (lambda t: setattr(t.files[0], "unit_sets", t.files[0].unit_sets[:-2]), "partial entry|length"),
    (lambda t: setattr(t.files[0], "qualnames", t.files[0].qualnames + "\nextra"), "length"),
    (lambda t: setattr(t.files[0], "checksums", "a\nb"), "length"),
    (lambda t: setattr(t, "set_sizes", trace.u32([9, 9, 9])), "add up"),
    (lambda t: setattr(t, "set_contexts", trace.u32([0, 7, 0])), "unknown context"),
    (lambda t: setattr(t.segments[0].files[0], "unit_sets", trace.u32([5])), "unknown context set"),
    (lambda t: setattr(t, "set_sizes", b"\x01\x00"), "partial entry"),
])
def test_inconsistent_unit_columns_are_a_corrupt_trace(damage: object, problem: str) -> None:
    t = columns_sample()
    damage(t)  # type: ignore[operator]
    with pytest.raises(TraceError, match=f"corrupt trace file.*({problem})"):
        trace.decode(trace.encode(t), origin="x.trace")
