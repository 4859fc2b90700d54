"""Run the benchmark modules: ``python -m bench [name ...]`` (default: all of them).

The registry is a plain list: to add a benchmark, append its module name to ``MODULES``. Each
module defines ``main(argv: list[str]) -> int``.
"""

from __future__ import annotations

import importlib
import sys

MODULES = [
    "bench.microllm_suite",
    "bench.evidence",
    "bench.selection",
]


def main(argv: list[str]) -> int:
    chosen = [m for m in MODULES if not argv or m.rsplit(".", 1)[-1] in argv or m in argv]
    worst = 0
    for name in chosen:
        print(f"== {name}", flush=True)
        worst = max(worst, importlib.import_module(name).main([]))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
