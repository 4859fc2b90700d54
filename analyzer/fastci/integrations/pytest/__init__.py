"""The pytest side: ``plugin`` (entry point ``pytest11: fastci``) records evidence
per test with ``--fastci-record`` and obeys a plan with ``--fastci-plan``, whose
deselection, ordering and overrides live in ``plan``.
"""

from __future__ import annotations

