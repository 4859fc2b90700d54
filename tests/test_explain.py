"""Tests of `fastci explain`: the chain from a changed unit to the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci import cli
from fastci.select.explain import explain
from selection_support import MODEL, World, world  # noqa: F401 (fixture)


def test_chain_from_changed_unit_to_test(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    lines = explain(world.plan(), "//t:a", world.store)
    text = "\n".join(lines)
    assert lines[0] == "//t:a: RUNS"
    assert "changed unit  pkg/model.py::scale" in text
    assert "change        function body changed" in text
    assert "evidence: the test's recording executed pkg/model.py::scale" in text
    assert "contexts      ctx" in text and text.rstrip().endswith("10.0 GPU-seconds (recorded duration x GPUs)")


def test_skipped_and_unknown(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    sel = world.plan()
    lines = explain(sel, "//t:b", world.store)
    assert lines[0] == "//t:b: SKIPPED" and "not affected by the change" in lines[1]
    assert "did you mean //t:a" in explain(sel, "//t:aa")[0] or "not a known test" in explain(sel, "//t:aa")[0]


def test_explain_cli_widened_plan(world: World, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    world.repo.write({"data/unknown.bin": "x"})
    world.store.close()
    monkeypatch.setenv("FASTCI_STORE", str(world.root / ".fastci/evidence.db"))
    rc = cli.main(["explain", "//t:c", "--root", str(world.root), "--base", world.base, "--no-bazel"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("//t:c: RUNS")
    assert "plan widened to every test" in out and "data/unknown.bin" in out
    world.store = type(world.store).open(world.root / ".fastci/evidence.db")


def test_plan_cli_writes_plan_and_summary(world: World, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    monkeypatch.delenv("FASTCI_STORE", raising=False)
    rc = cli.main(["plan", "--root", str(world.root), "--base", world.base, "--no-bazel"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "selective: 1 of 3 tests selected, 2 skipped" in out
    assert "estimated GPU-seconds: 10.0 of 30.0" in out
    plan = Path(world.root / ".fastci/plan.json").read_text()
    assert '"//t:a"' in plan and '"version": 1' in plan


def test_plan_cli_shadow_keeps_the_decisions_but_runs_everything(
        world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fastci.plan.model import load_plan

    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    monkeypatch.delenv("FASTCI_STORE", raising=False)
    rc = cli.main(["plan", "--root", str(world.root), "--base", world.base, "--no-bazel", "--shadow"])
    out = capsys.readouterr().out
    plan = load_plan(world.root / ".fastci/plan.json")
    assert rc == 0 and plan.mode == "shadow" and plan.reason.startswith("shadow (everything runs): ")
    assert [t.id for t in plan.tests] == ["//t:a"] and {s.id for s in plan.skipped} == {"//t:b", "//t:c"}
    assert "shadow mode: every test runs" in out


def test_explain_cli_takes_a_node_id_for_a_label_recorded_test(
        world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The evidence names //t:a; its main file (the default, t/a.py) holds the pytest item.
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    world.store.close()
    monkeypatch.setenv("FASTCI_STORE", str(world.root / ".fastci/evidence.db"))
    rc = cli.main(["explain", "t/a.py::test_a", "--root", str(world.root), "--base", world.base,
                   "--no-bazel"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("//t:a: RUNS (as t/a.py::test_a)"), out
    assert "changed unit  pkg/model.py::scale" in out
    rc = cli.main(["explain", "t/zz.py::test_a", "--root", str(world.root), "--base", world.base,
                   "--no-bazel"])
    assert rc == 1 and "not a known test" in capsys.readouterr().out
    world.store = type(world.store).open(world.root / ".fastci/evidence.db")
