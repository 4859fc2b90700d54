import pytest

from pysuite.linalg import attention, grid, matmul, softmax


@pytest.mark.parametrize("n", [20, 30, 40, 50])
def test_matmul_identity(n):
    a = grid(n, n, n)
    eye = [[float(i == j) for j in range(n)] for i in range(n)]
    assert matmul(a, eye) == a


@pytest.mark.parametrize("n", [16, 32, 48])
def test_attention_rows_are_convex(n):
    q, k, v = grid(n, 16, 1), grid(n, 16, 2), grid(n, 16, 3)
    out = attention(q, k, v)
    lo = min(min(r) for r in v)
    assert all(x >= lo - 1e-9 for r in out for x in r)


def test_softmax_sums_to_one():
    assert abs(sum(softmax([1.0, 2.0, 3.0])) - 1.0) < 1e-12
