"""Pure argument checks for `gpu_test` (no `native.*`, so they are unit-testable).

Every check returns a list of `struct(attr, msg)` problems; the macro fails on
the first one. `//rules/tests:validate_test` runs them against known cases.
"""

load(":constraints.bzl", "check_constraint")

SCALAR_TYPES = ["int", "float", "string", "bool"]

# The strength of a test's check, strongest first; "performance" (throughput,
# latency) is never reduced. Same list as fastci.plan.workload.CHECKS.
CHECKS = ["exact", "tolerance", "threshold", "completes", "performance"]

# What a test compares with: "relational" = two runs made inside the test
# (meaningful at any workload); "absolute" = fixed numbers recorded at one
# workload (goldens, thresholds). Same list as fastci.plan.workload.REFERENCES.
REFERENCES = ["relational", "absolute"]

# Defaults for a gpu_test that does not declare them, each the safe side:
# "completes" claims the weakest check (pruning never prefers an undeclared
# test as a stand-in for a declared stronger one); "absolute" lets a plan
# reduce the test only to workloads with a recorded reference, else not at all.
DEFAULT_CHECK = "completes"
DEFAULT_REFERENCE = "absolute"

# Environment variables the launcher owns; a caller's `env` must not set them.
RESERVED_ENV = [
    "FASTCI_WORKLOAD",
    "FASTCI_DECLARED_WORKLOAD",
    "FASTCI_MODE",
    "FASTCI_TEST_ID",
    "FASTCI_GPUS",
    "FASTCI_TEST_MAIN",
    "FASTCI_PLAN_STATUS",
    "FASTCI_SHADOW_SKIP",
    "FASTCI_CPU_WORKLOAD",
]


_IDENT_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_IDENT_REST = _IDENT_START + "0123456789"

def _problem(attr, msg):
    return struct(attr = attr, msg = msg)

def is_dim_name(s):
    """Returns True when `s` can be a workload dimension (`--<dim>=<value>` flag)."""
    if type(s) != "string" or not s or s[0] not in _IDENT_START:
        return False
    for c in s.elems():
        if c not in _IDENT_REST:
            return False
    return True

def is_number(v):
    """Returns True for int and float values (bool is neither in Starlark)."""
    return type(v) in ("int", "float")

def _check_string_list(attr, value, allow_empty_items = False):
    if type(value) != "list":
        return [_problem(attr, "expected a list of strings, got %s" % type(value))]
    seen = {}
    for i, item in enumerate(value):
        if type(item) != "string":
            return [_problem(attr, "item %d: expected a string, got %s %r" % (i, type(item), item))]
        if not item and not allow_empty_items:
            return [_problem(attr, "item %d: empty string" % i)]
        if item in seen:
            return [_problem(attr, "duplicate item %r" % item)]
        seen[item] = True
    return []

def check_workload(workload, floors):
    """Checks `workload` (dim -> full value) and `floors` (dim -> minimum)."""
    if type(workload) != "dict":
        return [_problem("workload", "expected a dict of dimension -> value, got %s" % type(workload))]
    for dim, value in workload.items():
        if not is_dim_name(dim):
            return [_problem("workload", "dimension %r is not an identifier ([A-Za-z_][A-Za-z0-9_]*)" % (dim,))]
        if type(value) not in SCALAR_TYPES:
            return [_problem("workload", "%s: expected int, float, string or bool, got %s" % (dim, type(value)))]
    if type(floors) != "dict":
        return [_problem("floors", "expected a dict of dimension -> minimum, got %s" % type(floors))]
    for dim, floor in floors.items():
        if dim not in workload:
            return [_problem("floors", "dimension %r is not in workload (%s)" % (dim, ", ".join(sorted(workload.keys())) or "empty"))]
        full = workload[dim]
        if not is_number(full):
            return [_problem("floors", "%s: a floor needs a numeric workload value, got %s %r" % (dim, type(full), full))]
        if not is_number(floor):
            return [_problem("floors", "%s: expected a number, got %s %r" % (dim, type(floor), floor))]
        if type(full) == "int" and type(floor) != "int":
            return [_problem("floors", "%s: the workload value is an int, the floor must be too (got %r)" % (dim, floor))]
        if floor > full:
            return [_problem("floors", "%s: floor %r is above the full value %r" % (dim, floor, full))]
        if floor <= 0:
            return [_problem("floors", "%s: floor %r must be > 0" % (dim, floor))]
    return []

def check_constraints(workload, constraints):
    """Checks that each constraint parses, names only declared dimensions and holds on the full workload.

    The all-floors workload is not checked: floors are independent lower
    bounds, not a workload the test promises to accept; a plan's reduced
    workload is checked against every constraint when it is applied.
    """
    for text in constraints:
        res = check_constraint(text, workload)
        if res.error:
            return [_problem("constraints", "%r: %s" % (text, res.error))]
        if not res.ok:
            return [_problem("constraints", "%r does not hold on the full workload" % text)]
    return []

def _one_of(attr, value, allowed):
    if type(value) != "string" or value not in allowed:
        return [_problem(attr, "expected one of %s, got %r" % (", ".join(allowed), value))]
    return []

