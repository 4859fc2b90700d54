"""Bad files cost one line, not memory or a traceback (issue 37).

Reported: a 1.5 MB gzip given to ``fastci evidence import`` expanded into 1.6 GB of
memory; a zlib bomb in one store row cost 2 GB at plan time; run lines that are JSON
lists, 100k-deep JSON (in an import or ``fastci eval --from``) and invalid JSON in a
store cell on export ended in tracebacks; ``export --out`` at the store itself
overwrote the store, and ``--out`` at a directory was a traceback.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
import zlib
from pathlib import Path

import pytest

from fastci import cli
from fastci.errors import StoreError
from exchange_support import import_store
from fastci.evidence.store import exchange, postings
from fastci.evidence.store.db import EvidenceStore
from test_evidence_exchange import run_of


def _evidence_file(path: Path, body: bytes, runs: int = 1) -> Path:
    head = {"format": exchange.FORMAT, "version": exchange.VERSION, "commit": "c", "runs": runs,
            "tests": 1, "digest": "sha256:" + hashlib.sha256(body).hexdigest()}
    with gzip.open(path, "wb") as f:
        f.write(json.dumps(head).encode() + b"\n" + body)
    return path


def test_a_line_that_expands_past_its_cap_is_refused_as_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "MAX_LINE_BYTES", 1 << 20)
    bomb = _evidence_file(tmp_path / "bomb.jsonl.gz", b" " * (8 << 20) + b"\n")
    assert bomb.stat().st_size < 64 << 10  # small on disk, 8 MiB expanded
    with pytest.raises(StoreError, match="expands past 1 MiB"):
        exchange.load_export(bomb)


def test_a_file_that_expands_past_its_cap_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "MAX_EXPORT_BYTES", 1 << 20)
    with EvidenceStore.open(tmp_path / "a.db", create=True) as a:
        a.ingest(run_of(0, "//t:a", 1.0, ["m.py::f"]))
        exchange.export_store(a, tmp_path / "good.jsonl.gz")
    with gzip.open(tmp_path / "good.jsonl.gz", "rb") as f:
        _head, line = f.read().splitlines(keepends=True)
    many = _evidence_file(tmp_path / "many.jsonl.gz", line * ((2 << 20) // len(line)))
    with pytest.raises(StoreError, match="expands past 1 MiB"):
        exchange.load_export(many)


@pytest.mark.parametrize("body", [b"[1, 2, 3]\n", b"[" * 100_000 + b"]" * 100_000 + b"\n",
                                  b'{"test": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"])
def test_run_lines_that_are_not_objects_are_one_line_errors(tmp_path: Path, body: bytes) -> None:
    path = _evidence_file(tmp_path / "odd.jsonl.gz", body)
    with EvidenceStore.open(tmp_path / "s.db", create=True) as store:
        with pytest.raises(StoreError) as err:
            import_store(store, path)
        assert "\n" not in str(err.value) and "nothing imported" in str(err.value)
        assert store.test_ids() == []


def test_a_deep_header_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(StoreError, match="not a FastCI evidence file"):
        exchange.load_export(path)


def test_a_zlib_bomb_in_a_store_row_is_refused_before_it_costs_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postings, "MAX_UNPACKED_BYTES", 1 << 20)
    bomb = bytes((postings.DELTA | 4 | postings.ZLIB,)) + zlib.compress(b"\0" * (16 << 20), 9)
    with pytest.raises(ValueError, match="expands past 1 MiB"):
        postings.decode(bomb)
    with pytest.raises(ValueError):
        postings.decode_many([bomb])
    fine = postings.encode_sorted(postings.as_ids(range(0, 40_000, 3)))
    assert list(postings.decode(fine)) == list(range(0, 40_000, 3))


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    with EvidenceStore.open(path, create=True) as s:
        s.ingest(run_of(0, "//t:a", 1.0, ["m.py::f"]))
    return path


def test_export_onto_the_store_itself_is_refused_and_the_store_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path)
    before = store.read_bytes()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["evidence", "export", "--out", str(store), "--store", str(store)]) != 0
    err = capsys.readouterr().err
    assert "is the evidence store itself" in err and len(err.strip().splitlines()) == 1
    assert store.read_bytes() == before
    with EvidenceStore.open(store) as s:
        assert s.test_ids() == ["//t:a"]


@pytest.mark.parametrize("target", ["dir", "unwritable"])
def test_export_to_a_directory_or_an_unwritable_path_is_one_line(
        tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path)
    out = tmp_path / "outdir" if target == "dir" else tmp_path / "afile" / "x.jsonl.gz"
    if target == "dir":
        out.mkdir()
    else:
        (tmp_path / "afile").write_text("a file, not a folder")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["evidence", "export", "--out", str(out), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastci: ") and len(err.strip().splitlines()) == 1, err


def test_invalid_json_in_a_store_cell_fails_export_in_one_line(tmp_path: Path) -> None:
    path = _store(tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE run SET workload = '{not json'")
    with EvidenceStore.open(path) as s:
        with pytest.raises(StoreError, match="malformed JSON cell"):
            exchange.export_store(s, tmp_path / "out.jsonl.gz")
    assert not (tmp_path / "out.jsonl.gz").exists()


def test_eval_from_a_deeply_nested_results_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "results.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    rc = cli.main(["eval", "--from", str(deep), "--out", str(tmp_path / "out"),
                   "--root", str(Path(__file__).resolve().parents[1])])
    err = capsys.readouterr().err
    assert rc == 2 and "nested too deeply" in err and len(err.strip().splitlines()) == 1, err


def test_a_zlib_bomb_in_a_calibration_row_leaves_the_rung_unused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastci.evidence.store import calibrations as calibration
    from fastci.evidence.store.calibrations import CalibrationStore, Rung

    monkeypatch.setattr(calibration, "MAX_COVERAGE_BYTES", 1 << 20)
    path = tmp_path / "cal.db"
    with CalibrationStore.open(path, create=True) as store:
        store.put(Rung(test="t.py::test_x", rung="full", declaration="d", overrides={},
                       commit="c", duration_s=1.0, gpus=0, outcome="passed", complete=True,
                       recorded_at=1.0))
        assert len(store.rungs("t.py::test_x")) == 1
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE rung SET coverage = ?", (zlib.compress(b" " * (16 << 20), 9),))
    with CalibrationStore.open(path) as store:
        assert store.rungs("t.py::test_x") == []  # not used: its test runs at full workload
