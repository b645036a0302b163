"""``from polygrad.micrograd.nn import MLP``: micrograd's ``nn`` module over polygrad Values.

Same classes, arguments, random draws and numbers as micrograd's ``nn``:

* ``Neuron(nin, nonlin=True)``: weights ``Value(random.uniform(-1, 1))`` drawn one by one from
  Python's global ``random`` (so ``random.seed`` reproduces micrograd's initialisation), bias
  ``Value(0)``; ``n(x) = relu(b + w0*x0 + w1*x1 + ...)`` summed left to right from the bias, as
  micrograd's ``sum(..., self.b)`` (one n-ary node, same additions in the same order);
  ``nonlin=False`` leaves out the ReLU.
* ``Layer(nin, nout, **kwargs)``: ``nout`` neurons; a layer of one neuron returns the Value
  itself, not a one-element list (micrograd's convention, which ``MLP(..., [.., 1])`` relies on).
* ``MLP(nin, nouts)``: ReLU layers, the last one linear.

For tensor models (one matmul per layer instead of one Value per weight) use
:class:`polygrad.nn.MLP`, which has the same signature.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

from polygrad.engine.value import Value

__all__ = ["Module", "Neuron", "Layer", "MLP"]


class Module:
    """micrograd's base class: ``parameters()`` and ``zero_grad()`` (which sets every grad to 0)."""

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = 0

    def parameters(self) -> list[Value]:
        return []


class Neuron(Module):
    """One unit: ``relu(b + sum_i w_i * x_i)`` (or without relu when ``nonlin=False``)."""

    def __init__(self, nin: int, nonlin: bool = True):
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin

    def __call__(self, x: Sequence[Any]) -> Value:
        # micrograd's sum((wi*xi ...), self.b) as one n-ary node: the same additions in the same
        # order (0 + b is b exactly), so the same bits, but one node instead of nin
        act = Value.sum_of([self.b, *(wi * xi for wi, xi in zip(self.w, x))])
        return act.relu() if self.nonlin else act

    def parameters(self) -> list[Value]:
        return self.w + [self.b]

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):
    """``nout`` neurons over the same inputs; one neuron's output is returned unwrapped."""

    def __init__(self, nin: int, nout: int, **kwargs: Any):
        self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

    def __call__(self, x: Sequence[Any]) -> "Value | list[Value]":
        out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def parameters(self) -> list[Value]:
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self) -> str:
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """``MLP(nin, [h1, h2, ..., nout])``: ReLU hidden layers, a linear last layer."""

    def __init__(self, nin: int, nouts: Sequence[int]):
        sz = [nin] + list(nouts)
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1) for i in range(len(nouts))]

    def __call__(self, x: Sequence[Any]) -> "Value | list[Value]":
        out: Any = x
        for layer in self.layers:
            out = layer(out)
        return out

    def parameters(self) -> list[Value]:
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
