"""Unit tests of //rules/private:validate.bzl (gpu_test argument checks)."""

load("//rules/private:validate.bzl", "check_declaration", "check_gpu_test_args", "is_dim_name", "resolve_reduction")
load(":declaration_cases.bzl", "CASES_JSON")
load(":unittest.bzl", "assert_contains", "assert_eq")

# The shared corpus rules/tests/declaration_cases.json (also run by tests/test_declarations.py).
_DECLARATIONS = json.decode(CASES_JSON)

_GOOD = dict(
    name = "t",
    srcs = ["t.py"],
    main = None,
    gpus = 1,
    workload = {"train_iters": 100, "dtype": "bf16", "lr": 0.5, "resume": False},
    floors = {"train_iters": 2, "lr": 0.1},
    scope = ["convergence"],
    constraints = ["train_iters % 2 == 0"],
    args = [],
    env = {},
    tags = [],
)

def _check(**changes):
    kw = dict(_GOOD)
    kw.update(changes)
    return check_gpu_test_args(**kw)

def _first(problems):
    if not problems:
        return None
    return "%s: %s" % (problems[0].attr, problems[0].msg)

def _test_valid():
    failures = []
    assert_eq(failures, "good args", _check(), [])
    assert_eq(failures, "gpus=0", _check(gpus = 0), [])
    assert_eq(failures, "main in srcs", _check(srcs = ["a.py", "b.py"], main = "b.py"), [])
    assert_eq(failures, "name.py in srcs", _check(srcs = ["t.py", "b.py"]), [])
    assert_eq(failures, "a CPU scale inside [floor, full]", _check(cpu_workload = {"train_iters": 10, "lr": 0.2}), [])
    return failures

def _test_errors_name_the_attribute():
    failures = []
    cases = [
        (dict(gpus = -1), "gpus: expected an int >= 0, got -1"),
        (dict(gpus = "2"), "gpus: expected an int >= 0, got string"),
        (dict(gpus = True), "gpus: expected an int >= 0, got bool"),
        (dict(srcs = []), "srcs: at least one source file"),
        (dict(srcs = ["a.py", "b.py"]), "main: several srcs"),
        (dict(main = "x.py"), 'main: "x.py" is not in srcs'),
        (dict(workload = {"bad-dim": 1}, floors = {}), 'workload: dimension "bad-dim" is not an identifier'),
        (dict(workload = {"x": [1]}, floors = {}), "workload: x: expected int, float, string or bool, got list"),
        (dict(workload = [], floors = {}), "workload: expected a dict"),
        (dict(floors = {"num_layers": 1}), 'floors: dimension "num_layers" is not in workload'),
        (dict(floors = {"train_iters": 200}), "floors: train_iters: floor 200 is above the full value 100"),
        (dict(floors = {"train_iters": 0}), "floors: train_iters: floor 0 must be > 0"),
        (dict(floors = {"train_iters": 1.5}), "floors: train_iters: the workload value is an int"),
        (dict(floors = {"dtype": 1}), "floors: dtype: a floor needs a numeric workload value"),
        (dict(floors = {"lr": "x"}), "floors: lr: expected a number"),
        (dict(scope = "convergence"), "scope: expected a list of strings, got string"),
        (dict(scope = ["a", "a"]), 'scope: duplicate item "a"'),
        (dict(scope = [""]), "scope: item 0: empty string"),
        (dict(constraints = [1]), "constraints: item 0: expected a string, got int"),
        (dict(args = ["--train_iters=5"]), 'args: "--train_iters=5" sets workload dimension "train_iters"'),
        (dict(env = {"FASTCI_WORKLOAD": "{}"}), "env: FASTCI_WORKLOAD is set by gpu_test itself"),
        (dict(env = {"A": 1}), "env: expected string -> string"),
        (dict(tags = ["gpus:4"]), 'tags: tag "gpus:4" is set by gpu_test itself'),
        (dict(tags = ["gpu"]), 'tags: tag "gpu" is set by gpu_test itself'),
        (dict(env = {"FASTCI_CPU_WORKLOAD": "{}"}), "env: FASTCI_CPU_WORKLOAD is set by gpu_test itself"),
        (dict(cpu_workload = []), "cpu_workload: expected a dict"),
        (dict(cpu_workload = {"dtype": "fp32"}), 'cpu_workload: "dtype" has no floor'),
        (dict(cpu_workload = {"train_iters": 1}), "cpu_workload: train_iters: 1 is outside [floor 2, full 100]"),
        (dict(cpu_workload = {"train_iters": 200}), "cpu_workload: train_iters: 200 is outside"),
        (dict(cpu_workload = {"train_iters": 10.0}), "cpu_workload: train_iters: expected int"),
    ]
    for changes, expected in cases:
        assert_contains(failures, "check(%r)" % (changes,), _first(_check(**changes)), expected)
    return failures

def _test_constraints_checked_on_the_full_workload():
    failures = []
    assert_eq(failures, "holds", _check(constraints = ["train_iters % 2 == 0", "lr <= 1 and dtype == 'bf16'", "not resume"]), [])
    cases = [
        (["train_iters % 3 == 0"], 'constraints: "train_iters % 3 == 0" does not hold on the full workload'),
        (["num_layers % 2 == 0"], "unknown name \"num_layers\""),
        (["train_iters %% 2"], "expected a value"),
        (["train_iters % 2 == 0 and"], "unexpected end of expression"),
        (["__import__('os')"], "unknown function __import__()"),
        (["train_iters + 1"], "evaluates to int, not a bool"),
        (["1 < train_iters < 200"], "chained comparison"),
    ]
    for constraints, expected in cases:
        assert_contains(failures, "constraints %r" % (constraints,), _first(_check(constraints = constraints)), expected)
    return failures

def _test_helpers():
    failures = []
    assert_eq(failures, "dim ok", is_dim_name("num_layers"), True)
    assert_eq(failures, "dim digit start", is_dim_name("1x"), False)
    assert_eq(failures, "dim empty", is_dim_name(""), False)
    assert_eq(failures, "dim dash", is_dim_name("a-b"), False)
    return failures

def _test_declaration_corpus():
    failures = []
    for case in _DECLARATIONS["cases"]:
        decl = dict(_DECLARATIONS["default_decl"])
        decl.update(case["with"])
        what = "check_declaration(%s)" % case["name"]
        problems = check_declaration(**decl)
        first = _first(problems)
        if case.get("problem_prefix"):
            if first == None or not first.startswith(case["problem_prefix"]):
                failures.append("%s: expected a problem starting %r, got %r" % (what, case["problem_prefix"], first))
        elif case.get("problem") != None:
            assert_eq(failures, what, first, case["problem"])
        else:
            assert_eq(failures, what, first, None)
            got = resolve_reduction(decl["workload"], decl["floors"], decl["frozen"], decl["check"], decl["reference"])
            assert_eq(failures, what + " resolved", {
                "frozen": got.frozen,
                "check": got.check,
                "reference": got.reference,
                "defaulted": got.defaulted,
            }, case["resolved"])

        # The macro's own check agrees with the corpus function.
        args = dict(_GOOD)
        args.update({k: v for k, v in decl.items()})
        assert_eq(failures, what + " via check_gpu_test_args", _first(check_gpu_test_args(**args)), first)
    if len(_DECLARATIONS["cases"]) < 30:
        failures.append("the declaration corpus lost its cases (%d)" % len(_DECLARATIONS["cases"]))
    return failures

VALIDATE_CASES = [_test_valid, _test_errors_name_the_attribute, _test_constraints_checked_on_the_full_workload, _test_helpers, _test_declaration_corpus]
