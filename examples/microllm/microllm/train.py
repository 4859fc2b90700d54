"""Command line: ``python -m microllm.train --train_iters=20 --num_layers=4 --tp=2 ...``.

Every field of every config dataclass is a flag named after it (snake_case). Booleans accept
``--recompute`` or ``--recompute=false``. Prints one summary line; ``--metrics_path`` writes JSON.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, Sequence

from microllm import MicroLLMError
from microllm.config import FLAT_INDEX, FLAT_TYPES, Config
from microllm.trainer import train


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m microllm.train", description=__doc__.split("\n")[0])
    for name in FLAT_INDEX:
        default = FLAT_TYPES[name]
        kind: Callable[[str], Any] = type(default)
        if isinstance(default, bool):
            parser.add_argument(f"--{name}", type=_bool, nargs="?", const=True, default=None,
                                help=f"{FLAT_INDEX[name]}.{name} (default {default})")
        else:
            parser.add_argument(f"--{name}", type=kind, default=None,
                                help=f"{FLAT_INDEX[name]}.{name} (default {default})")
    parser.add_argument("--log_level", default="WARNING")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    flat = {k: v for k, v in vars(args).items() if k in FLAT_INDEX and v is not None}
    return Config.from_flat(**flat)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        result = train(config_from_args(args))
    except MicroLLMError as exc:
        print(f"microllm: error: {exc}", file=sys.stderr)
        return 2
    last = result.losses[-1] if result.losses else float("nan")
    print(f"iterations {result.start_iteration}->{result.iteration} loss {last:.4f} "
          f"tokens/s {result.tokens_per_s:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
