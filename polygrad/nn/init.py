"""Parameter initialisers.

Each draws from polygrad's seeded generator (``pg.manual_seed``), so a seeded model is
reproducible, and returns a fresh leaf tensor with ``requires_grad=True``.  Weights are stored
``[fan_in, fan_out]`` (``y = x @ W``): no transpose in the forward or backward pass.

* ``glorot`` (Xavier uniform): U(-a, a), ``a = sqrt(6 / (fan_in + fan_out))`` -- Kipf & Welling's GCN.
* ``micrograd``: U(-1, 1) weights and zero biases, exactly what micrograd's ``Neuron`` does.
* ``kaiming``: U(-a, a), ``a = sqrt(6 / fan_in)`` (He uniform, suited to ReLU stacks).
* ``zeros``: all zero (biases).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

import polygrad as pg
from polygrad.tensor import Tensor

__all__ = ["INITS", "glorot_uniform", "kaiming_uniform", "micrograd_uniform", "uniform", "zeros", "make"]


def _param(array: np.ndarray, dtype: Any, backend: Any) -> Tensor:
    dtype = dtype if dtype is not None else pg.default_float
    return pg.tensor(array, dtype=dtype, requires_grad=True, backend=backend)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:
        return shape[0], shape[0]
    return shape[-2], shape[-1]


def uniform(shape: tuple[int, ...], low: float, high: float, dtype: Any = None, backend: Any = None) -> Tensor:
    """U(low, high) samples from polygrad's generator."""
    return _param(pg.rng().uniform(low, high, size=shape), dtype, backend)


def glorot_uniform(shape: tuple[int, ...], dtype: Any = None, backend: Any = None) -> Tensor:
    """Xavier/Glorot uniform: ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(shape)
    a = math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return uniform(shape, -a, a, dtype, backend)


def kaiming_uniform(shape: tuple[int, ...], dtype: Any = None, backend: Any = None) -> Tensor:
    """He uniform: ``U(-a, a)`` with ``a = sqrt(6 / fan_in)``."""
    fan_in, _ = _fans(shape)
    a = math.sqrt(6.0 / fan_in) if fan_in else 0.0
    return uniform(shape, -a, a, dtype, backend)


def micrograd_uniform(shape: tuple[int, ...], dtype: Any = None, backend: Any = None) -> Tensor:
    """micrograd's ``Neuron`` weights: ``U(-1, 1)``."""
    return uniform(shape, -1.0, 1.0, dtype, backend)


def zeros(shape: tuple[int, ...], dtype: Any = None, backend: Any = None) -> Tensor:
    return _param(np.zeros(shape), dtype, backend)


#: weight initialisers by name (``Linear(..., init=NAME)``)
INITS: dict[str, Callable[..., Tensor]] = {
    "glorot": glorot_uniform,
    "xavier": glorot_uniform,
    "kaiming": kaiming_uniform,
    "he": kaiming_uniform,
    "micrograd": micrograd_uniform,
}


def make(init: "str | Callable[..., Any]", shape: tuple[int, ...], dtype: Any = None, backend: Any = None) -> Tensor:
    """A weight tensor of ``shape`` from an initialiser name or a callable ``fn(shape) -> array``."""
    if callable(init):
        array = init(shape)
        array = array.numpy() if isinstance(array, Tensor) else np.asarray(array)
        if tuple(array.shape) != tuple(shape):
            raise pg.errors.ShapeError(f"initialiser {init!r} returned shape {tuple(array.shape)}, "
                                       f"expected {tuple(shape)}")
        return _param(array, dtype, backend)
    fn = INITS.get(str(init).lower())
    if fn is None:
        raise ValueError(f"unknown init {init!r}; choose one of {sorted(INITS)} or pass a callable")
    return fn(shape, dtype, backend)
