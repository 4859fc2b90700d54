"""Unit tests of //rules/private:plan_model.bzl (plan parsing and per-test decisions)."""

load("//rules/private:plan_model.bzl", "conditional_prunes", "decide_test", "normalize_label", "parse_plan", "plan_problem")
load(":unittest.bzl", "assert_contains", "assert_eq")

_WORKLOAD = {"train_iters": 100, "num_layers": 4, "lr": 2.0, "dtype": "bf16", "tp": 2}
_FLOORS = {"train_iters": 2, "num_layers": 2, "lr": 0.5}
_CONSTRAINTS = ["num_layers % tp == 0"]

def _plan(**changes):
    plan = {
        "version": 1,
        "mode": "selective",
        "reason": "2 units changed",
        "tests": [
            {"id": "//p:a", "overrides": {"train_iters": 2}, "priority": 0.9, "why": "w", "est_gpu_s": 1.5},
            {"id": "@//p:c"},
        ],
        "skipped": [{"id": "//p:b", "why": "pruned: same contexts as //p:a"}],
    }
    plan.update(changes)
    return plan

def _test_problems():
    failures = []
    assert_eq(failures, "valid", plan_problem(_plan()), None)
    cases = [
        ([], "expected a JSON object at the top level, got list"),
        ({"mode": "all"}, "missing key 'version'"),
        (_plan(version = 2), "unknown version 2"),
        (_plan(version = "1"), "unknown version '1'"),
        (_plan(mode = "some"), "mode: expected one of selective, all, shadow, got 'some'"),
        (_plan(extra = 1), "unknown key 'extra'"),
        (_plan(tests = {}), "tests: expected a list, got dict"),
        (_plan(tests = [{"id": ""}]), "tests[0].id: expected a non-empty string"),
        (_plan(tests = [{"why": "x"}]), "tests[0].id: expected a non-empty string"),
        (_plan(tests = [{"id": "//p:a", "overrides": {"x": [1]}}]), "tests[0].overrides.x: expected int, float, str or bool, got list"),
        (_plan(tests = [{"id": "//p:a", "overrides": []}]), "tests[0].overrides: expected an object, got list"),
        (_plan(tests = [{"id": "//p:a", "priority": "high"}]), "tests[0].priority: expected a number, got str"),
        (_plan(tests = [{"id": "//p:a", "colour": 1}]), "tests[0]: unknown key 'colour'"),
        (_plan(skipped = [{"id": "//p:a", "why": "w"}]), "skipped[0].id: //p:a is listed twice (also in tests[0])"),
        (_plan(reason = 3), "reason: expected a string, got int"),
    ]
    for plan, expected in cases:
        assert_contains(failures, "plan_problem(%r)" % (plan,), plan_problem(plan), expected)
    return failures

def _test_parse():
    failures = []
    p = parse_plan(_plan())
    assert_eq(failures, "ok", p["ok"], True)
    assert_eq(failures, "tests", p["tests"], {"//p:a": {"train_iters": 2}, "//p:c": {}})
    assert_eq(failures, "skipped", p["skipped"], {"//p:b": "pruned: same contexts as //p:a"})
    assert_contains(failures, "status", p["status"], "ok: selective plan, 2 tests, 1 skipped (2 units changed)")
    bad = parse_plan(None, "no plan file")
    assert_eq(failures, "fallback ok", bad["ok"], False)
    assert_contains(failures, "fallback status", bad["status"], "fallback: no plan file; every gpu_test runs at full workload")
    all_mode = parse_plan(_plan(mode = "all"))
    assert_eq(failures, "mode all selects nothing specially", (all_mode["tests"], all_mode["skipped"]), ({}, {}))
    assert_eq(failures, "label //p", normalize_label("//p"), "//p:p")
    assert_eq(failures, "label @//p:t", normalize_label("@//p:t"), "//p:t")
    assert_eq(failures, "pytest id", normalize_label("tests/test_x.py::test_y"), "tests/test_x.py::test_y")
    return failures

def with_overrides(o):
    return parse_plan(_plan(tests = [{"id": "//p:a", "overrides": o}]))

