"""Runs the shared corpus (constraint_cases.json, via constraint_cases.bzl) on the Starlark twin.

tests/test_workload.py runs the same cases on `fastci.plan.workload`, and checks
that constraint_cases.bzl embeds the current JSON.
"""

load("//rules/private:constraints.bzl", "check_constraint")
load("//rules/private:plan_model.bzl", "apply_overrides", "override_problems")
load(":constraint_cases.bzl", "CASES_JSON")
load(":unittest.bzl", "assert_contains", "assert_eq")

_CORPUS = json.decode(CASES_JSON)

def _types(d):
    return {k: type(v) for k, v in d.items()}

def _test_constraint_corpus():
    failures = []
    for case in _CORPUS["constraints"]:
        workload = case.get("workload", _CORPUS["default_workload"])
        res = check_constraint(case["expr"], workload)
        what = "check_constraint(%r)" % case["expr"]
        if "error" in case:
            assert_contains(failures, what, res.error, case["error"])
        else:
            assert_eq(failures, what, (res.ok, res.error), (case["result"], None))
    if len(_CORPUS["constraints"]) < 50:
        failures.append("the corpus lost its constraint cases (%d)" % len(_CORPUS["constraints"]))
    return failures

def _test_override_corpus():
    failures = []
    for case in _CORPUS["overrides"]:
        what = "override_problems(%s)" % case["name"]
        problems = override_problems(case["workload"], case["floors"], case["constraints"], case["overrides"])
        if len(problems) != len(case["problems"]):
            failures.append("%s: expected %r, got %r" % (what, case["problems"], problems))
            continue
        for got, prefix in zip(problems, case["problems"]):
            if not got.startswith(prefix):
                failures.append("%s: expected a problem starting %r, got %r" % (what, prefix, got))
        if not case["problems"]:
            reduced = apply_overrides(case["workload"], case["overrides"])
            assert_eq(failures, what + " reduced", reduced, case["reduced"])
            assert_eq(failures, what + " types", _types(reduced), _types(case["reduced"]))
    return failures

CONSTRAINTS_CASES = [_test_constraint_corpus, _test_override_corpus]
