"""The package the precision replay builds (``bench.replay_precision``): ``tinytrain``.

A small, public-style training library in plain Python (no torch, so a recorded run of
its whole suite takes seconds): a package ``__init__`` that re-exports helpers, a config
module of constants and literal tables, a model, an optimizer with an LR schedule, data
batching, checkpoints found by a glob, plugins loaded by a computed import, a training
loop that shows progress with ``tqdm`` (a pinned utility dependency), and a pytest suite
of 40 tests, two of them expected failures (one strict).
"""

from __future__ import annotations

PYPROJECT = '''[project]
name = "tinytrain"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["tqdm>=4"]
'''

INIT = '''"""tinytrain: a tiny training library."""
from tinytrain.utils import clip_grad, seed_all

__all__ = ["clip_grad", "seed_all"]
'''

UTILS = '''"""Numeric helpers."""
import math
import random


def clip_grad(values, max_norm):
    norm = math.sqrt(sum(v * v for v in values))
    if norm <= max_norm or norm == 0:
        return list(values)
    scale = max_norm / norm
    return [v * scale for v in values]


def seed_all(seed):
    random.seed(seed)
    return seed


def moving_average(xs, k):
    out = []
    for i in range(len(xs)):
        window = xs[max(0, i - k + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def flatten(nested):
    return [x for part in nested for x in part]
'''

CONFIG = '''"""Defaults: constants and literal tables."""
MAX_STEPS = 1000
LOG_EVERY = 10
DEFAULTS = {"lr": 0.1, "steps": 20, "batch": 4, "warmup": 2}
ACTIVATIONS = ("relu", "tanh")


def make_config(**overrides):
    cfg = dict(DEFAULTS)
    cfg.update(overrides)
    if cfg["steps"] > MAX_STEPS:
        raise ValueError("too many steps")
    return cfg


def describe(cfg):
    return ", ".join(f"{k}={v}" for k, v in sorted(cfg.items()))
'''

MODEL = '''"""A linear model and a two-layer MLP on lists of floats."""


def relu(x):
    return x if x > 0 else 0.0


class Linear:
    def __init__(self, n, w=0.5, b=0.0):
        self.w = [w] * n
        self.b = b

    def forward(self, xs):
        return sum(w * x for w, x in zip(self.w, xs)) + self.b

    def params(self):
        return self.w + [self.b]


class MLP:
    def __init__(self, n, hidden=2):
        self.layers = [Linear(n, w=0.1 * (i + 1)) for i in range(hidden)]
        self.head = Linear(hidden, w=1.0)

    def forward(self, xs):
        return self.head.forward([relu(layer.forward(xs)) for layer in self.layers])
'''

OPTIM = '''"""SGD and its learning-rate schedule."""


def lr_at(step, base_lr, warmup):
    if step < warmup:
        return base_lr * (step + 1) / warmup
    return base_lr


def sgd_step(params, grads, lr):
    return [p - lr * g for p, g in zip(params, grads)]


def momentum_step(params, grads, velocity, lr, beta=0.9):
    velocity = [beta * v + g for v, g in zip(velocity, grads)]
    return [p - lr * v for p, v in zip(params, velocity)], velocity
'''

DATA = '''"""Batching and shuffling."""
import random


def batches(xs, size):
    return [xs[i:i + size] for i in range(0, len(xs), size)]


def shuffle(xs, seed):
    rng = random.Random(seed)
    out = list(xs)
    rng.shuffle(out)
    return out


def resume_offset(step, batch):
    return step * batch
'''

CHECKPOINT = '''"""Checkpoints: one JSON file per step, the latest found by a glob."""
import json
import os
from pathlib import Path


def save(state, folder, step):
    path = Path(folder) / f"ckpt_{step:05d}.json"
    path.write_text(json.dumps(state))
    return path


def latest(folder):
    found = sorted(Path(folder).glob("ckpt_*.json"))
    return json.loads(found[-1].read_text()) if found else None


def count(folder):
    return len([f for f in os.listdir(folder) if f.endswith(".json")])
'''

