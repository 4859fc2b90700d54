"""WORKSPACE set-up for FastCI's rules (Bazel 4.2.3, WORKSPACE mode, offline).

    load("@fastci//rules:repositories.bzl", "fastci_repositories")
    fastci_repositories()

Bazel 7/8 with bzlmod: use MODULE.bazel and rules/extensions.bzl instead.
"""

load("//rules/private:offline_deps.bzl", "offline_deps")
load("//rules/private:plan.bzl", "fastci_plan")
load("//rules/private:python_interpreter.bzl", "fastci_python")

def fastci_repositories(offline = True):
    """Defines @fastci_python (venv toolchain) and @fastci_plan, and registers the toolchain.

    Needs a committed `.fastci/BUILD.bazel` in the main workspace.

    Args:
      offline: also define stand-ins for repositories Bazel 4.2.3 would download.
    """
    if offline:
        offline_deps()
    fastci_python(name = "fastci_python")
    fastci_plan(name = "fastci_plan")
    native.register_toolchains("@fastci_python//:toolchain")
