"""FastCI: select, prune, prioritize and shrink GPU-heavy tests from runtime evidence.

The package is laid out in pipeline order, one folder per stage: ``units`` (what
code is), ``evidence`` (what tests executed), ``changes`` (what a diff touched),
``select`` (which tests it reaches), ``plan`` (what must run, and how), ``run``
(running it), ``eval`` (measuring plans); ``integrations`` holds the adapters to
git and Bazel (below every stage). The front ends sit above them all: ``cli`` the
``fastci`` command, ``pytest`` the pytest plugin. ``errors``, ``types`` and
``config`` are shared leaves; ``pytest_plugin`` is the documented plugin path
(docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import logging
from typing import Callable, Mapping

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())


def lazy_exports(module: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports a stage's public names on first use.

    Stage packages list their public API in ``__init__`` without importing every
    submodule at once: a test process that needs ``fastci.units.lines`` must not
    pay for what ``fastci.units.index`` needs (checksums, the unit cache).
    """

    def __getattr__(name: str) -> object:
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(target), name)

    return __getattr__


#: The public names code under test may use, at a path that does not follow the
#: package's layout: ``with fastci.annotate(phase="eval"): ...`` labels the contexts
#: recorded inside (docs/EVIDENCE.md). Imported on first use only.
__getattr__ = lazy_exports(__name__, {"annotate": "fastci.evidence.record.contexts"})
