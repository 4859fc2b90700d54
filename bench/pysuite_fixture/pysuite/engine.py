"""Scalar reverse-mode autodiff and a tiny MLP: many small Python calls, like a framework's
own Python layer (every operation is a method call)."""

from __future__ import annotations

import math
import random


class Value:
    __slots__ = ("data", "grad", "_prev", "_back")

    def __init__(self, data: float, prev: tuple["Value", ...] = ()) -> None:
        self.data = data
        self.grad = 0.0
        self._prev = prev
        self._back = None

    def __add__(self, other: "Value | float") -> "Value":
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other))

        def back() -> None:
            self.grad += out.grad
            other.grad += out.grad
        out._back = back
        return out

    def __mul__(self, other: "Value | float") -> "Value":
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other))

        def back() -> None:
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._back = back
        return out

    def tanh(self) -> "Value":
        t = math.tanh(self.data)
        out = Value(t, (self,))

        def back() -> None:
            self.grad += (1 - t * t) * out.grad
        out._back = back
        return out

    def __neg__(self) -> "Value":
        return self * -1.0

    def __sub__(self, other: "Value | float") -> "Value":
        return self + (-other if isinstance(other, Value) else -other)

    def backward(self) -> None:
        order: list[Value] = []
        seen: set[int] = set()

        def visit(v: Value) -> None:
            if id(v) not in seen:
                seen.add(id(v))
                for p in v._prev:
                    visit(p)
                order.append(v)
        visit(self)
        self.grad = 1.0
        for v in reversed(order):
            if v._back is not None:
                v._back()


class Neuron:
    def __init__(self, n_in: int, rng: random.Random) -> None:
        self.w = [Value(rng.uniform(-1, 1)) for _ in range(n_in)]
        self.b = Value(0.0)

    def __call__(self, xs: list[Value]) -> Value:
        act = self.b
        for w, x in zip(self.w, xs):
            act = act + w * x
        return act.tanh()

    def parameters(self) -> list[Value]:
        return [*self.w, self.b]


class MLP:
    def __init__(self, sizes: list[int], seed: int = 0) -> None:
        rng = random.Random(seed)
        self.layers = [[Neuron(a, rng) for _ in range(b)] for a, b in zip(sizes, sizes[1:])]

    def __call__(self, xs: list[float]) -> Value:
        vals = [Value(x) for x in xs]
        for layer in self.layers:
            vals = [n(vals) for n in layer]
        return vals[0]

    def parameters(self) -> list[Value]:
        return [p for layer in self.layers for n in layer for p in n.parameters()]


def train(steps: int, lr: float = 0.05, seed: int = 0) -> list[float]:
    """Fit y = sign(x0 * x1) on four points; return the loss per step."""
    model = MLP([2, 6, 6, 1], seed)
    data = [([1.0, 1.0], 1.0), ([-1.0, 1.0], -1.0), ([1.0, -1.0], -1.0), ([-1.0, -1.0], 1.0)]
    losses = []
    for _ in range(steps):
        loss = Value(0.0)
        for xs, y in data:
            d = model(xs) - y
            loss = loss + d * d
        for p in model.parameters():
            p.grad = 0.0
        loss.backward()
        for p in model.parameters():
            p.data -= lr * p.grad
        losses.append(loss.data)
    return losses
