"""`fastci_meta`: the queryable declaration of one gpu_test.

Native `py_test` cannot carry custom attributes, so `gpu_test` adds a sibling
`{name}__fastci_meta` (tagged manual, never built) holding what the analyzer
needs. Read every declaration with
`bazel query 'kind(fastci_meta, //...)' --output=xml` (`fastci.integrations.bazel.query`).
Workload and floor values are JSON-encoded strings so their types survive.
`frozen`, `check` and `reference` are always the resolved values (defaults
applied); `defaulted` names those the gpu_test did not declare.
"""

def _fastci_meta_impl(ctx):
    return []

fastci_meta = rule(
    implementation = _fastci_meta_impl,
    doc = "Metadata of a gpu_test for `bazel query`; has no outputs.",
    attrs = {
        "test": attr.label(doc = "The py_test this declaration belongs to."),
        "gpus": attr.int(doc = "GPUs the test needs (0 = CPU only)."),
        "workload": attr.string_dict(doc = "Dimension -> JSON-encoded full value."),
        "floors": attr.string_dict(doc = "Dimension -> JSON-encoded minimum the plan may reduce to."),
        "scope": attr.string_list(doc = "What the test validates (free-text topics); `frozen` says which dimensions that freezes."),
        "frozen": attr.string_list(doc = "Dimensions a plan never reduces (sorted; every dimension without a floor)."),
        "check": attr.string(doc = "Strength of the test's check: exact, tolerance, threshold, completes or performance (never reduced)."),
        "reference": attr.string(doc = "relational (compares runs made inside the test) or absolute (numbers recorded at one workload)."),
        "defaulted": attr.string_list(doc = "Which of frozen, check and reference the gpu_test left undeclared (their defaults apply)."),
        "constraints": attr.string_list(doc = "Relations between dimensions, e.g. 'num_layers % pp == 0'."),
        "srcs": attr.label_list(allow_files = True, doc = "The test's own sources (not the launcher)."),
        "main": attr.string(doc = "The test's own main file (package-relative)."),
    },
)
