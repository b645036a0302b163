"""Stochastic gradient descent with momentum, Nesterov momentum and (L2) weight decay."""
from __future__ import annotations

import math
from typing import Any

from .optimizer import Optimizer, ParamGroup, Schedule

__all__ = ["SGD"]


class SGD(Optimizer):
    """``p <- p - lr * d`` with ``d = g + weight_decay * p``, through momentum when ``momentum > 0``.

    Same update rule as PyTorch's SGD: ``buf = momentum * buf + (1 - dampening) * d`` (``buf = d``
    on the first step), then ``d = buf`` (or ``d + momentum * buf`` with ``nesterov``).
    ``weight_decay=2e-4`` is the gradient of micrograd's ``1e-4 * sum(p**2)`` regulariser.
    """

    elementwise_update = True  # each element's update reads only that element

    def __init__(self, params: Any, lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, lr_schedule: Schedule | None = None):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov}, lr_schedule)

    def _check_group(self, group: ParamGroup) -> None:
        super()._check_group(group)
        m = group["momentum"]
        if not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0:
            raise ValueError(f"SGD: momentum must be a finite number >= 0, got {m!r}")
        if group["nesterov"] and (m <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: nesterov momentum needs momentum > 0 and dampening = 0")

    def _update(self, x: Any, g: Any, lr: float, group: ParamGroup, state: dict, fast: bool) -> Any:
        wd, momentum = group["weight_decay"], group["momentum"]
        if wd:
            g = g + wd * x
        if momentum:
            buf = state.get("momentum_buffer")
            buf = g if buf is None else momentum * buf + (1.0 - group["dampening"]) * g
            state["momentum_buffer"] = buf
            g = g + momentum * buf if group["nesterov"] else buf
        return x - lr * g
