import argparse

from lib import model

parser = argparse.ArgumentParser()
parser.add_argument("--tp", type=int)
flags = parser.parse_args()
assert model.evaluate(model.Config(tp=flags.tp)) == 1
