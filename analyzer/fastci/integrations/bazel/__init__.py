"""Adapters to the real ``bazel``: run it (``runner``), read gpu_test
declarations (``query``), read results (``bep``) and test outputs (``testlogs``).

Everything that touches a Bazel process or its files lives here, so the rest
of FastCI works on plain values (``TestDecl``, ``TestOutcome``).
"""
