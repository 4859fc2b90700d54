"""Unit tests of //rules/private:exec_props.bzl (gpu_test's remote-execution properties).

Run by tests/test_exec_properties.py, which declares the `starlark_unit_test` in its
own workspace (not in //rules/tests: the other end-to-end tests count that package's tests).
"""

load("//rules/private:exec_props.bzl", "gpu_exec_properties")
load(":unittest.bzl", "assert_contains", "assert_eq")

def _first(result):
    if not result.problems:
        return None
    return "%s: %s" % (result.problems[0].attr, result.problems[0].msg)

def _test_derived():
    failures = []
    assert_eq(failures, "gpus only", gpu_exec_properties(2, None, None, None).props, {"gpus": "2"})
    assert_eq(failures, "cpu test", gpu_exec_properties(0, None, None, None).props, {})
    assert_eq(failures, "kind and pool", gpu_exec_properties(8, "h100-80gb", "gpu-h100", None).props,
              {"gpus": "8", "gpu-kind": "h100-80gb", "Pool": "gpu-h100"})
    assert_eq(failures, "pool on a cpu test", gpu_exec_properties(0, None, "cpu-large", {}).props, {"Pool": "cpu-large"})
    assert_eq(failures, "no problems", gpu_exec_properties(8, "h100-80gb", "gpu-h100", None).problems, [])
    return failures

def _test_merge():
    failures = []
    r = gpu_exec_properties(1, None, None, {"container-image": "docker://img:1", "gpus": "1"})
    assert_eq(failures, "caller keys kept, same value ok", r.props, {"gpus": "1", "container-image": "docker://img:1"})
    assert_eq(failures, "merge no problems", r.problems, [])
    assert_contains(failures, "contradiction", _first(gpu_exec_properties(1, None, None, {"gpus": "2"})),
                    "exec_properties: \"gpus\" = \"2\" contradicts the declaration (\"1\")")
    assert_contains(failures, "pool contradiction", _first(gpu_exec_properties(1, None, "a", {"Pool": "b"})), "contradicts")
    assert_contains(failures, "non-string value", _first(gpu_exec_properties(1, None, None, {"x": 1})), "keys and values must be strings")
    assert_contains(failures, "select", _first(gpu_exec_properties(1, None, None, ["x"])), "must be a plain dict")
    return failures

def _test_invalid():
    failures = []
    assert_contains(failures, "kind without gpus", _first(gpu_exec_properties(0, "a100", None, None)), "gpu_kind: \"a100\" needs gpus > 0")
    assert_contains(failures, "empty kind", _first(gpu_exec_properties(1, "", None, None)), "gpu_kind: must not be empty")
    assert_contains(failures, "kind not a string", _first(gpu_exec_properties(1, 100, None, None)), "gpu_kind: must be a string")
    assert_contains(failures, "pool with a space", _first(gpu_exec_properties(1, None, "my pool", None)), "pool: \"my pool\": only letters")
    return failures

EXEC_PROPS_CASES = [_test_derived, _test_merge, _test_invalid]
