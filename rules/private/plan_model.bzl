"""Pure helpers over a decoded `.fastci/plan.json` (schema version 1).

`parse_plan` turns the decoded JSON (or None) into the plain dict that
`@fastci_plan//:plan.bzl` exports as `PLAN`; `decide_test` applies it to one
gpu_test. Neither touches the file system: `plan.bzl` (the repository rule)
reads the file, these are unit-tested by `//rules/tests:plan_model_test`.
The Python twins are `fastci.plan.model` (the schema) and `fastci.types` (test
ids); both twins run the shared corpus rules/tests/plan_cases.json
(`//rules/tests:plan_corpus_test`, tests/test_plan_corpus.py): same decisions,
same problem text.
"""

load(":constraints.bzl", "constraint_problems", "render")
load(":validate.bzl", "SCALAR_TYPES", "is_dim_name", "is_number")

PLAN_VERSION = 1
MODES = ["selective", "all", "shadow"]

_TOP_KEYS = ["version", "base", "head", "tree", "inputs", "mode", "reason", "tests", "skipped"]
_TEST_KEYS = ["id", "overrides", "priority", "why", "est_gpu_s"]
_SKIPPED_KEYS = ["id", "why", "stand_ins"]

# Caps on what a plan may hold: the same values and checks as `fastci.plan.model`.
# The file-size cap is applied by `plan.bzl` before the file is decoded.
MAX_PLAN_BYTES = 32 * 1024 * 1024
MAX_ENTRIES = 250000
MAX_STRING_CHARS = 4096
MAX_PROBLEM_CHARS = 1000

# Twin of the test-id parser in `fastci.types` (`label_problem`, `normalize_test_id`);
# both are held to rules/tests/plan_cases.json.
_SPACE = [" ", "\t", "\n", "\r"]
_REPO_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"

def is_label(s):
    """Returns True when the test id `s` is meant as a Bazel label (`//` or `@`), not a pytest node id."""
    return s.startswith(("//", "@"))

def label_problem(s):
    """Returns why `s` is not a well-formed absolute Bazel label, or None when it is.

    Accepted: `//pkg:name`, `//pkg` (name = last package segment), `//:name`,
    `@repo//...`, `@//...` (the main repository) and `@repo` (`@repo//:repo`).
    """
    for c in _SPACE:
        if c in s:
            return "it contains whitespace"
    if s.startswith("@"):
        repo, sep, rest = s[1:].partition("//")
        for i in range(len(repo)):
            if repo[i] not in _REPO_CHARS:
                return "a repository name holds only letters, digits, '_', '.' and '-'"
        if not sep:
            return None if repo else "nothing follows '@'"
        body = rest
    elif s.startswith("//"):
        body = s[2:]
    else:
        return "it starts with neither '//' nor '@'"
    if body.count(":") > 1:
        return "it has more than one ':'"
    package, colon, name = body.partition(":")
    if not package and not colon:
        return "it names neither a package nor a target"
    if colon and not name:
        return "the target name after ':' is empty"
    for part, what in ((package, "package"), (name, "target name")):
        if part.startswith("/") or part.endswith("/") or "//" in part:
            return "the %s has an empty path segment" % what
        for seg in part.split("/"):
            if seg in (".", ".."):
                return "the %s has a '.' or '..' segment" % what
    return None

def normalize_label(s):
    """The canonical form of a test id: `[@repo]//package:name` for a label.

    `@//p:t` and `//p:t` are one test, `//p` is `//p:p`; a pytest node id, and a
    malformed label (which `plan_problem` rejects), are returned unchanged.
    """
    if not is_label(s) or label_problem(s) != None:
        return s
    repo = ""
    body = s[2:]
    if s.startswith("@"):
        repo, sep, rest = s[1:].partition("//")
        body = rest if sep else ":" + repo
    package, colon, name = body.partition(":")
    if not colon:
        name = package.split("/")[-1]
    return "%s//%s:%s" % ("@" + repo if repo else "", package, name)

def _tname(value):
    """The type name `fastci.plan.model` prints (Python's), so both twins word problems alike."""
    t = type(value)
    return {"string": "str", "NoneType": "null"}.get(t, t)

def _repr(value):
    """`%r` as Python writes it: a string in single quotes unless it holds one (then double)."""
    r = "%r" % (value,)
    if type(value) != "string" or "'" in value:
        return r
    return "'" + r[1:-1].replace("\\\"", "\"") + "'"

