"""The half of the library that alpha_test uses."""


def step(x):
    return x + 1
