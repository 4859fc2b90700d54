"""Public API of FastCI's Bazel rules. Load this file, never rules/private/.

    load("@fastci//rules:defs.bzl", "gpu_test")   # or "//rules:defs.bzl" inside FastCI

`gpu_test` wraps `py_test`; see its docstring for exactly what it changes.
`fastci_meta` is the queryable declaration `gpu_test` adds next to each test.
"""

load("//rules/private:gpu_test.bzl", _gpu_test = "gpu_test")
load("//rules/private:meta.bzl", _fastci_meta = "fastci_meta")

gpu_test = _gpu_test
fastci_meta = _fastci_meta
