"""Numerical differentiation for tests (float64 central differences, independent of any VJP)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

import polygrad as pg
from polygrad.testing import numerical_grad


def numerical_grads(f: Callable[..., "pg.Tensor"], arrays: Sequence[np.ndarray], backend: str,
                    weights: np.ndarray | None = None, eps: float = 1e-6) -> list[np.ndarray | None]:
    """d sum(w * f(*arrays)) / d arrays[i] by central differences, evaluating f on ``backend``
    (polygrad.testing's numerical_grad: it never touches a VJP rule); None for non-float inputs."""
    if weights is None:
        with pg.no_grad():
            weights = np.ones(f(*[pg.tensor(a, backend=backend) for a in arrays]).shape)
    return numerical_grad(f, arrays, eps=eps, grad_output=weights, backend=backend)


def analytic_grads(f, arrays, backend: str, weights: np.ndarray | None = None):
    """(forward output, gradients) from polygrad's backward on ``backend``."""
    ts = [pg.tensor(a, backend=backend, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = f(*ts)
    w = pg.tensor(weights if weights is not None else np.ones(out.shape), dtype=out.dtype, backend=backend)
    if any(t.requires_grad for t in ts) and out.requires_grad:
        (out * w).sum().backward()
    return out.numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]
