"""The documented plugin path: ``pytest -p fastci.pytest_plugin`` (entry point ``pytest11: fastci``).

The plugin lives in :mod:`fastci.pytest.plugin`; this module makes the
documented name *be* that module, so pytest registers one plugin object whichever
name loaded it.
"""

from __future__ import annotations

import sys

from fastci.pytest import plugin as _plugin

sys.modules[__name__] = _plugin
