"""Repository rule `fastci_plan`: `.fastci/plan.json` -> `@fastci_plan//:plan.bzl`.

The generated file exports `PLAN`, a dict from `plan_model.parse_plan`:
`{"ok", "mode", "status", "tests": {label: overrides}, "skipped": {label: why}}`.
`gpu_test` loads it; it applies only under `--config=fastci` (a `select()`), so
a plain `bazel test //...` never depends on the plan's content.

What Bazel 4.2.3 re-reads (measured, docs/BAZEL.md):
- `plan.json` is read through a Label, so an edit (or deletion) of an existing
  file re-runs this rule on the next command.
- A plan that *appears* after a run without one is not seen until this rule
  re-runs: `fastci` tools pass `--repo_env=FASTCI_PLAN_DIGEST=<sha256>`, which
  re-runs it whenever the digest changes (`fastci.integrations.bazel.runner`, `rules/bazelw`).
- A malformed file never breaks the build: it is checked with python3 before
  `json.decode` (which would fail hard) and falls back to "run everything";
  so does a file over the size cap (not even read), JSON nested too deeply,
  and an object that names a key twice (`fastci.plan.model` refuses the same).

Stale plans: a plan made by `fastci plan` names the tree it was made for
(`tree`, a git tree id); the tools pass the tree on disk as
`--repo_env=FASTCI_TREE_DIGEST=<tree id | unknown>` (`rules/bazelw`,
`fastci.integrations.bazel.runner`). A different or unknown tree falls back to "every
gpu_test at full workload", printed loudly. The fallback status names only the
plan's tree, not the current one, so that editing files under a stale plan does
not also change every test's FASTCI_PLAN_STATUS (a cache key under
--config=fastci). An obeyed plan's counts, reason and tree are never in a
test's environment: they are printed once, here. A plan without `tree` (written by hand) is obeyed as written,
with a warning. Python twin: `fastci.plan.model.for_tree`.
"""

load(":plan_model.bzl", "MAX_PLAN_BYTES", "MAX_PROBLEM_CHARS", "conditional_prunes", "fallback", "parse_plan")

# Run with python3 before `json.decode` (which fails the build on bad JSON). The
# same text-level checks and messages as `fastci.plan.model.load_plan`/`Plan.from_json`
# (tests/test_plan_corpus.py runs this script on the corpus's `texts`): a file
# over MAX_PLAN_BYTES is refused before it is read, and so are JSON nested too
# deeply to decode, an object naming a key twice, a non-standard constant.
# Prints the one-line problem (exit 3 = too big, not read; 1 = another problem),
# or exit 0 and the plan re-encoded ASCII-only: `json.decode` then makes every
# non-ASCII character from a `\\u` escape, so `len` counts UTF-16 code units in
# Starlark as `fastci.plan.model` does (a raw UTF-8 file would count bytes).
_JSON_CHECK = """
import json, os, stat, sys
MAX_BYTES = %d
MAX_PROBLEM = %d
class Dup(ValueError):
    pass
def reject(name):
    raise ValueError("non-standard JSON constant " + name)
def pairs(items):
    out = dict(items)
    if len(out) != len(items):
        seen = set()
        for key, _ in items:
            if key in seen:
                raise Dup(key)
            seen.add(key)
    return out
def too_big(size):
    return 3, "plan.json: %%d bytes, more than a plan may hold (%%d bytes)" %% (size, MAX_BYTES)
def problem(path):
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                return 1, "plan.json: cannot read: not a regular file"
            if info.st_size > MAX_BYTES:
                return too_big(info.st_size)
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            return too_big(len(data))
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return 1, "plan.json: cannot read: %%s" %% exc
    try:
        data = json.loads(text, parse_constant=reject, object_pairs_hook=pairs)
    except Dup as exc:
        return 1, ("plan.json: duplicate key %%r in one JSON object "
                   "(JSON would keep only the last value)" %% exc.args[0])
    except RecursionError:
        return 1, "plan.json: not valid JSON: nested too deeply"
    except ValueError as exc:
        return 1, "plan.json: not valid JSON: %%s" %% exc
    return 0, json.dumps(data, ensure_ascii=True)
code, text = problem(sys.argv[1])
if code and len(text) > MAX_PROBLEM:
    text = text[:MAX_PROBLEM] + "... (%%d more characters)" %% (len(text) - MAX_PROBLEM)
sys.stdout.buffer.write(text.encode("utf-8", "backslashreplace"))
sys.exit(code)
""" % (MAX_PLAN_BYTES, MAX_PROBLEM_CHARS)

def _json_problem(rctx, path):
    """Returns (problem or None, whether the file may be read, the ASCII-only JSON text or None)."""
    python = rctx.which("python3")
    if python == None:
        return None, True, None  # the size check and json.decode below are the last line of defence
    res = rctx.execute([python, "-c", _JSON_CHECK, str(path)], timeout = 60)
    if res.return_code != 0:
        return (res.stdout.strip() or res.stderr.strip() or "plan.json: cannot read"), res.return_code != 3, None
    return None, True, res.stdout

