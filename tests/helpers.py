"""Numerical differentiation for tests (float64 central differences, independent of any VJP)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

import polygrad as pg


def numerical_grads(f: Callable[..., "pg.Tensor"], arrays: Sequence[np.ndarray], backend: str,
                    weights: np.ndarray | None = None, eps: float = 1e-6) -> list[np.ndarray]:
    """d sum(w * f(*arrays)) / d arrays[i] by central differences, evaluating f on ``backend``."""
    def scalar_out(arrs):
        with pg.no_grad():
            out = f(*[pg.tensor(a, backend=backend) for a in arrs]).numpy().astype(np.float64)
        return float(np.sum(out * weights)) if weights is not None else float(np.sum(out))

    grads = []
    for i, a in enumerate(arrays):
        if a.dtype.kind != "f":
            grads.append(None)
            continue
        g = np.zeros_like(a, dtype=np.float64)
        for idx in np.ndindex(*a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (scalar_out(plus) - scalar_out(minus)) / (2 * eps)
        grads.append(g)
    return grads


def analytic_grads(f, arrays, backend: str, weights: np.ndarray | None = None):
    """(forward output, gradients) from polygrad's backward on ``backend``."""
    ts = [pg.tensor(a, backend=backend, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = f(*ts)
    w = pg.tensor(weights if weights is not None else np.ones(out.shape), dtype=out.dtype, backend=backend)
    if any(t.requires_grad for t in ts) and out.requires_grad:
        (out * w).sum().backward()
    return out.numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]