def _too_long(where, s):
    """The problem when `s` is over MAX_STRING_CHARS, else None.

    Bazel's `len` counts UTF-16 code units of a string `json.decode` made from a
    `\\u` escape, which is how `plan.bzl` hands the plan over (re-encoded ASCII-only
    by its python3 check); `fastci.plan.model` counts the same way.
    """
    if len(s) <= MAX_STRING_CHARS:
        return None
    return "%s: %d characters, more than a plan string may hold (%d)" % (where, len(s), MAX_STRING_CHARS)

def _short(problem):
    """`problem` cut to MAX_PROBLEM_CHARS (it may quote a huge value)."""
    if len(problem) <= MAX_PROBLEM_CHARS:
        return problem
    return problem[:MAX_PROBLEM_CHARS] + "... (%d more characters)" % (len(problem) - MAX_PROBLEM_CHARS)

def fallback(problem):
    """The plan used when the file is missing or invalid: every test, full workload."""
    return {
        "ok": False,
        "mode": "all",
        "status": "fallback: %s; every gpu_test runs at full workload" % problem,
        "tests": {},
        "skipped": {},
    }

def _unknown_keys(where, obj, allowed):
    for k in obj:
        if k not in allowed:
            return "%s: unknown key %s (allowed: %s)" % (where, _repr(k), ", ".join(allowed))
    return None

def _check_entry(where, entry, allowed, skipped):
    # The same checks in the same order as `fastci.plan.model._parse_entry` (same first problem).
    if type(entry) != "dict":
        return "%s: expected an object, got %s" % (where, _tname(entry))
    problem = _unknown_keys(where, entry, allowed)
    if problem:
        return problem
    if type(entry.get("id")) != "string" or not entry["id"]:
        return "%s.id: expected a non-empty string (a label or pytest node id), got %s" % (where, _repr(entry.get("id")))
    problem = _too_long(where + ".id", entry["id"])
    if problem:
        return problem
    if is_label(entry["id"]):
        problem = label_problem(entry["id"])
        if problem:
            return "%s.id: %s is not a valid Bazel label: %s" % (where, _repr(entry["id"]), problem)
    if "why" in entry and type(entry["why"]) != "string":
        return "%s.why: expected a string, got %s" % (where, _tname(entry["why"]))
    problem = _too_long(where + ".why", entry.get("why", ""))
    if problem:
        return problem
    if skipped and not entry.get("why"):
        # A skip always says why: a test that does not run must be traceable to a reason.
        return "%s.why: a skipped test needs a reason (a non-empty string)" % where
    for num in ("priority", "est_gpu_s"):
        if num in entry and not is_number(entry[num]):
            return "%s.%s: expected a number, got %s" % (where, num, _tname(entry[num]))
    if "stand_ins" in entry:
        return _stand_ins_problem(where + ".stand_ins", entry["stand_ins"])
    return None

def _stand_ins_problem(where, stand_ins):
    # The same checks in the same order as `fastci.plan.model._check_stand_ins`. Bazel
    # skips a pruned test like any other skipped one; the ids are for `fastci run`.
    if type(stand_ins) != "list":
        return "%s: expected a list of test ids, got %s" % (where, _tname(stand_ins))
    for j, test in enumerate(stand_ins):
        at = "%s[%d]" % (where, j)
        if type(test) != "string" or not test:
            return "%s: expected a non-empty string (a label or pytest node id), got %s" % (at, _repr(test))
        problem = _too_long(at, test)
        if problem:
            return problem
        if is_label(test):
            problem = label_problem(test)
            if problem:
                return "%s: %s is not a valid Bazel label: %s" % (at, _repr(test), problem)
    return None

def _overrides_problem(where, overrides):
    if type(overrides) != "dict":
        return "%s: expected an object, got %s" % (where, _tname(overrides))
    for dim, value in overrides.items():
        problem = _too_long(where + ": a dimension name", dim)
        if problem:
            return problem
        if not is_dim_name(dim):
            return "%s: %s is not a dimension name" % (where, _repr(dim))
        if type(value) not in SCALAR_TYPES:
            return "%s.%s: expected int, float, str or bool, got %s" % (where, dim, _tname(value))
        problem = _too_long("%s.%s" % (where, dim), value) if type(value) == "string" else None
        if problem:
            return problem
    return None

def plan_problem(plan):
    """Returns a one-line description of what is wrong with a decoded plan, or None.

    Twin of `fastci.plan.model.Plan.from_dict`: the same decisions and the same
    text, held to rules/tests/plan_cases.json.
    """
    problem = _plan_problem(plan)
    return _short(problem) if problem else None

