"""Runs the shared corpus (plan_cases.json, via plan_cases.bzl) on the Starlark twin.

tests/test_plan_corpus.py runs the same cases on `fastci.plan.model` and
`fastci.types`, and checks that plan_cases.bzl embeds the current JSON.
"""

load("//rules/private:plan_model.bzl", "is_label", "label_problem", "normalize_label", "parse_plan", "plan_problem")
load(":plan_cases.bzl", "CASES_JSON")
load(":unittest.bzl", "assert_eq")

_CORPUS = json.decode(CASES_JSON)

def _plan_of(case):
    if "plan" in case:
        return case["plan"]
    plan = dict(_CORPUS["base_plan"])
    plan.update(case.get("with", {}))
    for key in case.get("without", []):
        plan.pop(key)
    return plan

def _test_plan_corpus():
    failures = []
    for case in _CORPUS["plans"]:
        plan = _plan_of(case)
        what = "plan %r" % case["name"]
        if "error" in case:
            assert_eq(failures, what, plan_problem(plan), case["error"])
            parsed = parse_plan(plan)
            assert_eq(failures, what + " falls back", (parsed["ok"], parsed["mode"]), (False, "all"))
            continue
        assert_eq(failures, what, plan_problem(plan), None)
        parsed = parse_plan(plan)
        assert_eq(failures, what + " ok", parsed["ok"], True)
        if parsed["mode"] != "all":  # mode all keeps no per-test entries: everything runs full
            assert_eq(failures, what + " tests", parsed["tests"], case["ok"]["tests"])
            assert_eq(failures, what + " skipped", parsed["skipped"], case["ok"]["skipped"])
    kinds = [c.get("error") == None for c in _CORPUS["plans"]]
    if len(_CORPUS["plans"]) < 40 or True not in kinds or False not in kinds:
        failures.append("the corpus lost its plan cases (%d)" % len(_CORPUS["plans"]))
    return failures

def _test_label_corpus():
    failures = []
    for case in _CORPUS["labels"]:
        s = case["id"]
        what = "label %r" % s
        assert_eq(failures, what + " is_label", is_label(s), case["kind"] != "pytest")
        assert_eq(failures, what + " normalized", normalize_label(s), case["normalized"])
        if case["kind"] != "pytest":
            assert_eq(failures, what + " problem", label_problem(s), case.get("problem"))
    if len(_CORPUS["labels"]) < 40:
        failures.append("the corpus lost its label cases (%d)" % len(_CORPUS["labels"]))
    return failures

PLAN_CORPUS_CASES = [_test_plan_corpus, _test_label_corpus]
