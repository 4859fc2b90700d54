# This directory is a Bazel workspace, not a pytest package: its *_test.py
# files are py_test mains run by tests/test_bazel_rules.py through bazel.
collect_ignore_glob = ["*"]