METRICS = '''"""Metrics."""
import math


def accuracy(pred, gold):
    return sum(1 for p, g in zip(pred, gold) if p == g) / len(gold)


def perplexity(losses):
    return math.exp(sum(losses) / len(losses))


def mse(pred, gold):
    return sum((p - g) ** 2 for p, g in zip(pred, gold)) / len(gold)
'''

PLUGINS = '''"""Optimizer plugins, loaded by name."""
import importlib


def load(name):
    return importlib.import_module(f"tinytrain.plugins.{name}")
'''

PLUGIN_SCALE = '''"""A plugin that scales gradients."""


def transform(grads):
    return [2 * g for g in grads]
'''

TRAIN = '''"""The training loop."""
from tinytrain import checkpoint
from tinytrain.config import LOG_EVERY, make_config
from tinytrain.data import batches
from tinytrain.model import Linear
from tinytrain.optim import lr_at, sgd_step


def train(xs, ys, folder=None, **overrides):
    import tqdm

    cfg = make_config(**overrides)
    model = Linear(len(xs[0]), w=0.0)
    losses = []
    pairs = list(zip(xs, ys))
    for step in tqdm.tqdm(range(cfg["steps"]), disable=True):
        for batch in batches(pairs, cfg["batch"]):
            grads = [0.0] * (len(xs[0]) + 1)
            loss = 0.0
            for x, y in batch:
                err = model.forward(x) - y
                loss += err * err / len(batch)
                for i, xi in enumerate(x):
                    grads[i] += 2 * err * xi / len(batch)
                grads[-1] += 2 * err / len(batch)
            params = sgd_step(model.params(), grads, lr_at(step, cfg["lr"], cfg["warmup"]))
            model.w, model.b = params[:-1], params[-1]
        losses.append(loss)
        if folder is not None and (step + 1) % LOG_EVERY == 0:
            checkpoint.save({"step": step + 1, "w": model.w, "b": model.b}, folder, step + 1)
    return model, losses
'''

