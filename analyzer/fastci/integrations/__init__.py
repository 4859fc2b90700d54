"""The tools FastCI plugs into, beside the pipeline.

``git`` and ``bazel`` are thin adapters to those command lines and their files
(the lowest layer: every stage may use them); ``pytest`` is the pytest plugin that
records evidence and obeys a plan (the highest: it uses the recorder and the plan
model). The Bazel *rules* themselves are in ``rules/``.
"""

from __future__ import annotations

