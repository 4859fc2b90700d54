"""Dense linear algebra on lists, and a softmax attention over them."""

from __future__ import annotations

import math


def matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    cols = list(zip(*b))
    return [[dot(row, col) for col in cols] for row in a]


def dot(x: "list[float] | tuple[float, ...]", y: "list[float] | tuple[float, ...]") -> float:
    return sum(p * q for p, q in zip(x, y))


def softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    s = sum(e)
    return [v / s for v in e]


def attention(q: list[list[float]], k: list[list[float]], v: list[list[float]]) -> list[list[float]]:
    scale = 1.0 / math.sqrt(len(q[0]))
    scores = [[dot(qi, kj) * scale for kj in k] for qi in q]
    weights = [softmax(row) for row in scores]
    return matmul(weights, v)


def grid(n: int, m: int, seed: int) -> list[list[float]]:
    state = seed
    out = []
    for _ in range(n):
        row = []
        for _ in range(m):
            state = (state * 1103515245 + 12345) % (1 << 31)
            row.append(state / (1 << 31) - 0.5)
        out.append(row)
    return out
