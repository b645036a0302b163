"""Adam (Kingma & Ba) with L2 weight decay, and AdamW (decoupled weight decay)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .optimizer import Optimizer, ParamGroup, Rule, Schedule, sqrt

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """Adam, PyTorch's update rule.

    ``weight_decay`` adds ``weight_decay * p`` to the gradient (L2, coupled: what Kipf & Welling's
    GCN uses, on the first layer only via a parameter group); ``decoupled=True`` (or
    :class:`AdamW`) shrinks the weights directly instead: ``p <- p - lr * weight_decay * p``.
    """

    elementwise_update = True  # each element's update reads only that element

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled: bool = False,
                 lr_schedule: Schedule | None = None):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "decoupled": decoupled}, lr_schedule)

    def _check_group(self, group: ParamGroup) -> None:
        super()._check_group(group)
        betas = group["betas"]
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"{type(self).__name__}: betas must be two numbers in [0, 1), got {betas!r}")
        group["betas"] = (float(betas[0]), float(betas[1]))
        eps = group["eps"]
        if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"{type(self).__name__}: eps must be a finite number > 0, got {eps!r}")

    def _init_state(self, x: Any, group: ParamGroup, state: dict, fast: bool) -> None:
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"] = self._zeros_like(x, fast)
            state["exp_avg_sq"] = self._zeros_like(x, fast)

    def _rule(self, lr: float, group: ParamGroup, state: dict) -> Rule:
        b1, b2 = group["betas"]
        wd = group["weight_decay"]
        t = int(state["step"]) + 1
        bc1 = 1.0 - b1 ** t
        bc2 = 1.0 - b2 ** t
        numbers = (wd, b1, 1.0 - b1, b2, 1.0 - b2, 1.0 / math.sqrt(bc2), group["eps"], 1.0 - lr * wd, lr / bc1)
        attrs = {"coupled": bool(wd and not group["decoupled"]), "decoupled": bool(wd and group["decoupled"])}
        return Rule(_adam, attrs, numbers, ("exp_avg", "exp_avg_sq"), ("exp_avg", "exp_avg_sq"))

    def _advance_state(self, state: dict) -> None:
        state["step"] = int(state["step"]) + 1


def _adam(x: Any, g: Any, m: Any, v: Any, wd: float, b1: float, c1: float, b2: float, c2: float,
          inv_sqrt_bc2: float, eps: float, decay: float, step_size: float, *, coupled: bool,
          decoupled: bool) -> tuple:
    """Adam's update (``c = 1 - b``; bias corrections folded into ``inv_sqrt_bc2`` and ``step_size``)."""
    if type(x) is np.ndarray and x.size >= NUMPY_BUFFERED_MIN and _same_arrays(x, g, m, v) and all(
            type(n) is float or type(n) is int for n in (wd, b1, c1, b2, c2, inv_sqrt_bc2, eps, decay, step_size)):
        return _adam_buffered(x, g, m, v, wd, b1, c1, b2, c2, inv_sqrt_bc2, eps, decay, step_size,
                              coupled, decoupled)
    if coupled:
        g = g + wd * x
    m = b1 * m + c1 * g
    v = b2 * v + c2 * (g * g)
    denom = sqrt(v) * inv_sqrt_bc2 + eps
    if decoupled:
        x = x * decay
    return x - step_size * (m / denom), m, v


#: numpy parameters from this many elements run :func:`_adam_buffered` (a 1433 x 16 GCN weight:
#: ~50 -> ~41 us); below it the two buffers save less than the checks cost
NUMPY_BUFFERED_MIN = 4096


def _same_arrays(x: np.ndarray, *others: Any) -> bool:
    return all(type(a) is np.ndarray and a.dtype == x.dtype and a.shape == x.shape for a in others)


def _adam_buffered(x: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, wd: float, b1: float, c1: float,
                   b2: float, c2: float, inv_sqrt_bc2: float, eps: float, decay: float, step_size: float,
                   coupled: bool, decoupled: bool) -> tuple:
    """:func:`_adam` on numpy arrays of one dtype and shape, with Python numbers: the same ufuncs on
    the same operands in the same order, so the same bits, but written into two scratch buffers
    instead of a fresh temporary each (nine fewer allocations).  The inputs are never written:
    the new ``x``, ``m`` and ``v`` are fresh arrays, as the optimizer and fit's undo expect."""
    if coupled:
        g_wd = np.multiply(wd, x)
        g = np.add(g, g_wd, out=g_wd)
    t = np.empty_like(x)
    m_new = np.multiply(b1, m)
    np.add(m_new, np.multiply(c1, g, out=t), out=m_new)         # b1 * m + c1 * g
    np.multiply(g, g, out=t)
    np.multiply(c2, t, out=t)
    v_new = np.multiply(b2, v)
    np.add(v_new, t, out=v_new)                                  # b2 * v + c2 * (g * g)
    np.sqrt(v_new, out=t)
    np.multiply(t, inv_sqrt_bc2, out=t)
    np.add(t, eps, out=t)                                        # denom
    if decoupled:
        x = np.multiply(x, decay)
    np.divide(m_new, t, out=t)
    np.multiply(step_size, t, out=t)
    return np.subtract(x, t, out=t), m_new, v_new


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default ``weight_decay=0.01``."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, lr_schedule: Schedule | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled=True, lr_schedule=lr_schedule)
