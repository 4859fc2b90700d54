"""Tests of the plan model (fastci.plan.model): round trips and precise rejections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastci.errors import PlanError
from fastci.plan.model import Plan, PlannedTest, SkippedTest, dump_plan, load_plan, normalize_test_id

_DESIGN_EXAMPLE = {
    "version": 1,
    "base": "a1b2c3",
    "head": "d4e5f6",
    "mode": "selective",
    "reason": "3 units changed in 2 files",
    "tests": [
        {
            "id": "//examples/llm:tp_parity_test",
            "priority": 0.92,
            "overrides": {"train_iters": 2, "num_layers": 2},
            "why": "covers attention.py::Attention.forward in contexts {bf16,tp=2}",
            "est_gpu_s": 14.0,
        }
    ],
    "skipped": [{"id": "//examples/llm:golden_test", "why": "pruned: same contexts as tp_parity_test"}],
}


def test_design_example_parses_and_round_trips() -> None:
    plan = Plan.from_json(json.dumps(_DESIGN_EXAMPLE))
    assert plan.mode == "selective" and plan.base == "a1b2c3" and plan.head == "d4e5f6"
    assert plan.tests[0] == PlannedTest(
        id="//examples/llm:tp_parity_test",
        overrides={"train_iters": 2, "num_layers": 2},
        priority=0.92,
        why="covers attention.py::Attention.forward in contexts {bf16,tp=2}",
        est_gpu_s=14.0,
    )
    assert plan.skipped == (SkippedTest("//examples/llm:golden_test", "pruned: same contexts as tp_parity_test"),)
    assert plan.to_dict() == _DESIGN_EXAMPLE
    assert plan.planned("//examples/llm:tp_parity_test") is plan.tests[0]
    assert plan.planned("//nope:x") is None


def _with(**changes: Any) -> str:
    data = json.loads(json.dumps(_DESIGN_EXAMPLE))
    data.update(changes)
    return json.dumps(data)


_TEST = _DESIGN_EXAMPLE["tests"][0]  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "plan.json: not valid JSON: Expecting value: line 1 column 1 (char 0)"),
        ("{", "plan.json: not valid JSON"),
        ('{"version": NaN}', "non-standard JSON constant NaN"),
        ("[]", "plan.json: expected a JSON object at the top level, got list"),
        ('{"mode": "all"}', "plan.json: missing key 'version'"),
        (_with(version=2), "plan.json: unknown version 2 (this FastCI reads version 1)"),
        (_with(version=1.0), "plan.json: unknown version 1.0"),
        (_with(version=True), "plan.json: unknown version True"),
        (_with(mode="fast"), "plan.json: mode: expected one of selective, all, shadow, got 'fast'"),
        (_with(colour=1), "plan.json: unknown key 'colour'"),
        (_with(reason=7), "plan.json: reason: expected a string, got int"),
        (_with(tests={}), "plan.json: tests: expected a list, got dict"),
        (_with(tests=[_TEST, _TEST, {"id": "//x:t", "overrides": {"train_iters": [1]}}]),
         "plan.json: tests[1].id: //examples/llm:tp_parity_test is listed twice (also in tests[0])"),
        (_with(tests=[{"id": "//a:t"}, {"id": "//b:t"}, {"id": "//x:t", "overrides": {"train_iters": [1]}}]),
         "plan.json: tests[2].overrides.train_iters: expected int, float, str or bool, got list"),
        (_with(tests=[{"id": "//x:t", "overrides": {"a-b": 1}}]), "plan.json: tests[0].overrides: 'a-b' is not a dimension name"),
        (_with(tests=[{"id": "//x:t", "overrides": None}]), "plan.json: tests[0].overrides: expected an object, got null"),
        (_with(tests=[{"id": ""}]), "plan.json: tests[0].id: expected a non-empty string"),
        (_with(tests=[{"id": "//x:t", "priority": "high"}]), "plan.json: tests[0].priority: expected a number, got str"),
        (_with(tests=[{"id": "//x:t", "est_gpu_s": True}]), "plan.json: tests[0].est_gpu_s: expected a number, got bool"),
        (_with(tests=[{"id": "//x:t", "speed": 1}]), "plan.json: tests[0]: unknown key 'speed'"),
        (_with(skipped=[{"id": "@//examples/llm:tp_parity_test", "why": "w"}]),
         "plan.json: skipped[0].id: //examples/llm:tp_parity_test is listed twice (also in tests[0])"),
        (_with(skipped=[{"id": "//x:t", "why": 3}]), "plan.json: skipped[0].why: expected a string, got int"),
        (_with(skipped=["//x:t"]), "plan.json: skipped[0]: expected an object, got str"),
    ],
)
def test_malformed_plans_are_rejected_with_a_precise_message(text: str, message: str) -> None:
    with pytest.raises(PlanError) as info:
        Plan.from_json(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_pytest_node_ids_and_label_normalization() -> None:
    plan = Plan.from_json(_with(tests=[{"id": "tests/test_x.py::test_y[a]"}], skipped=[]))
    assert plan.tests[0].id == "tests/test_x.py::test_y[a]"
    assert normalize_test_id("@//p:t") == "//p:t"
    assert normalize_test_id("//p/q") == "//p/q:q"
    assert normalize_test_id("tests/t.py::x") == "tests/t.py::x"


def test_load_and_dump_atomically(tmp_path: Path) -> None:
    path = tmp_path / ".fastci" / "plan.json"
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(path)
    plan = Plan.run_all("evidence store missing")
    dump_plan(plan, path)
    assert load_plan(path) == plan
    assert json.loads(path.read_text())["mode"] == "all"
    assert sorted(p.name for p in path.parent.iterdir()) == ["plan.json"]  # no temp file left
    path.write_text("{")
    with pytest.raises(PlanError, match="plan.json: not valid JSON"):
        load_plan(path)


_dims = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_values = st.one_of(
    st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8), st.booleans()
)
_ids = st.one_of(
    st.from_regex(r"//[a-z]{1,5}:[a-z_]{1,8}", fullmatch=True),
    st.from_regex(r"tests/[a-z]{1,5}\.py::[a-z_]{1,8}", fullmatch=True),
)


@st.composite
def _plans(draw: st.DrawFn) -> Plan:
    ids = draw(st.lists(_ids, unique=True, max_size=6))
    cut = draw(st.integers(0, len(ids)))
    tests = tuple(
        PlannedTest(
            id=i,
            overrides=draw(st.dictionaries(_dims, _values, max_size=3)),
            priority=draw(st.one_of(st.none(), st.floats(0, 1))),
            why=draw(st.text(max_size=10)),
            est_gpu_s=draw(st.one_of(st.none(), st.floats(0, 1e4))),
        )
        for i in ids[:cut]
    )
    skipped = tuple(SkippedTest(i, draw(st.text(min_size=1, max_size=10))) for i in ids[cut:])
    return Plan(
        mode=draw(st.sampled_from(["selective", "all", "shadow"])),
        reason=draw(st.text(max_size=20)),
        tests=tests,
        skipped=skipped,
        base=draw(st.one_of(st.none(), st.text(max_size=8))),
    )


@settings(max_examples=40, deadline=None)
@given(_plans())
def test_any_plan_round_trips_through_json(plan: Plan) -> None:
    assert Plan.from_json(plan.to_json()) == plan


@settings(max_examples=40, deadline=None)
@given(_plans(), st.sampled_from(["tests", "skipped", "mode", "version", "reason"]), _values | st.lists(st.integers()))
def test_corrupting_a_field_is_rejected_or_still_valid(plan: Plan, key: str, junk: Any) -> None:
    data = plan.to_dict()
    data[key] = junk
    try:
        parsed = Plan.from_dict(data)
    except PlanError as exc:
        assert str(exc).startswith("plan.json: ") and "\n" not in str(exc)
    else:  # only a junk value that is itself valid may pass, and it is kept as is
        assert parsed.to_dict()[key] == data[key]


def test_validate_plan_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli

    path = tmp_path / ".fastci" / "plan.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_DESIGN_EXAMPLE))
    assert cli.main(["validate-plan", "--workspace", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{path}: ok: version 1, mode selective, 1 tests, 1 skipped (3 units changed in 2 files)"
    )
    path.write_text(_with(tests=[{"id": "//a:t"}, {"id": "//b:t"}, {"id": "//x:t", "overrides": {"train_iters": [1]}}]))
    assert cli.main(["validate-plan", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "fastci: plan.json: tests[2].overrides.train_iters: expected int, float, str or bool, got list"
    )


def test_overrides_checked_against_declarations() -> None:
    from fastci.integrations.bazel.query import TestDecl
    from fastci.cli.validate_plan import override_problems

    decl = TestDecl("//p:t", 1, {"steps": 100, "lr": 0.5, "dtype": "bf16"}, {"steps": 4}, (), (), ())
    plan = Plan.from_dict(
        {
            "version": 1,
            "mode": "selective",
            "tests": [
                {"id": "@//p:t", "overrides": {"steps": 2, "lr": 1, "dtype": 16, "seq": 8}},
                {"id": "//p:unknown", "overrides": {"x": 1}},
            ],
        }
    )
    assert override_problems(plan, [decl]) == [
        'tests[0].overrides (@//p:t): dtype: frozen (no floor declared), stays "bf16"',
        "tests[0].overrides (@//p:t): lr: frozen (no floor declared), stays 0.5",
        "tests[0].overrides (@//p:t): seq: not a declared dimension",
        "tests[0].overrides (@//p:t): steps: 2 is below its floor 4",
    ]
    # Above the full value, and a constraint broken by the reduced workload (issue 9 item 11).
    decl = TestDecl("//p:t", 1, {"steps": 100, "layers": 4}, {"steps": 4, "layers": 1}, (),
                    ("layers % 2 == 0",), ())
    above = Plan.from_dict({"version": 1, "mode": "selective",
                            "tests": [{"id": "//p:t", "overrides": {"steps": 200}}]})
    assert override_problems(above, [decl]) == [
        "tests[0].overrides (//p:t): steps: 200 is above the full value 100"]
    odd = Plan.from_dict({"version": 1, "mode": "selective",
                          "tests": [{"id": "//p:t", "overrides": {"layers": 3}}]})
    (problem,) = override_problems(odd, [decl])
    assert "layers % 2 == 0" in problem


# --- The tree a plan was made for (issue 9 item 6) ---------------------------------------------

_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_OTHER_TREE = "a" * 40


def test_tree_round_trips_and_must_be_a_string() -> None:
    plan = Plan.from_json(_with(tree=_TREE))
    assert plan.tree == _TREE and Plan.from_json(plan.to_json()) == plan
    assert list(plan.to_dict()) == ["version", "base", "head", "tree", "mode", "reason", "tests", "skipped"]
    assert "tree" not in Plan.from_json(_with()).to_dict()  # optional: hand-written plans have none
    with pytest.raises(PlanError, match=r"^plan.json: tree: expected a string, got int$"):
        Plan.from_json(_with(tree=7))


def test_a_plan_is_obeyed_only_on_its_tree() -> None:
    from fastci.plan.model import UNTIED_PROBLEM, for_tree, tree_problem

    plan = Plan.from_json(_with(tree=_TREE))
    assert tree_problem(plan, _TREE) is None and for_tree(plan, _TREE) == (plan, None)
    assert tree_problem(plan, _OTHER_TREE) == f"plan made for tree {_TREE}, this tree is {_OTHER_TREE}"
    assert tree_problem(plan, None) == f"plan made for tree {_TREE}, this tree is unknown"
    run, warning = for_tree(plan, _OTHER_TREE)
    assert run.mode == "all" and run.tests == () and run.skipped == ()
    assert warning == f"plan made for tree {_TREE}, this tree is {_OTHER_TREE}: running every test at full workload"
    assert _TREE in run.reason and _OTHER_TREE in run.reason
    # "unknown" never matches, even a plan that claims it.
    claims_unknown = Plan.from_json(_with(tree="unknown"))
    assert for_tree(claims_unknown, "unknown")[0].mode == "all"
    # A shadow plan for another tree runs everything too (its skip list is about another tree).
    assert for_tree(Plan.from_json(_with(tree=_TREE, mode="shadow")), _OTHER_TREE)[0].mode == "all"
    # Mode all runs everything anyway: no tree problem, no warning.
    everything = Plan.from_json(_with(tree=_TREE, mode="all"))
    assert for_tree(everything, _OTHER_TREE) == (everything, None)
    # Issue 34 item 6: a plan that names no tree (hand-written, or committed by a change)
    # is tied to no tree: not obeyed, on any tree, with one line saying why.
    handwritten = Plan.from_json(_with())
    for tree in (_TREE, _OTHER_TREE, None):
        obeyed, note = for_tree(handwritten, tree)
        assert obeyed.mode == "all" and obeyed.tests == () and obeyed.skipped == ()
        assert note == f"{UNTIED_PROBLEM}: running every test at full workload"
    assert "names no `tree`" in UNTIED_PROBLEM and "\n" not in UNTIED_PROBLEM
    # A hand-written plan that names the tree it is for is obeyed on that tree.
    assert for_tree(Plan.from_json(_with(tree=_TREE)), _TREE)[1] is None


def _world_with_ignores(root: Path) -> Any:
    from selection_support import World

    w = World(root)
    (root / ".gitignore").write_text("/.fastci/plan.json\n/.fastci/evidence.db*\n/.fastci/runs/\n")
    w.repo.commit(msg="ignore fastci files")
    return w


def test_fastci_plan_names_the_tree_it_analysed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli
    from fastci.integrations.git.tree import head_tree, worktree_tree

    w = _world_with_ignores(tmp_path)
    w.store.close()
    # An edit of another size: a same-size edit in the second of the commit is the racy
    # case of tests/test_plan_staleness.py, not what this test is about.
    w.repo.write({"pkg/model.py": (tmp_path / "pkg/model.py").read_text().replace("x * 2", "x * 20")})
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base]) == 0
    plan = load_plan(tmp_path / ".fastci/plan.json")
    assert plan.mode == "selective" and [t.id for t in plan.tests] == ["//t:a"]
    assert plan.tree == worktree_tree(tmp_path) != head_tree(tmp_path)
    assert f"(for tree {plan.tree})" in capsys.readouterr().out
    # --head REV: the tree of that commit, whatever is on disk.
    head = w.repo.commit(msg="change")
    w.repo.write({"README.md": "edited after the commit\n"})
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base, "--head", head]) == 0
    plan = load_plan(tmp_path / ".fastci/plan.json")
    assert plan.tree == head_tree(tmp_path, head) != worktree_tree(tmp_path)
    assert "not ignored by git" not in capsys.readouterr().out


def test_fastci_plan_warns_when_its_own_files_would_change_the_tree(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli
    from selection_support import World

    w = World(tmp_path)  # no .gitignore: .fastci/ is never part of the tree, anything else is
    w.store.close()
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base]) == 0
    assert "warning" not in capsys.readouterr().out
    (tmp_path / ".fastci/evidence.db").rename(tmp_path / "evidence.db")
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base,
                     "--store", "evidence.db", "--out", "plans/plan.json"]) == 0
    out = capsys.readouterr().out
    for name in ("plans/plan.json", "evidence.db"):
        assert f"warning: {name} is not ignored by git" in out and f"add /{name} to .gitignore" in out


def test_a_tree_edited_during_the_analysis_gets_a_plan_that_runs_everything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli
    from fastci.plan import planner  # `fastci plan` imports its stage when it runs

    w = _world_with_ignores(tmp_path)
    w.store.close()
    real = planner.analyze

    def edit_while_analysing(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        (tmp_path / "pkg/other.py").write_text("def other():\n    return 4\n")
        return result

    monkeypatch.setattr(planner, "analyze", edit_while_analysing)
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base]) == 0
    plan = load_plan(tmp_path / ".fastci/plan.json")
    assert plan.mode == "all" and plan.reason.startswith("the tree changed while it was analysed")
    assert "the working tree changed during the analysis" in capsys.readouterr().out


# --- A failed `fastci plan` leaves no selective plan (issue 9 item 6) --------------------------


@pytest.mark.parametrize("failure", ["config", "arguments", "unknown-option", "crash", "not-git"])
def test_failed_fastci_plan_leaves_no_selective_plan(
        failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli
    from fastci.plan import planner

    w = _world_with_ignores(tmp_path)
    w.store.close()
    w.repo.write({"pkg/model.py": (tmp_path / "pkg/model.py").read_text().replace("x * 2", "x * 20")})
    argv = ["plan", "--root", str(tmp_path), "--no-bazel", "--base", w.base]
    assert cli.main(argv) == 0
    path = tmp_path / ".fastci/plan.json"
    assert load_plan(path).mode == "selective"
    capsys.readouterr()
    if failure == "config":
        (tmp_path / "fastci.yaml").write_text("targets: [not, a, string]\n")
    elif failure == "arguments":
        argv += ["--head", "HEAD", "--worktree"]
    elif failure == "unknown-option":
        argv += ["--bogus"]
    elif failure == "crash":
        monkeypatch.setattr(planner, "analyze", lambda *a, **k: 1 / 0)
    else:
        import shutil

        shutil.rmtree(tmp_path / ".git")
    monkeypatch.chdir(tmp_path)  # usage errors find the plan from the arguments or the cwd
    if failure == "crash":
        with pytest.raises(ZeroDivisionError):
            cli.main(argv)
    elif failure in ("arguments", "unknown-option"):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
    else:
        assert cli.main(argv) == 2
    plan = load_plan(path)
    assert plan.mode == "all" and plan.tests == () and plan.skipped == ()
    assert plan.reason.startswith("fastci plan failed: ")
    err = capsys.readouterr().err
    assert f"fastci plan: failed; {path} now runs every test at full workload" in err


def test_failed_fastci_plan_creates_no_plan_where_there_was_none(tmp_path: Path) -> None:
    from fastci import cli

    (tmp_path / "fastci.yaml").write_text("bogus: 1\n")
    assert cli.main(["plan", "--root", str(tmp_path), "--no-bazel"]) == 2
    assert not (tmp_path / ".fastci").exists()


def test_validate_plan_says_whether_the_plan_is_for_this_tree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastci import cli
    from selection_support import Repo
    from fastci.integrations.git.tree import worktree_tree

    repo = Repo(tmp_path)
    repo.commit({".gitignore": "/.fastci/plan.json\n", "a.py": "x = 1\n"})
    path = tmp_path / ".fastci" / "plan.json"
    path.parent.mkdir()
    tree = worktree_tree(tmp_path)
    path.write_text(_with(tree=tree))
    assert cli.main(["validate-plan", "--workspace", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{path}: tree: matches this tree ({tree})"
    repo.write({"a.py": "x = 2\n"})
    assert cli.main(["validate-plan", "--workspace", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == (f"{path}: tree: STALE: plan made for tree {tree}, this tree is {worktree_tree(tmp_path)}: "
                    "every runner runs every test at full workload")
    path.write_text(_with())
    assert cli.main(["validate-plan", "--workspace", str(tmp_path)]) == 0
    assert "tree: none: the plan names no `tree`, so it is tied to no tree" in capsys.readouterr().out


# Issue 11 items 11 and 12: one line and the safe side for every plan a reader cannot take.

def test_a_plan_over_the_byte_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from fastci.plan.model import MAX_PLAN_BYTES

    path = tmp_path / "plan.json"
    with path.open("wb") as f:  # sparse: no byte of it was ever written, none is read
        f.truncate(MAX_PLAN_BYTES + 1)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(info.value) == f"plan.json: {MAX_PLAN_BYTES + 1} bytes, more than a plan may hold ({MAX_PLAN_BYTES} bytes)"
    with pytest.raises(PlanError, match="more than a plan may hold"):
        Plan.from_json(" " * (MAX_PLAN_BYTES + 1))


def test_the_issues_two_million_ids_are_refused_without_decoding(tmp_path: Path) -> None:
    # The issue's 39 MB plan: 2 million ids (15 s and 1.2 GB to validate before the cap).
    entry = '{"id": "//p:t%07d"}, '
    body = "".join(entry % i for i in range(2_000_000))
    path = tmp_path / "plan.json"
    path.write_text('{"version": 1, "mode": "selective", "tests": [' + body[:-2] + "]}")
    with pytest.raises(PlanError, match=r"^plan.json: \d+ bytes, more than a plan may hold"):
        load_plan(path)


def test_more_entries_than_a_plan_may_hold() -> None:
    from fastci.plan.model import MAX_ENTRIES

    data = json.loads(_with(skipped=[]))
    data["tests"] = [{"id": f"//p:t{i}"} for i in range(MAX_ENTRIES)]
    assert len(Plan.from_dict(data).tests) == MAX_ENTRIES  # the cap itself is fine
    data["skipped"] = [{"id": "//q:x", "why": "not affected"}]
    with pytest.raises(PlanError) as info:
        Plan.from_dict(data)
    assert str(info.value) == (f"plan.json: skipped: {MAX_ENTRIES + 1} entries in tests and skipped together, "
                               f"more than a plan may hold ({MAX_ENTRIES})")


def test_deeply_nested_plan_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("[" * 100_000)
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(info.value) == "plan.json: not valid JSON: nested too deeply"


def test_duplicate_keys_are_refused() -> None:
    text = _with(mode="selective").replace('"mode": "selective"', '"mode": "all", "mode": "selective"')
    with pytest.raises(PlanError) as info:
        Plan.from_json(text)
    assert str(info.value) == "plan.json: duplicate key 'mode' in one JSON object (JSON would keep only the last value)"


def test_a_skip_needs_a_why() -> None:
    for entry in ({"id": "//x:t"}, {"id": "//x:t", "why": ""}):
        with pytest.raises(PlanError) as info:
            Plan.from_json(_with(skipped=[entry]))
        assert str(info.value) == "plan.json: skipped[0].why: a skipped test needs a reason (a non-empty string)"
    assert Plan.from_json(_with(tests=[{"id": "//x:t"}])).tests[0].why == ""  # a run test may leave it out


def test_a_huge_reason_is_refused_and_never_printed_whole(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(_with(reason="r" * 10_000_000, tests=[{"id": "//x:t", "k" * 100_000: 1}]))
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(info.value) == "plan.json: reason: 10000000 characters, more than a plan string may hold (4096)"
    path.write_text(_with(tests=[{"id": "//x:t", "k" * 100_000: 1}]))
    with pytest.raises(PlanError) as info:
        load_plan(path)
    message = str(info.value)
    assert message.startswith("plan.json: tests[0]: unknown key 'kkk") and len(message) < 1100
    full = ("plan.json: tests[0]: unknown key '" + "k" * 100_000
            + "' (allowed: id, overrides, priority, why, est_gpu_s)")
    assert message == full[:1000] + f"... ({len(full) - 1000} more characters)"


def test_what_a_writer_writes_stays_under_the_string_cap(tmp_path: Path) -> None:
    # `fastci plan` writes reasons it did not choose (an error text): never refused for length.
    plan = Plan(mode="all", reason="fastci plan failed: " + "e" * 10_000,
                tests=(PlannedTest("//a:t", why="w" * 5000),), skipped=(SkippedTest("//b:t", "s" * 5000),))
    dump_plan(plan, tmp_path / "plan.json")
    back = load_plan(tmp_path / "plan.json")
    assert back.reason.startswith("fastci plan failed: eee") and back.reason.endswith("(cut: 10020 characters in all)")
    assert back.tests[0].why.endswith("(cut: 5000 characters in all)")
    assert back.skipped[0].why.endswith("(cut: 5000 characters in all)")


def test_validate_plan_and_the_pytest_plugin_take_a_deep_plan_safely(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "plan.json").write_text("[" * 100_000)
    res = subprocess.run([sys.executable, "-m", "fastci", "validate-plan", str(tmp_path / "plan.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "plan.json: not valid JSON: nested too deeply" in res.stderr
    assert "Traceback" not in res.stderr and "RecursionError" not in res.stderr
    (tmp_path / "test_s.py").write_text("def test_a():\n    print('RAN a')\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-W", "default",
                          "--fastci-plan", "plan.json", "test_s.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "INTERNALERROR" not in out and "RAN a" in out
    assert "fastci: plan.json: not valid JSON: nested too deeply; running every test" in out


_JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (st.lists(inner, max_size=3) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                   | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=2)),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_plan_json_text_is_json_dumps_indent_2(value: Any) -> None:
    """The plan writer's fast pretty-printer writes json.dumps(indent=2)'s very text."""
    from fastci.plan.model import _pretty

    assert _pretty(value, "\n") == json.dumps(value, indent=2)


def test_plan_to_json_is_json_dumps_of_its_dict() -> None:
    plan = Plan(mode="selective", reason="r\u00e9ason \"q\"", base="abc", head=None,
                tests=(PlannedTest("//a:t", {"steps": 2, "lr": 0.5}, 0.5, "why \u2603", 1.25),
                       PlannedTest("//a:u", {}, 1.0, "", None)),
                skipped=(SkippedTest("//b:t", "no\nchange"),))
    assert plan.to_json() == json.dumps(plan.to_dict(), indent=2) + "\n"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=8), st.text(max_size=8),
                          st.lists(st.text(min_size=1, max_size=8), max_size=3)), max_size=4),
       st.text(max_size=8), st.sampled_from(["selective", "all"]))
def test_plan_to_json_writes_skipped_entries_as_json_dumps_does(
        skipped: list[tuple[str, str, list[str]]], reason: str, mode: str) -> None:
    """The skipped entries are written straight from the plan (not through its dict): the
    text is still json.dumps(indent=2)'s, whatever the ids, whys, stand-ins and reason
    hold ("null", quotes, control and non-ASCII characters)."""
    plan = Plan(mode=mode, reason=reason or "null", base=None, head="h",
                tests=(PlannedTest("//a:t", {"steps": 2}, 0.5, "null", None),),
                skipped=tuple(SkippedTest(i, w, tuple(s)) for i, w, s in skipped)
                if mode == "selective" else ())
    assert plan.to_json() == json.dumps(plan.to_dict(), indent=2) + "\n"
