"""The calibration store and the ladder (issue 13 item 1): kept apart, safe on bad input."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fastci.errors import StoreError
from fastci.evidence.store.calibrations import CalibrationStore, Rung, declaration_digest
from fastci.plan.workload import ladder
from fastci.select import DeclaredTest

DECL = DeclaredTest("//t:a", 2, {"train_iters": 8, "hidden_size": 64, "num_heads": 4, "tp": 2},
                    floors={"train_iters": 2, "hidden_size": 32},
                    constraints=("hidden_size % num_heads == 0", "hidden_size >= 40 or tp == 2"),
                    scope=("parallel_parity",), check="exact", reference="relational")


def rung(name: str, overrides: dict[str, int], duration: float, **kw: object) -> Rung:
    base: dict[str, object] = dict(
        test="//t:a", rung=name, declaration=declaration_digest(DECL), overrides=overrides,
        commit="c1", duration_s=duration, gpus=2, outcome="passed", complete=True,
        recorded_at=1.0, lines={"m.py": frozenset({1, 2, 5})}, arcs={"m.py": frozenset({(1, 2), (-1, 1)})},
        units={"m.py::f": ("abc", frozenset({"tp=2"}))}, digests={"m.py": "d" * 64})
    base.update(kw)
    return Rung(**base)  # type: ignore[arg-type]


def test_ladder_covers_each_dimension_and_the_floors_within_constraints() -> None:
    names = dict(ladder(DECL))
    assert list(names)[0] == "full" and names["full"] == {}
    assert names["train_iters=2"] == {"train_iters": 2} and names["train_iters=5"] == {"train_iters": 5}
    assert names["hidden_size=32"] == {"hidden_size": 32} and names["hidden_size=48"] == {"hidden_size": 48}
    assert names["floors"] == {"train_iters": 2, "hidden_size": 32}
    # Frozen dimensions never move; no rung breaks a constraint.
    assert all("tp" not in o and "num_heads" not in o for o in names.values())
    strict = DeclaredTest(**{**DECL.__dict__, "constraints": ("hidden_size % 3 == 1",)})
    assert "hidden_size=32" not in dict(ladder(strict))  # 32 % 3 == 2
    perf = DeclaredTest(**{**DECL.__dict__, "check": "performance", "floors": {},
                           "frozen": None})
    assert ladder(perf) == [("full", {})]


def test_rungs_round_trip_cheapest_first_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "cal.db"
    with CalibrationStore.open(path, create=True) as store:
        store.put(rung("full", {}, 10.0))
        store.put(rung("train_iters=2", {"train_iters": 2}, 3.0))
        store.put(rung("train_iters=2", {"train_iters": 2}, 2.5, outcome="failed"))
    with CalibrationStore.open(path) as store:
        got = store.rungs("//t:a")
        assert [r.rung for r in got] == ["train_iters=2", "full"]
        assert got[0].outcome == "failed" and not got[0].usable and got[1].usable
        assert got[1].gpu_s == 20.0 and got[1].arcs["m.py"] == {(1, 2), (-1, 1)}
        assert got[1].units["m.py::f"] == ("abc", frozenset({"tp=2"}))
        assert store.tests() == ["//t:a"] and set(store.names("//t:a")) == {"full", "train_iters=2"}


def test_declaration_digest_moves_with_anything_that_bounds_a_reduction() -> None:
    d = declaration_digest(DECL)
    assert d == declaration_digest(DeclaredTest(**DECL.__dict__))
    for change in ({"floors": {"train_iters": 1, "hidden_size": 32}}, {"scope": ("other",)},
                   {"constraints": ()}, {"check": "tolerance"}, {"gpus": 4},
                   {"workload": {**(DECL.workload or {}), "train_iters": 9}}):
        assert declaration_digest(DeclaredTest(**{**DECL.__dict__, **change})) != d, change


def test_bad_stores_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no calibration at"):
        CalibrationStore.open(tmp_path / "absent.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="unreadable"):
        CalibrationStore.open(junk)
    path = tmp_path / "cal.db"
    with CalibrationStore.open(path, create=True) as store:
        store.put(rung("full", {}, 10.0))
        store.put(rung("floors", {"train_iters": 2, "hidden_size": 32}, 1.0))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE rung SET coverage = x'00ff' WHERE rung = 'floors'")
    conn.commit()
    conn.close()
    with CalibrationStore.open(path) as store:  # the corrupt rung is left out, not trusted
        assert [r.rung for r in store.rungs("//t:a")] == ["full"]
