"""Stochastic gradient descent with momentum, Nesterov momentum and (L2) weight decay."""
from __future__ import annotations

import math
from typing import Any

from .optimizer import Optimizer, ParamGroup, Rule, Schedule

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

    def _rule(self, lr: float, group: ParamGroup, state: dict) -> Rule:
        wd, momentum = group["weight_decay"], group["momentum"]
        decay = bool(wd)
        if not momentum:
            return Rule(_sgd, {"decay": decay}, (wd, lr), (), ())
        attrs = {"decay": decay, "nesterov": bool(group["nesterov"])}
        if state.get("momentum_buffer") is None:  # the first step: the buffer is the gradient
            return Rule(_sgd_momentum_first, attrs, (wd, momentum, lr), (), ("momentum_buffer",))
        return Rule(_sgd_momentum, attrs, (wd, momentum, 1.0 - group["dampening"], lr), ("momentum_buffer",),
                    ("momentum_buffer",))

    def _rule_inputs(self, state: dict) -> bool:
        """What :meth:`_rule` reads of the state: whether the momentum buffer is missing."""
        return state.get("momentum_buffer") is None


def _sgd(x: Any, g: Any, wd: float, lr: float, *, decay: bool) -> tuple:
    if decay:
        g = g + wd * x
    return (x - lr * g,)


def _sgd_momentum_first(x: Any, g: Any, wd: float, momentum: float, lr: float, *, decay: bool,
                        nesterov: bool) -> tuple:
    if decay:
        g = g + wd * x
    buf = g
    return x - lr * (g + momentum * buf if nesterov else buf), buf


def _sgd_momentum(x: Any, g: Any, buf: Any, wd: float, momentum: float, damp: float, lr: float, *, decay: bool,
                  nesterov: bool) -> tuple:
    """``damp = 1 - dampening``."""
    if decay:
        g = g + wd * x
    buf = momentum * buf + damp * g
    return x - lr * (g + momentum * buf if nesterov else buf), buf
