"""micrograd's API on polygrad: run micrograd code by changing its import lines only.

    from polygrad.micrograd.engine import Value      # was: from micrograd.engine import Value
    from polygrad.micrograd.nn import MLP            # was: from micrograd.nn import MLP

``engine.Value`` is polygrad's scalar engine (:class:`polygrad.Value`); ``nn`` holds
``Module``/``Neuron``/``Layer``/``MLP`` over those Values with micrograd's semantics: the same
constructor arguments, the same draws from Python's ``random`` module in the same order (so
``random.seed(1337)`` gives the same weights), the same forward expressions, and micrograd's
``repr``s.  Forward values are bit-for-bit micrograd's; gradients can differ in the last bit
where a node feeds several consumers (micrograd sums them in ``set`` order, polygrad in a fixed
order), see :mod:`polygrad.engine.value`.

Why a package of its own and not ``polygrad.nn``: ``polygrad.nn`` works on tensors, where a
layer is one matmul; micrograd's ``nn`` works on lists of scalar ``Value``s, and code written
for it (``model([Value(1.0), Value(2.0)])``, ``p.data -= lr * p.grad``) needs exactly that.
"""
from __future__ import annotations

from . import engine, nn

__all__ = ["engine", "nn"]
