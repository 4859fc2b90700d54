"""Tests of selection over a real evidence store and a temporary git repository."""

from __future__ import annotations

from fastci.plan.planner import analyze
from fastci.plan.inputs import Given, KnownFingerprint
from fastci.config import Config
from fastci.select import DeclaredTest, DecisionKind, Selection
from selection_support import MODEL, OTHER, World, env_now, ingest, units_of, world  # noqa: F401 (fixture)


def chosen(sel: Selection) -> dict[str, set[DecisionKind]]:
    return {d.test: {r.kind for r in d.reasons} for d in sel.selected}


def test_nothing_changed_selects_nothing(world: World) -> None:
    sel = world.plan()
    assert chosen(sel) == {} and sel.mode == "selective"
    assert {d.reasons[0].kind for d in sel.skipped} == {DecisionKind.NOT_AFFECTED}


def test_fastci_own_files_are_not_changes(world: World) -> None:
    world.repo.write({".fastci/units.cache": "x", ".fastci/runs/bep.json": "{}"})
    assert chosen(world.plan()) == {} and world.plan().mode == "selective"


def test_a_read_file_moved_into_fastci_dir_still_selects_its_readers(world: World) -> None:
    world.repo.git("mv", "data/cfg.json", ".fastci/cfg.json")
    head = world.repo.commit()
    assert chosen(world.plan(head=head)) == {"//t:b": {DecisionKind.READ_CHANGED_FILE}}


def test_body_change_selects_only_tests_executing_the_unit(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    assert chosen(world.plan()) == {"//t:a": {DecisionKind.CHANGED_UNIT}}


def test_unexecuted_function_change_selects_the_tests_running_its_module(world: World) -> None:
    # No recording ever executed shift: the recorder may not see where it runs (a native
    # thread, a compiled frame), so the tests that run pkg/model.py's code run
    # (fastci.select.unseen; tests/test_unseen.py records the native-thread case).
    world.repo.write({"pkg/model.py": MODEL.replace("x + HIDDEN", "x - HIDDEN")})
    assert chosen(world.plan()) == {"//t:a": {DecisionKind.UNSEEN_CODE}}


def test_ordinary_new_helper_selects_nothing_extra(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL + "\n\ndef helper(x):\n    return x - 1\n",
                      "pkg/extra.py": "def new_helper():\n    return 5\n"})
    assert chosen(world.plan()) == {}


def test_comment_only_change_selects_nothing(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("return x * 2", "return x * 2  # twice")})
    assert chosen(world.plan()) == {}


def test_module_constant_reaches_the_tests_executing_its_users(world: World) -> None:
    # HIDDEN is used only by shift, which no test executes (issue 12 item 3).
    world.repo.write({"pkg/model.py": MODEL.replace("HIDDEN = 4", "HIDDEN = 5")})
    assert chosen(world.plan()) == {}
    used = MODEL.replace("return x * 2", "return x * HIDDEN")
    world.repo.write({"pkg/model.py": used})
    assert chosen(world.plan()) == {"//t:a": {DecisionKind.CHANGED_UNIT}}  # scale's body
    # Module code that is not only bindings still reaches every importer.
    world.repo.write({"pkg/model.py": MODEL.replace("HIDDEN = 4", "HIDDEN = 4\nprint(HIDDEN)")})
    assert chosen(world.plan()) == {"//t:a": {DecisionKind.CHANGED_UNIT}}  # via <module>
    world.repo.write({"pkg/model.py": MODEL.replace("def shift(x):", "def shift(x=HIDDEN):")})
    assert chosen(world.plan()) == {"//t:a": {DecisionKind.IMPORTS_CHANGED_MODULE}}


def test_recorded_read_maps_data_file(world: World) -> None:
    world.repo.write({"data/cfg.json": '{"a": 1}\n'})
    assert chosen(world.plan()) == {"//t:b": {DecisionKind.READ_CHANGED_FILE}}


def test_unknown_path_widens_with_its_name(world: World) -> None:
    world.repo.write({"data/new.bin": "x"})
    sel = world.plan()
    assert sel.mode == "all" and len(sel.selected) == 3
    assert "data/new.bin" in sel.widen[0].sentence and sel.widen[0].kind is DecisionKind.UNKNOWN_PATH


def test_run_all_and_ignore_and_path_tests(world: World) -> None:
    world.repo.write({"csrc/k.cu": "k"})
    sel = world.plan()
    assert sel.mode == "all" and sel.widen[0].kind is DecisionKind.RUN_ALL_PATH
    world.repo.write({"csrc/k.cu": None, "docs/x.md": "changed\n", "README.md": "changed\n"})
    sel = world.plan()
    assert chosen(sel) == {} and any("ignored" in n for n in sel.notes)
    world.repo.write({"assets/vocab.txt": "v"})
    cfg = Config(path_tests=(("assets/**", ("//t:c",)),))
    assert chosen(world.plan(cfg)) == {"//t:c": {DecisionKind.PATH_RULE}}