def _inputs_problem(inputs):
    """`inputs`: git-ignored path -> digest (twin: fastci.plan.model._parse_inputs).

    The rules only check its shape: `fastci run` and the pytest plugin re-hash the files
    (a plan whose inputs changed reaches Bazel as "run everything" through `fastci run`)."""
    if type(inputs) != "dict":
        return "plan.json: inputs: expected an object, got %s" % _tname(inputs)
    if len(inputs) > MAX_ENTRIES:
        return "plan.json: inputs: %d entries, more than a plan may hold (%d)" % (len(inputs), MAX_ENTRIES)
    for path, digest in inputs.items():
        if not path:
            return "plan.json: inputs: an empty path"
        if type(digest) != "string":
            return "plan.json: inputs: a digest must be a string, got %s" % _tname(digest)
        problem = _too_long("plan.json: inputs", path) or _too_long("plan.json: inputs", digest)
        if problem:
            return problem
    return None

def _plan_problem(plan):
    if type(plan) != "dict":
        return "plan.json: expected a JSON object at the top level, got %s" % _tname(plan)
    if "version" not in plan:
        return "plan.json: missing key 'version'"
    if plan["version"] != PLAN_VERSION or type(plan["version"]) != "int":
        return "plan.json: unknown version %s (this FastCI reads version %d)" % (_repr(plan["version"]), PLAN_VERSION)
    problem = _unknown_keys("plan.json", plan, _TOP_KEYS)
    if problem:
        return problem
    if plan.get("mode") not in MODES:
        return "plan.json: mode: expected one of %s, got %s" % (", ".join(MODES), _repr(plan.get("mode")))
    for key in ("reason", "base", "head", "tree"):
        if key in plan and type(plan[key]) != "string":
            return "plan.json: %s: expected a string, got %s" % (key, _tname(plan[key]))
        problem = _too_long("plan.json: " + key, plan[key]) if key in plan else None
        if problem:
            return problem
    problem = _inputs_problem(plan.get("inputs", {}))
    if problem:
        return problem
    seen = {}
    listed = 0
    for key, allowed in (("tests", _TEST_KEYS), ("skipped", _SKIPPED_KEYS)):
        entries = plan.get(key, [])
        if type(entries) != "list":
            return "plan.json: %s: expected a list, got %s" % (key, _tname(entries))
        listed += len(entries)
        if listed > MAX_ENTRIES:
            return ("plan.json: %s: %d entries in tests and skipped together, " +
                    "more than a plan may hold (%d)") % (key, listed, MAX_ENTRIES)
        for i, entry in enumerate(entries):
            where = "plan.json: %s[%d]" % (key, i)
            problem = _check_entry(where, entry, allowed, key == "skipped")
            if problem:
                return problem
            label = normalize_label(entry["id"])
            if label in seen:
                return "%s.id: %s is listed twice (also in %s)" % (where, label, seen[label])
            seen[label] = "%s[%d]" % (key, i)
            problem = _overrides_problem(where + ".overrides", entry.get("overrides", {}))
            if problem:
                return problem
    return None

def parse_plan(plan, read_problem = None):
    """Turns a decoded plan (or None plus why) into the generated `PLAN` dict."""
    if read_problem:
        return fallback(read_problem)
    problem = plan_problem(plan)
    if problem:
        return fallback(problem)
    tests = {normalize_label(t["id"]): dict(t.get("overrides", {})) for t in plan.get("tests", [])}
    skipped = {normalize_label(s["id"]): s.get("why", "") for s in plan.get("skipped", [])}
    mode = plan["mode"]
    status = "ok: %s plan, %d tests, %d skipped" % (mode, len(tests), len(skipped))
    if plan.get("reason"):
        status += " (%s)" % plan["reason"]
    if mode == "all":
        tests, skipped = {}, {}
        status = "ok: mode all, every gpu_test runs at full workload" + (" (%s)" % plan["reason"] if plan.get("reason") else "")
    return {"ok": True, "mode": mode, "status": status, "tests": tests, "skipped": skipped}

def conditional_prunes(plan, decoded, rerun):
    """Applies the rerun-after-any-failure rule to a parsed plan's pruned tests.

    A pruned test (a `skipped` entry with `stand_ins`) is safe to skip only when a
    failure (or a flaky pass) then runs it, which `fastci run` does: it passes
    `--repo_env=FASTCI_PRUNES=rerun` (`rerun` True). Otherwise (plain `bazel test
    --config=fastci`, `rules/bazelw`) each pruned test moves from `skipped` to
    `pruned` and runs at full workload (`decide_test`). Python twin:
    `PlanPlugin(prunes_rerun=...)` in `fastci.pytest.plan`.
    """
    if rerun or not plan["ok"] or plan["mode"] != "selective" or type(decoded) != "dict":
        return plan
    pruned = [normalize_label(s["id"]) for s in decoded.get("skipped", []) if s.get("stand_ins")]
    pruned = [label for label in pruned if label in plan["skipped"]]
    if not pruned:
        return plan
    skipped = {label: why for label, why in plan["skipped"].items() if label not in pruned}
    status = plan["status"] + "; %d pruned test(s) run at full workload (only fastci run reruns them after a failure)" % len(pruned)
    return dict(plan, skipped = skipped, pruned = {label: True for label in pruned}, status = status)

