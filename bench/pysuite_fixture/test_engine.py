import pytest

from pysuite.engine import MLP, Value, train


def test_gradients_of_a_product():
    a, b = Value(2.0), Value(-3.0)
    c = a * b + a
    c.backward()
    assert (a.grad, b.grad) == (-2.0, 2.0)


@pytest.mark.parametrize("steps", [10, 20, 30, 40])
def test_training_lowers_the_loss(steps):
    losses = train(steps)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("seed", range(6))
def test_mlp_is_deterministic(seed):
    a, b = MLP([3, 8, 8, 1], seed), MLP([3, 8, 8, 1], seed)
    assert a([0.1, 0.2, 0.3]).data == b([0.1, 0.2, 0.3]).data
