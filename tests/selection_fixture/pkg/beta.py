"""The half of the library that beta_test uses."""


def twice(x):
    return 2 * x