def test_always_select_rules(world: World) -> None:
    units = units_of(world.root, ["pkg/other.py"])
    ingest(world.store, "//t:c", units, commit=world.base, outcome="failed")
    ingest(world.store, "//t:b", {}, commit=world.base, complete=False)
    declared = dict(world.declared)
    declared["//t:new"] = DeclaredTest("//t:new", 2, {"steps": 4})
    declared["//t:a"] = DeclaredTest("//t:a", 1, {"steps": 8})
    sel = world.plan(declared=declared)
    assert chosen(sel) == {"//t:a": {DecisionKind.MODIFIED_TEST},
                           "//t:b": {DecisionKind.INCOMPLETE_EVIDENCE},
                           "//t:c": {DecisionKind.FAILED_LAST},
                           "//t:new": {DecisionKind.NEW_TEST}}
    assert sel.selected[0].test == "//t:c"  # likely failures run first


def test_test_source_change_is_modified_test(world: World) -> None:
    world.declared["//t:c"] = DeclaredTest("//t:c", 1, {}, ("pkg/other.py",))
    world.repo.write({"pkg/other.py": OTHER.replace("3", "4")})
    assert DecisionKind.MODIFIED_TEST in chosen(world.plan())["//t:c"]


def test_environment_change_selects_everything(world: World) -> None:
    sel = world.plan(env="env2")
    assert set(chosen(sel)) == {"//t:a", "//t:b", "//t:c"}
    assert all(DecisionKind.ENVIRONMENT_CHANGED in k for k in chosen(sel).values())


def test_unparsable_file_selects_tests_touching_it(world: World) -> None:
    world.repo.write({"pkg/data.py": "def load(:\n"})
    assert chosen(world.plan()) == {"//t:b": {DecisionKind.UNPARSABLE_FILE}}


def test_undeclared_recorded_test_is_skipped_with_reason(world: World) -> None:
    declared = {t: d for t, d in world.declared.items() if t != "//t:c"}
    sel = world.plan(declared=declared)
    assert sel.by_test["//t:c"].reasons[0].kind is DecisionKind.NOT_DECLARED
    assert not sel.by_test["//t:c"].selected


def test_missing_revision_widens(world: World) -> None:
    a = analyze(world.root, Config(), base="no-such-rev", declared=Given(world.declared),
                environment=KnownFingerprint(env_now()), store=world.store)
    assert a.plan.mode == "all" and "no-such-rev" in a.plan.reason
    assert len(a.selection.selected) == 3


def test_plan_model_round_trip(world: World) -> None:
    world.repo.write({"pkg/model.py": MODEL.replace("x * 2", "x * 3")})
    a = analyze(world.root, Config(), base=world.base, declared=Given(world.declared),
                environment=KnownFingerprint(env_now()), store=world.store)
    d = a.plan.to_dict()
    assert d["mode"] == "selective" and [t["id"] for t in d["tests"]] == ["//t:a"]
    assert d["tests"][0]["est_gpu_s"] == 10.0 and d["tests"][0]["overrides"] == {}
    assert {s["id"] for s in d["skipped"]} == {"//t:b", "//t:c"}
    assert "scale" in d["tests"][0]["why"]


def test_label_to_path() -> None:
    import pytest

    from fastci.plan.inputs import label_to_path
    from fastci.types import LabelError

    assert label_to_path("//examples/microllm/tests:tp_parity_test.py") == \
        "examples/microllm/tests/tp_parity_test.py"
    assert label_to_path("@//pkg:sub/x.py") == "pkg/sub/x.py"
    assert label_to_path("//:top.py") == "top.py"
    # Another repository's file has no path in this one (it used to become "@r//p/x.py").
    assert label_to_path("@r//p:x.py") is None
    with pytest.raises(LabelError, match="is not a valid Bazel label"):
        label_to_path("//pkg:")


def test_decisions_sharing_reasons_equal_decisions_made_one_by_one() -> None:
    """``Decision.sharing`` (used for the tests no change reaches) gives the decisions the
    constructor gives, derived properties included, for reasons that skip and that run."""
    import dataclasses

    from fastci.select.decisions import Decision, Reason

    for kind in (DecisionKind.NOT_AFFECTED, DecisionKind.CHANGED_UNIT, DecisionKind.PRUNED):
        reasons = (Reason(kind, f"{kind.value} here", via="a rule"),)
        make = Decision.sharing(reasons)
        for est in (None, 0.0, 12.5):
            shared, plain = make("//t:a", est), Decision("//t:a", reasons, est)
            assert shared == plain and hash(shared) == hash(plain)
            assert [(d.selected, d.set_aside, d.pruned, d.why) for d in (shared, plain)] == \
                [(plain.selected, plain.set_aside, plain.pruned, plain.why)] * 2
            moved = dataclasses.replace(shared, priority=0.5)
            assert moved == Decision("//t:a", reasons, est, 0.5) and moved.why == plain.why
    assert make("//t:a", 1.0) is not make("//t:a", 1.0)
