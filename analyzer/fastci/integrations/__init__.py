"""Adapters to the tools FastCI drives, below every stage.

``git`` and ``bazel`` are thin adapters to those command lines and their files, and
``procs`` starts child processes that end with FastCI (the lowest layer: every stage
may use them; they import no stage). The pytest plugin is a front end, beside the
CLI (:mod:`fastci.pytest`); the Bazel *rules* themselves are in ``rules/``.
"""

from __future__ import annotations