TESTS = {
    "tests/test_utils.py": '''from tinytrain.utils import (clip_grad, flatten, moving_average,
                             seed_all)


def test_clip_keeps_small():
    assert clip_grad([0.3, 0.4], 1.0) == [0.3, 0.4]


def test_clip_scales_large():
    out = clip_grad([3.0, 4.0], 1.0)
    assert abs(out[0] - 0.6) < 1e-9 and abs(out[1] - 0.8) < 1e-9


def test_clip_zero():
    assert clip_grad([0.0, 0.0], 1.0) == [0.0, 0.0]


def test_seed_all():
    assert seed_all(3) == 3


def test_moving_average():
    assert moving_average([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]


def test_flatten():
    assert flatten([[1], [2, 3]]) == [1, 2, 3]
''',
    "tests/test_api.py": '''import tinytrain


def test_public_names():
    assert set(tinytrain.__all__) >= {"clip_grad", "seed_all"}


def test_clip_from_package():
    assert tinytrain.clip_grad([1.0], 2.0) == [1.0]
''',
    "tests/test_config.py": '''import pytest

from tinytrain.config import DEFAULTS, describe, make_config


def test_defaults():
    assert make_config()["lr"] == DEFAULTS["lr"]


def test_override():
    assert make_config(lr=0.5)["lr"] == 0.5


def test_too_many_steps():
    with pytest.raises(ValueError):
        make_config(steps=10 ** 6)


def test_describe():
    assert describe({"b": 1, "a": 2}) == "a=2, b=1"
''',
    "tests/test_model.py": '''from tinytrain.model import MLP, Linear, relu


def test_relu():
    assert relu(-1.0) == 0.0 and relu(2.0) == 2.0


def test_linear_forward():
    assert Linear(2, w=1.0, b=0.5).forward([1.0, 2.0]) == 3.5


def test_linear_params():
    assert Linear(2, w=1.0).params() == [1.0, 1.0, 0.0]


def test_mlp_forward():
    assert abs(MLP(2).forward([1.0, 1.0]) - 0.6) < 1e-9


def test_mlp_layers():
    assert len(MLP(3, hidden=4).layers) == 4
''',
    "tests/test_optim.py": '''from tinytrain.optim import lr_at, momentum_step, sgd_step


def test_warmup_first_step():
    assert lr_at(0, 1.0, 4) == 0.25


def test_warmup_last_step():
    assert lr_at(3, 1.0, 4) == 1.0


def test_after_warmup():
    assert lr_at(10, 0.1, 4) == 0.1


def test_sgd_step():
    assert sgd_step([1.0], [0.5], 0.1) == [0.95]


def test_momentum_step():
    params, velocity = momentum_step([1.0], [1.0], [0.0], 0.1)
    assert params == [0.9] and velocity == [1.0]
''',
    "tests/test_data.py": '''from tinytrain.data import batches, resume_offset, shuffle


def test_batches():
    assert batches([1, 2, 3], 2) == [[1, 2], [3]]


def test_shuffle_is_a_permutation():
    assert sorted(shuffle(list(range(10)), 0)) == list(range(10))


def test_shuffle_is_seeded():
    assert shuffle(list(range(10)), 1) == shuffle(list(range(10)), 1)


def test_resume_offset():
    assert resume_offset(3, 4) == 12
''',
    "tests/test_checkpoint.py": '''from tinytrain import checkpoint


def test_latest_of_none(tmp_path):
    assert checkpoint.latest(tmp_path) is None


def test_latest_is_the_last_step(tmp_path):
    for step in (1, 2, 10):
        checkpoint.save({"step": step}, tmp_path, step)
    assert checkpoint.latest(tmp_path) == {"step": 10}


def test_count(tmp_path):
    checkpoint.save({}, tmp_path, 1)
    (tmp_path / "notes.txt").write_text("x")
    assert checkpoint.count(tmp_path) == 1
''',
    "tests/test_metrics.py": '''import math

from tinytrain.metrics import accuracy, mse, perplexity


def test_accuracy():
    assert accuracy([1, 0, 1], [1, 1, 1]) == 2 / 3


def test_perplexity():
    assert perplexity([0.0, 0.0]) == 1.0


def test_perplexity_log():
    assert abs(perplexity([math.log(4.0)]) - 4.0) < 1e-9


def test_mse():
    assert mse([1.0, 2.0], [1.0, 4.0]) == 2.0
''',
    "tests/test_plugins.py": '''from tinytrain.plugins import load


def test_load_scale():
    assert load("scale").transform([1.0]) == [2.0]
''',
    "tests/test_train.py": '''from tinytrain.train import train

XS = [[1.0], [2.0], [3.0], [4.0]]
YS = [2.0, 4.0, 6.0, 8.0]


def test_loss_decreases():
    _, losses = train(XS, YS, steps=20, lr=0.02)
    assert losses[-1] < losses[0]


def test_learns_the_slope():
    model, _ = train(XS, YS, steps=200, lr=0.02)
    assert abs(model.w[0] - 2.0) < 0.1


def test_checkpoints_written(tmp_path):
    train(XS, YS, folder=tmp_path, steps=20, lr=0.02)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_00010.json", "ckpt_00020.json"]


def test_resume_from_checkpoint(tmp_path):
    from tinytrain import checkpoint

    train(XS, YS, folder=tmp_path, steps=10, lr=0.02)
    assert checkpoint.latest(tmp_path)["step"] == 10
''',
    "tests/test_known_issues.py": '''import pytest

from tinytrain.metrics import accuracy


@pytest.mark.xfail(strict=True, reason="empty inputs are not supported yet")
def test_accuracy_of_nothing():
    assert accuracy([], []) == 0.0


@pytest.mark.xfail(reason="float rounding")
def test_rounding():
    assert 0.1 + 0.2 == 0.3
''',
}

#: Every file of the package at the first commit (repository-relative).
FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": "# tinytrain\n\nA tiny training library.\n",
    ".gitignore": ".fastci/\n",
    "tinytrain/__init__.py": INIT,
    "tinytrain/utils.py": UTILS,
    "tinytrain/config.py": CONFIG,
    "tinytrain/model.py": MODEL,
    "tinytrain/optim.py": OPTIM,
    "tinytrain/data.py": DATA,
    "tinytrain/checkpoint.py": CHECKPOINT,
    "tinytrain/metrics.py": METRICS,
    "tinytrain/plugins/__init__.py": PLUGINS,
    "tinytrain/plugins/scale.py": PLUGIN_SCALE,
    "tinytrain/train.py": TRAIN,
    **TESTS,
}
