"""Adam (Kingma & Ba) with L2 weight decay, and AdamW (decoupled weight decay)."""
from __future__ import annotations

import math
from typing import Any

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

    def _rule_inputs(self, state: dict) -> int:
        """What :meth:`_rule` reads of the state: the step."""
        return int(state["step"])


def _adam(x: Any, g: Any, m: Any, v: Any, wd: float, b1: float, c1: float, b2: float, c2: float,
          inv_sqrt_bc2: float, eps: float, decay: float, step_size: float, *, coupled: bool,
          decoupled: bool) -> tuple:
    """Adam's update (``c = 1 - b``; bias corrections folded into ``inv_sqrt_bc2`` and ``step_size``)."""
    if coupled:
        g = g + wd * x
    m = b1 * m + c1 * g
    v = b2 * v + c2 * (g * g)
    denom = sqrt(v) * inv_sqrt_bc2 + eps
    if decoupled:
        x = x * decay
    return x - step_size * (m / denom), m, v


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default ``weight_decay=0.01``."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, lr_schedule: Schedule | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled=True, lr_schedule=lr_schedule)
