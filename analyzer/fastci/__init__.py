"""FastCI: select, prune, prioritize and shrink GPU-heavy tests from runtime evidence.

The package is laid out in pipeline order: ``units`` (what code is),
``evidence`` (what tests executed), ``changes`` (what a diff touched),
``select`` → ``plan`` (what must run), and the consumers ``bazel``,
``pytest_plugin`` and ``run``.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
