"""Implementation of `gpu_test` (public doorway: //rules:defs.bzl)."""

load("@fastci_plan//:plan.bzl", "PLAN")
load(":exec_props.bzl", "gpu_exec_properties")
load(":meta.bzl", "fastci_meta")
load(":plan_model.bzl", "decide_test")
load(":validate.bzl", "check_gpu_test_args", "resolve_reduction")

_ENABLED = str(Label("//rules:fastci_enabled"))
_SKIPPED = str(Label("//rules:skipped_by_plan"))
_LAUNCHER = str(Label("//rules/private:gpu_test_main.py"))
_FASTCI_LIB = str(Label("//analyzer:fastci"))

def _own_label(name):
    repo = native.repository_name()
    return "%s//%s:%s" % ("" if repo == "@" else repo, native.package_name(), name)

def _verbatim(value):
    """Escapes `value` for an `env` attribute, which Bazel `$(...)`/Make-variable expands.

    Every `$` becomes `$$`, so the test sees exactly `value`: a workload
    string or a plan's text can never inject an expansion or break the build.
    """
    return value.replace("$", "$$")

def _mode_env(env, label, workload, declared, mode, gpus, main, extra, cpu_workload):
    out = dict(env)
    if cpu_workload:
        # Applied by the launcher only on a host without any GPU (fastci.run.scale).
        out["FASTCI_CPU_WORKLOAD"] = _verbatim(json.encode(cpu_workload))
    out.update({
        "FASTCI_WORKLOAD": _verbatim(json.encode(workload)),
        # The full workload as declared, so each run records declared and applied apart.
        "FASTCI_DECLARED_WORKLOAD": _verbatim(json.encode(declared)),
        "FASTCI_MODE": mode,
        "FASTCI_TEST_ID": _verbatim(label),
        "FASTCI_GPUS": str(gpus),
        # The one intended expansion: the runfiles path of the test's main.
        "FASTCI_TEST_MAIN": "$(rootpath %s)" % main,
    })
    out.update({k: _verbatim(v) for k, v in extra.items()})
    return out

