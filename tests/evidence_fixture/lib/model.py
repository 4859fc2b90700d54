"""A stand-in for framework code: a config, a train step, an eval step."""

import dataclasses
import subprocess
import sys


@dataclasses.dataclass(frozen=True)
class Config:
    tp: int = 1
    dtype: str = "bf16"


def step(x, cfg):
    return x * cfg.tp


def train(cfg, steps):
    total = 0
    for i in range(steps):
        total += step(i, cfg)
    return total


def evaluate(cfg):
    return step(1, cfg)


def in_child():
    return "child ran"


def run_child():
    out = subprocess.run([sys.executable, "-c", "from lib import model; print(model.in_child())"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()
