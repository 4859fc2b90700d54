import argparse

from lib import model

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int)
parser.add_argument("--tp", type=int)
flags = parser.parse_args()
cfg = model.Config(tp=flags.tp)
assert model.train(cfg, flags.steps) == 6
with open("data/golden.txt") as f:
    assert f.read().startswith("golden")
assert model.run_child() == "child ran"
