"""The ``fastci`` command line: ``main(argv) -> int`` over one module per subcommand.

``command`` holds the ``Command`` record and the registry; each subcommand module
(``record``, ``ingest``, ``evidence``, ``plan``, ``explain``, ``run``,
``validate-plan``, ``targets``) parses its options and calls the stage that does
the work. Commands never import each other: options two of them share are declared
in ``options``, and the work they share lives in the stages
(:mod:`fastci.evidence.fill`, :func:`fastci.plan.planner.analyze_change`).
"""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fastci`` CLI (the console script's entry point) and return its exit code."""
    from fastci.cli.app import main as run_cli

    return run_cli(argv)