def check_reduction(workload, floors, frozen, check, reference):
    """Checks the reduction attributes `frozen`, `check` and `reference` (None = not declared).

    Assumes `workload` and `floors` passed `check_workload`. With `frozen`
    declared, every workload dimension is in exactly one of `floors` (may
    shrink down to its floor) and `frozen` (never reduced); undeclared, the
    dimensions without a floor are frozen. A `performance` check is never
    reduced, so it takes no floors.
    """
    if frozen != None:
        problems = _check_string_list("frozen", frozen)
        if problems:
            return problems
        for dim in frozen:
            if dim not in workload:
                return [_problem("frozen", "dimension %r is not in workload (%s)" % (dim, ", ".join(sorted(workload.keys())) or "empty"))]
            if dim in floors:
                return [_problem("frozen", "%s has a floor: a dimension shrinks to its floor or is frozen, not both" % dim)]
        for dim in sorted(workload.keys()):
            if dim not in floors and dim not in frozen:
                return [_problem("frozen", "%s has no floor and is not frozen: give it a floor or list it in frozen" % dim)]
    if check != None:
        problems = _one_of("check", check, CHECKS)
        if problems:
            return problems
    if reference != None:
        problems = _one_of("reference", reference, REFERENCES)
        if problems:
            return problems
    if check == "performance" and floors:
        return [_problem("check", "a performance check is never reduced: it takes no floors (got %s)" % ", ".join(sorted(floors.keys())))]
    return []

def resolve_reduction(workload, floors, frozen, check, reference):
    """The reduction declaration with defaults applied (arguments already valid).

    Returns struct(frozen, check, reference, defaulted): `frozen` sorted,
    `defaulted` the names of the attributes left undeclared (sorted).
    """
    defaulted = []
    if frozen == None:
        defaulted.append("frozen")
        frozen = [d for d in workload if d not in floors]
    if check == None:
        defaulted.append("check")
        check = DEFAULT_CHECK
    if reference == None:
        defaulted.append("reference")
        reference = DEFAULT_REFERENCE
    return struct(frozen = sorted(frozen), check = check, reference = reference, defaulted = sorted(defaulted))

def check_declaration(workload, floors, scope, constraints, frozen = None, check = None, reference = None):
    """Checks a test's workload declaration; the twin of `fastci.plan.workload.reduction_problems`.

    `//rules/tests:validate_test` and tests/test_declarations.py run the shared
    corpus rules/tests/declaration_cases.json on both.
    """
    return (check_workload(workload, floors) or
            _check_string_list("scope", scope) or
            _check_string_list("constraints", constraints) or
            check_constraints(workload, constraints) or
            check_reduction(workload, floors, frozen, check, reference))

def check_cpu_workload(workload, floors, cpu_workload):
    """Checks `cpu_workload` (dim -> value run on a host without GPUs; fastci.run.scale).

    Only dimensions with a floor, each between its floor and its full value and
    typed like it: the CPU scale is a reduction the test already allows, so it
    never touches what the test validates (its frozen dimensions).
    """
    if type(cpu_workload) != "dict":
        return [_problem("cpu_workload", "expected a dict of dimension -> value, got %s" % type(cpu_workload))]
    for dim in sorted(cpu_workload.keys()):
        value = cpu_workload[dim]
        if dim not in floors:
            return [_problem("cpu_workload", "%r has no floor: only reducible dimensions have a CPU scale" % (dim,))]
        full = workload[dim]
        if type(value) != type(full):
            return [_problem("cpu_workload", "%s: expected %s like the workload value, got %r" % (dim, type(full), value))]
        if value < floors[dim] or value > full:
            return [_problem("cpu_workload", "%s: %r is outside [floor %r, full %r]" % (dim, value, floors[dim], full))]
    return []

def check_gpu_test_args(name, srcs, main, gpus, workload, floors, scope, constraints, args, env, tags, frozen = None, check = None, reference = None, cpu_workload = {}):
    """Checks every `gpu_test` argument; returns a list of problems (empty = valid)."""
    if type(name) != "string" or not name:
        return [_problem("name", "expected a non-empty string, got %r" % (name,))]
    problems = _check_string_list("srcs", srcs)
    if problems:
        return problems
    if not srcs:
        return [_problem("srcs", "at least one source file is needed")]
    if main != None:
        if type(main) != "string":
            return [_problem("main", "expected a string, got %s" % type(main))]
        if main not in srcs:
            return [_problem("main", "%r is not in srcs" % main)]
    elif len(srcs) > 1 and (name + ".py") not in srcs:
        return [_problem("main", "several srcs and none is %s.py: say which one is the test's main" % name)]
    if type(gpus) != "int":
        return [_problem("gpus", "expected an int >= 0, got %s %r" % (type(gpus), gpus))]
    if gpus < 0:
        return [_problem("gpus", "expected an int >= 0, got %d" % gpus)]
    problems = check_declaration(workload, floors, scope, constraints, frozen, check, reference)
    if problems:
        return problems
    problems = check_cpu_workload(workload, floors, cpu_workload)
    if problems:
        return problems
    problems = _check_string_list("args", args, allow_empty_items = True)
    if problems:
        return problems
    for a in args:
        for dim in workload:
            if a == "--" + dim or a.startswith("--%s=" % dim):
                return [_problem("args", "%r sets workload dimension %r: declare it in workload instead" % (a, dim))]
    if type(env) != "dict":
        return [_problem("env", "expected a dict of string -> string, got %s" % type(env))]
    for k, v in env.items():
        if type(k) != "string" or type(v) != "string":
            return [_problem("env", "expected string -> string, got %r: %r" % (k, v))]
        if k in RESERVED_ENV:
            return [_problem("env", "%s is set by gpu_test itself" % k)]
    problems = _check_string_list("tags", tags)
    if problems:
        return problems
    for t in tags:
        if t == "gpu" or t.startswith("gpus:"):
            return [_problem("tags", "tag %r is set by gpu_test itself" % t)]
    return []