def gpu_test(
        name,
        srcs,
        main = None,
        deps = [],
        data = [],
        gpus = 1,
        gpu_kind = None,
        pool = None,
        workload = {},
        floors = {},
        scope = [],
        constraints = [],
        frozen = None,
        check = None,
        reference = None,
        cpu_workload = {},
        args = [],
        env = {},
        tags = [],
        **kwargs):
    """A `py_test` with a declared GPU count and workload that a FastCI plan can skip or shrink.

    The wrapper changes these `py_test` arguments (it never mutates the caller's values):
    - `srcs` gains the launcher and `main` becomes it; the launcher runs `main`
      (default: `<name>.py` or the only src) in-process after picking GPUs.
    - `deps` gains `//analyzer:fastci`.
    - `args` is passed as given: the workload never goes through `args`
      (Bazel tokenizes and `$(...)`-expands them, so a value with a space or
      a `$` would not arrive intact). The launcher appends `--<dim>=<value>`
      per dimension to the test's argv from `FASTCI_WORKLOAD`, one argv
      element each, verbatim.
    - `env` gains `FASTCI_WORKLOAD` (JSON, `$` escaped as `$$`), `FASTCI_DECLARED_WORKLOAD`
      (the full workload, JSON), `FASTCI_MODE` (`full`|`fastci`),
      `FASTCI_TEST_ID`, `FASTCI_GPUS`, `FASTCI_TEST_MAIN` and, under
      `--config=fastci`, `FASTCI_PLAN_STATUS` (and `FASTCI_SHADOW_SKIP` in shadow mode).
      `env` is part of the test's cache key, so the status holds only what
      concerns this test (`plan_model.decide_test`): its overrides, why it runs
      at full workload, or the fallback's problem; never the plan's counts,
      reason or tree (printed once by `@fastci_plan`), so that a new plan that
      runs this test alike keeps its cached result.
    - `tags` gains `gpus:<n>` and, when n > 0, `gpu`.
    - `target_compatible_with` gains, under `--config=fastci` only, the
      constraint `//rules:skipped_by_plan` when the plan skips the test: Bazel
      reports it SKIPPED. (Not a tag: tags are part of the cache key, so a
      plan toggling them would re-run tests in plain `bazel test` too.)
    - `exec_properties` gains `gpus` (`"<n>"`, when n > 0), `gpu-kind` (from
      `gpu_kind`) and `Pool` (from `pool`), merged with the caller's own
      `exec_properties` (which may not contradict them): a remote executor
      schedules the test on a matching worker (docs/REMOTE.md). Ignored locally;
      part of the action's key with a remote cache.
    - `legacy_create_init` defaults to False (an implicit `__init__.py` at the
      runfiles root would shadow the `fastci` package).
    It also declares `{name}__fastci_meta` (`fastci_meta`, tagged manual), the
    queryable declaration; `scope`, `frozen`, `check` and `reference` go only
    there (they never change the py_test or its cache key).

    Args:
      name: test name.
      srcs: the test's Python sources.
      main: the test's own entry file (one of srcs); default `<name>.py` or the only src.
      deps: py_library dependencies.
      data: runtime data files.
      gpus: GPUs the test needs; 0 runs on CPU.
      gpu_kind: optional GPU model a remote worker must have (e.g. "h100-80gb");
        exec property `gpu-kind`; needs gpus > 0.
      pool: optional remote-execution pool (exec property `Pool`).
      workload: dimension -> full value (int, float, string or bool).
      floors: dimension -> lowest value a plan may reduce it to (numeric dims only).
      scope: what the test validates, free-text topics (e.g. "parallel_parity");
        `frozen` says which dimensions that freezes.
      constraints: relations between dimensions, e.g. "num_layers % pp == 0".
      frozen: the dimensions the test's scope freezes (never reduced). When given,
        every workload dimension is in exactly one of `floors` and `frozen`;
        default: every dimension without a floor.
      check: strength of the test's check: "exact", "tolerance", "threshold",
        "completes" or "performance" (throughput/latency: never reduced, no
        floors). Default "completes" (claims the weakest check).
      reference: "relational" (compares runs made inside the test: meaningful at
        any workload) or "absolute" (numbers recorded at one workload: goldens,
        thresholds; a plan reduces it only to workloads with a recorded
        reference). Default "absolute" (the safe side).
      cpu_workload: dimension -> value a host without any GPU runs instead of the
        full value (the CPU scale): only dimensions with floors, floor <= value <=
        full. The launcher applies it when the host has no GPU at all, never on a
        GPU host; the run records `"scale": "cpu"` and the lowered dimensions as
        overrides (`FASTCI_CPU_WORKLOAD`; analyzer/fastci/run/scale.py).
      args: extra command-line arguments (must not set workload dimensions).
      env: extra environment (must not set FASTCI_* variables owned by gpu_test).
      tags: extra tags.
      **kwargs: passed to py_test (size, timeout, flaky, shard_count...); a given
        `exec_properties` (a dict) is merged with the derived properties.
    """
    problems = check_gpu_test_args(name, srcs, main, gpus, workload, floors, scope, constraints, args, env, tags, frozen, check, reference, cpu_workload)
    if problems:
        p = problems[0]
        fail("gpu_test %s: attribute %s: %s" % (_own_label(name if type(name) == "string" else "?"), p.attr, p.msg))

    execution = gpu_exec_properties(gpus, gpu_kind, pool, kwargs.get("exec_properties"))
    if execution.problems:
        p = execution.problems[0]
        fail("gpu_test %s: attribute %s: %s" % (_own_label(name), p.attr, p.msg))

    label = _own_label(name)
    reduction = resolve_reduction(workload, floors, frozen, check, reference)
    if main == None:
        main = name + ".py" if (name + ".py") in srcs else srcs[0]
    decision = decide_test(PLAN, label, workload, floors, constraints)

    # Per-test facts only: this env is the test's cache key under --config=fastci.
    fastci_extra = {"FASTCI_PLAN_STATUS": decision.status}
    if decision.shadow_skip:
        fastci_extra["FASTCI_SHADOW_SKIP"] = decision.shadow_skip
    test_tags = list(tags) + ["gpus:%d" % gpus] + (["gpu"] if gpus > 0 else [])

    py_kwargs = dict(kwargs)
    py_kwargs.setdefault("legacy_create_init", False)
    py_kwargs.pop("exec_properties", None)
    if execution.props:
        py_kwargs["exec_properties"] = execution.props
    py_kwargs["target_compatible_with"] = py_kwargs.get("target_compatible_with", []) + select({
        _ENABLED: [_SKIPPED] if decision.skip else [],
        "//conditions:default": [],
    })
    native.py_test(
        name = name,
        srcs = list(srcs) + [_LAUNCHER],
        main = _LAUNCHER,
        deps = list(deps) + [_FASTCI_LIB],
        data = list(data),
        args = list(args),
        env = select({
            _ENABLED: _mode_env(env, label, decision.workload, workload, "fastci", gpus, main, fastci_extra, cpu_workload),
            "//conditions:default": _mode_env(env, label, workload, workload, "full", gpus, main, {}, cpu_workload),
        }),
        tags = test_tags,
        **py_kwargs
    )
    fastci_meta(
        name = name + "__fastci_meta",
        test = ":" + name,
        gpus = gpus,
        workload = {k: json.encode(v) for k, v in workload.items()},
        floors = {k: json.encode(v) for k, v in floors.items()},
        scope = list(scope),
        constraints = list(constraints),
        frozen = reduction.frozen,
        check = reduction.check,
        reference = reduction.reference,
        defaulted = reduction.defaulted,
        srcs = list(srcs),
        main = main,
        tags = ["manual"],
        testonly = True,
        visibility = kwargs.get("visibility"),
    )