# The same words as fastci.plan.model.UNTIED_PROBLEM.
UNTIED_PROBLEM = ("the plan names no `tree`, so it is tied to no tree (a hand-written plan " +
                  "must name the tree it is for: python -m fastci.integrations.git.tree)")

def check_tree(plan, decoded, tree):
    """Applies the plan's `tree` to the tree on disk: returns (plan to obey, warning or None).

    A plan for another tree, an unknown tree or no tree at all is not obeyed: every
    gpu_test at full workload (fastci.plan.model.tree_problem is the twin)."""
    if not plan["ok"] or plan["mode"] == "all":
        return plan, None
    claimed = decoded.get("tree")
    if claimed == None:
        return fallback("the plan names no `tree`"), UNTIED_PROBLEM + ": every gpu_test runs at full workload"
    if tree and tree != "unknown" and tree == claimed:
        return plan, None
    problem = "plan made for tree %s, this tree is %s" % (claimed, tree or "unknown")
    return fallback("plan made for tree %s, not for this tree" % claimed), problem + ": every gpu_test runs at full workload"

def _plan_path(rctx):
    """(the plan file to read, whether it is the default one read through the Label).

    `--repo_env=FASTCI_PLAN_FILE=<path>` (passed by `fastci run`, which hands Bazel the
    plan it decided to run, and by rules/bazelw from `$FASTCI_PLAN`) names the plan
    file; a relative path is relative to the workspace root. Without it, the default
    `.fastci/plan.json` next to the committed BUILD file. A file named by the variable
    is read by path, which Bazel does not watch: the tools pass its digest as
    FASTCI_PLAN_DIGEST, which re-runs this rule whenever it changes.
    """
    package = rctx.path(rctx.attr.package_build_file).dirname
    default = package.get_child("plan.json")
    chosen = rctx.os.environ.get("FASTCI_PLAN_FILE", "")
    if not chosen:
        return default, True
    if not chosen.startswith("/"):
        chosen = str(package.dirname) + "/" + chosen
    path = rctx.path(chosen)
    return path, str(path) == str(default)

def _fastci_plan_impl(rctx):
    # The package must exist (a committed .fastci/BUILD.bazel); the plan need not.
    plan_path, by_label = _plan_path(rctx)
    decoded = None
    problem = None
    if not plan_path.exists:
        problem = "no plan file (%s)" % plan_path
    else:
        problem, readable, checked = _json_problem(rctx, plan_path)
        if readable:
            # Through the Label: Bazel records the file and re-runs us when it changes.
            content = rctx.read(rctx.attr.plan if by_label else plan_path)
            if problem == None and len(content) > MAX_PLAN_BYTES:
                problem = "plan.json: %d bytes, more than a plan may hold (%d bytes)" % (len(content), MAX_PLAN_BYTES)
            if problem == None:
                decoded = json.decode(checked if checked != None else content)
        else:
            # Too big to read: resolving the Label still makes Bazel watch the file.
            if by_label:
                rctx.path(rctx.attr.plan)
    plan = parse_plan(decoded, problem)
    plan, warning = check_tree(plan, decoded, rctx.os.environ.get("FASTCI_TREE_DIGEST"))
    # Pruned tests are skipped only under `fastci run`, which runs them after a failure.
    plan = conditional_prunes(plan, decoded, rctx.os.environ.get("FASTCI_PRUNES") == "rerun")
    # The plan-wide status (counts, the plan's reason, a fallback's problem) is
    # printed here, once per change of the plan; each test's environment holds
    # only what concerns that test (plan_model.decide_test), so a new plan does
    # not change the cache key of a test it runs alike.
    if warning:
        print("FastCI plan: WARNING: " + warning)
    print("FastCI plan: " + plan["status"])
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD.bazel", 'exports_files(["plan.bzl"])\n')
    rctx.file("plan.bzl", "\n".join([
        "# Generated by @fastci//rules/private:plan.bzl from %s" % plan_path,
        "# plan digest knob: FASTCI_PLAN_DIGEST=%r" % rctx.os.environ.get("FASTCI_PLAN_DIGEST", ""),
        "PLAN = %r" % plan,
        "",
    ]))

fastci_plan = repository_rule(
    implementation = _fastci_plan_impl,
    doc = "Reads the workspace's .fastci/plan.json and generates plan.bzl for gpu_test.",
    attrs = {
        "package_build_file": attr.label(
            default = "@//.fastci:BUILD.bazel",
            doc = "The committed BUILD file of the plan's package; plan.json sits next to it.",
        ),
        "plan": attr.label(
            default = "@//.fastci:plan.json",
            doc = "The plan file, read through this Label so that Bazel watches it.",
        ),
    },
    environ = ["FASTCI_PLAN_DIGEST", "FASTCI_PRUNES", "FASTCI_TREE_DIGEST", "FASTCI_PLAN_FILE"],
)
