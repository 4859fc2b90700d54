"""Module extension `fastci` for Bazel 7/8 (bzlmod): @fastci_python and @fastci_plan.

NOT TESTED HERE (only Bazel 4.2.3 is installable offline). MODULE.bazel uses
it; a consumer module does the same:

    bazel_dep(name = "fastci", version = "0.1.0")
    fastci = use_extension("@fastci//rules:extensions.bzl", "fastci")
    use_repo(fastci, "fastci_plan", "fastci_python")
    register_toolchains("@fastci_python//:toolchain")

The root module still needs a committed `.fastci/BUILD.bazel`.
"""

load("//rules/private:plan.bzl", "fastci_plan")
load("//rules/private:python_interpreter.bzl", "fastci_python")

def _fastci_impl(module_ctx):
    # The venv is looked for next to the root module's MODULE.bazel
    # (there may be no WORKSPACE file under bzlmod).
    fastci_python(name = "fastci_python", workspace_file = "@@//:MODULE.bazel")
    fastci_plan(name = "fastci_plan")

fastci = module_extension(
    implementation = _fastci_impl,
    doc = "Defines the venv Python toolchain and the plan repository for gpu_test.",
)