def _test_decide():
    failures = []
    plan = parse_plan(_plan())
    a = decide_test(plan, "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "a reduced", (a.skip, a.workload["train_iters"], a.workload["num_layers"]), (False, 2, 4))
    b = decide_test(plan, "//p:b", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "b skipped", b.skip, True)
    assert_contains(failures, "b why", b.status, "skipped: pruned")
    # A pruned test is skipped only where a failure runs it (fastci run: rerun True).
    pruned_plan = _plan(skipped = [{"id": "//p:b", "why": "pruned: w", "stand_ins": ["//p:a"]}, {"id": "//p:d", "why": "not affected"}])
    parsed = parse_plan(pruned_plan)
    under_run = decide_test(conditional_prunes(parsed, pruned_plan, True), "//p:b", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "pruned skipped under fastci run", under_run.skip, True)
    plain = conditional_prunes(parsed, pruned_plan, False)
    pb = decide_test(plain, "//p:b", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "pruned runs full under plain bazel", (pb.skip, pb.workload), (False, _WORKLOAD))
    assert_eq(failures, "pruned status", pb.status, "ok: selective plan: pruned, runs at full workload: nothing here runs it after a failure")
    assert_eq(failures, "a plain skip stays skipped", decide_test(plain, "//p:d", _WORKLOAD, _FLOORS, _CONSTRAINTS).skip, True)
    assert_contains(failures, "plan status counts them", plain["status"], "1 pruned test(s) run at full workload")
    new = decide_test(plan, "//p:new", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "unplanned test runs full", (new.skip, new.workload), (False, _WORKLOAD))
    assert_eq(failures, "unplanned status", new.status, "ok: selective plan: not in the plan: runs at full workload")

    below = decide_test(with_overrides({"num_layers": 1}), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "below floor runs full", below.workload, _WORKLOAD)
    assert_contains(failures, "below floor status", below.status, "overrides ignored (num_layers: 1 is below its floor 2): runs at full workload")
    unknown = decide_test(with_overrides({"seq": 8}), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_contains(failures, "unknown dim", unknown.status, "seq: not a declared dimension")
    wrong = decide_test(with_overrides({"train_iters": 2.5}), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_contains(failures, "wrong type", wrong.status, "train_iters: expected int like the full value, got float")

    # Issue 9 item 11: frozen dims, values above full and violated constraints all run full.
    for overrides, why in [
        ({"dtype": "fp32"}, "dtype: frozen (no floor declared), stays \"bf16\""),
        ({"tp": 1}, "tp: frozen (no floor declared), stays 2"),
        ({"train_iters": 101}, "train_iters: 101 is above the full value 100"),
        ({"num_layers": 3}, 'constraint "num_layers % tp == 0" does not hold at num_layers=3'),
        ({"num_layers": 2, "tp": 1}, "tp: frozen"),
    ]:
        d = decide_test(with_overrides(overrides), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
        assert_eq(failures, "%r runs full" % (overrides,), (d.skip, d.workload), (False, _WORKLOAD))
        assert_contains(failures, "%r status" % (overrides,), d.status, why)
    ok = decide_test(with_overrides({"num_layers": 2, "train_iters": 2}), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "constraint-satisfying reduction applies", (ok.workload["num_layers"], ok.workload["train_iters"], ok.workload["tp"]), (2, 2, 2))
    lr = decide_test(with_overrides({"lr": 1}), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "int override of float dim", (lr.workload["lr"], type(lr.workload["lr"])), (1.0, "float"))
    shadow = decide_test(parse_plan(_plan(mode = "shadow")), "//p:b", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "shadow runs skipped tests, full", (shadow.skip, shadow.workload, shadow.shadow_skip), (False, _WORKLOAD, "pruned: same contexts as //p:a"))
    broken = decide_test(parse_plan(None, "bad"), "//p:b", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "fallback runs all full", (broken.skip, broken.workload), (False, _WORKLOAD))
    return failures

def _test_status_holds_only_per_test_facts():
    # Issue 11 item 15: FASTCI_PLAN_STATUS is in the test's environment, a cache key
    # under --config=fastci: two plans that run a test alike must give it one status.
    failures = []
    one = parse_plan(_plan())
    other = parse_plan(_plan(
        reason = "another change, 7 units",
        tree = "0123abcd",
        tests = [{"id": "//p:a", "overrides": {"train_iters": 2}, "why": "another why"}, {"id": "//p:c"}, {"id": "//p:d"}],
        skipped = [{"id": "//p:b", "why": "not affected"}, {"id": "//p:e", "why": "not affected"}],
    ))
    assert_eq(failures, "plan-wide status differs", one["status"] != other["status"], True)
    for label in ("//p:a", "//p:c", "//p:new"):
        a = decide_test(one, label, _WORKLOAD, _FLOORS, _CONSTRAINTS)
        b = decide_test(other, label, _WORKLOAD, _FLOORS, _CONSTRAINTS)
        assert_eq(failures, label + " same status under both plans", a.status, b.status)
        for plan_wide in ("2 units changed", "another change", "0123abcd", " tests", "skipped"):
            assert_eq(failures, "%s status %r has no %r" % (label, a.status, plan_wide), plan_wide in a.status, False)
    a = decide_test(one, "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "a status", a.status, "ok: selective plan: planned: overrides train_iters=2")
    c = decide_test(one, "//p:c", _WORKLOAD, _FLOORS, _CONSTRAINTS)
    assert_eq(failures, "c status", c.status, "ok: selective plan: planned: runs at full workload (no overrides)")
    for mode, want in (("all", "ok: mode all: runs at full workload"), ("shadow", "ok: shadow plan: runs at full workload")):
        for reason in ("r1", "r2"):
            d = decide_test(parse_plan(_plan(mode = mode, reason = reason)), "//p:a", _WORKLOAD, _FLOORS, _CONSTRAINTS)
            assert_eq(failures, "mode %s status (reason %s)" % (mode, reason), d.status, want)
    return failures

def _test_caps_and_required_why():
    # Issue 11 items 11 and 12: caps on what a plan holds; a skip says why.
    failures = []
    many = [{"id": "//p:t%d" % i} for i in range(250001)]
    assert_eq(failures, "entry cap", plan_problem(_plan(tests = many, skipped = [])),
              "plan.json: tests: 250001 entries in tests and skipped together, more than a plan may hold (250000)")
    assert_eq(failures, "entry cap across both lists", plan_problem(_plan(tests = many[:250000], skipped = [{"id": "//q:x", "why": "w"}])),
              "plan.json: skipped: 250001 entries in tests and skipped together, more than a plan may hold (250000)")
    assert_eq(failures, "no why", plan_problem(_plan(skipped = [{"id": "//p:b"}])),
              "plan.json: skipped[0].why: a skipped test needs a reason (a non-empty string)")
    huge = "x" * 5000
    problem = plan_problem(_plan(tests = [{"id": "//p:a", "colour" + huge: 1}]))
    assert_eq(failures, "a problem quoting a huge key is cut", (len(problem) < 1100, problem.endswith("more characters)")), (True, True))
    assert_eq(failures, "fallback on a long reason", parse_plan(_plan(reason = huge))["ok"], False)
    return failures

PLAN_MODEL_CASES = [_test_problems, _test_parse, _test_decide, _test_status_holds_only_per_test_facts, _test_caps_and_required_why]