def override_problems(workload, floors, constraints, overrides):
    """Returns why `overrides` cannot apply to a test's workload (empty = they can).

    Twin of `fastci.plan.workload.override_problems` (same corpus: rules/tests/
    constraint_cases.json). Only a dimension with a floor is reducible (no
    floor = frozen); its value must have the full value's type (an int is
    accepted for a float) and lie in `floor <= value <= full`; then every
    constraint must hold on the reduced workload.
    """
    problems = []
    for dim in sorted(overrides.keys()):
        value = overrides[dim]
        if dim not in workload:
            problems.append("%s: not a declared dimension" % dim)
            continue
        full = workload[dim]
        if dim not in floors:
            problems.append("%s: frozen (no floor declared), stays %s" % (dim, render(full)))
            continue
        if type(full) == "float" and type(value) == "int":
            value = float(value)
        if type(value) != type(full):
            problems.append("%s: expected %s like the full value, got %s" % (dim, type(full), type(value)))
        elif value < floors[dim]:
            problems.append("%s: %s is below its floor %s" % (dim, render(value), render(floors[dim])))
        elif value > full:
            problems.append("%s: %s is above the full value %s" % (dim, render(value), render(full)))
    if problems or not overrides:
        return problems
    reduced = apply_overrides(workload, overrides)
    at = ", ".join(["%s=%s" % (d, render(reduced[d])) for d in sorted(overrides.keys())])
    return ["%s at %s" % (p, at) for p in constraint_problems(constraints, reduced)]

def apply_overrides(workload, overrides):
    """The workload with `overrides` applied (ints become floats for float dimensions)."""
    reduced = dict(workload)
    for dim, value in overrides.items():
        reduced[dim] = float(value) if type(workload[dim]) == "float" else value
    return reduced

def decide_test(plan, label, workload, floors, constraints):
    """Applies `plan` to one test: returns struct(skip, workload, status, shadow_skip).

    `status` goes into the test's environment (`FASTCI_PLAN_STATUS`), which is
    part of its cache key under `--config=fastci`: it says only what concerns
    this test (its overrides, why it runs at full workload, or the fallback's
    problem), never plan-wide facts (counts, the plan's reason, the untied
    note), so two plans that run a test alike give it the same key and Bazel
    reuses its cached result. `plan["status"]` (plan-wide) is printed once by
    the repository rule instead.
    """
    full = dict(workload)
    if not plan["ok"]:
        return struct(skip = False, workload = full, status = plan["status"], shadow_skip = "")
    if plan["mode"] == "all":
        return struct(skip = False, workload = full, status = "ok: mode all: runs at full workload", shadow_skip = "")
    if plan["mode"] == "shadow":
        why = plan["skipped"].get(label)
        return struct(skip = False, workload = full, status = "ok: shadow plan: runs at full workload", shadow_skip = why if why != None else "")
    head = "ok: selective plan: "
    if label in plan.get("pruned", {}):
        return struct(skip = False, workload = full, status = head + "pruned, runs at full workload: nothing here runs it after a failure", shadow_skip = "")
    if label in plan["skipped"]:
        return struct(skip = True, workload = full, status = head + "skipped: " + plan["skipped"][label], shadow_skip = "")
    if label not in plan["tests"]:
        return struct(skip = False, workload = full, status = head + "not in the plan: runs at full workload", shadow_skip = "")
    overrides = plan["tests"][label]
    problems = override_problems(workload, floors, constraints, overrides)
    if problems:
        return struct(skip = False, workload = full, status = head + "overrides ignored (%s): runs at full workload" % "; ".join(problems), shadow_skip = "")
    if not overrides:
        return struct(skip = False, workload = full, status = head + "planned: runs at full workload (no overrides)", shadow_skip = "")
    applied = ", ".join(["%s=%s" % (d, render(overrides[d])) for d in sorted(overrides.keys())])
    return struct(skip = False, workload = apply_overrides(full, overrides), status = head + "planned: overrides " + applied, shadow_skip = "")
