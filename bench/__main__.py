"""Run the benchmark modules: ``python -m bench [name ...] [-- option ...]`` (default: all).

The registry is a plain list: to add a benchmark, append its module name to ``MODULES``. Each
module defines ``main(argv: list[str]) -> int``; options after ``--`` go to every chosen module
(``python -m bench selection -- --mutants 3 --seed 7``). The exit code is the worst module's:
the selection benchmark exits 1 when a test failing under run-all was not in the plan,
the evidence benchmark when the recording overhead is over its target, record_py312
when recording on Python 3.12 is over its target or was not measured, the replay
benchmark on a miss or a re-selection, the precision replay on a miss, the store-scale
benchmark when a size or time target is missed, the reduction benchmark on an escape, the
CLI start-up benchmark when ``fastci --help`` is over 0.3 s.
"""

from __future__ import annotations

import importlib
import sys

MODULES = [
    "bench.microllm_suite",
    "bench.evidence",
    "bench.record_py312",
    "bench.selection",
    "bench.store_scale",
    "bench.replay",
    "bench.replay_precision",
    "bench.reduction",
    "bench.priority",
    "bench.eval_report",
    "bench.cli_startup",
]


def main(argv: list[str]) -> int:
    names, options = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    chosen = [m for m in MODULES if not names or m.rsplit(".", 1)[-1] in names or m in names]
    worst = 0
    failed = []
    for name in chosen:
        print(f"== {name}", flush=True)
        code = importlib.import_module(name).main(list(options))
        if code:
            failed.append(f"{name} (exit {code})")
        worst = max(worst, code)
    if failed:
        print(f"bench FAILED: {', '.join(failed)}", file=sys.stderr)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
