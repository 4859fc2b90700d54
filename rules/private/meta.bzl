"""`fastci_meta`: the queryable declaration of one gpu_test.

Native `py_test` cannot carry custom attributes, so `gpu_test` adds a sibling
`{name}__fastci_meta` (tagged manual, never built) holding what the analyzer
needs. Read every declaration with
`bazel query 'kind(fastci_meta, //...)' --output=xml` (`fastci.integrations.bazel.query`).
Workload and floor values are JSON-encoded strings so their types survive.
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
        "scope": attr.string_list(doc = "What the test validates; dimensions in scope are frozen."),
        "constraints": attr.string_list(doc = "Relations between dimensions, e.g. 'num_layers % pp == 0'."),
        "srcs": attr.label_list(allow_files = True, doc = "The test's own sources (not the launcher)."),
        "main": attr.string(doc = "The test's own main file (package-relative)."),
    },
)
