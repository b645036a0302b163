"""Adam (Kingma & Ba) with L2 weight decay, and AdamW (decoupled weight decay)."""
from __future__ import annotations

import math
from typing import Any

from .optimizer import Optimizer, ParamGroup, Schedule

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

    def _update(self, x: Any, g: Any, lr: float, group: ParamGroup, state: dict, fast: bool) -> Any:
        b1, b2 = group["betas"]
        wd = group["weight_decay"]
        if wd and not group["decoupled"]:
            g = g + wd * x
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"] = self._zeros_like(x, fast)
            state["exp_avg_sq"] = self._zeros_like(x, fast)
        t = state["step"] = int(state["step"]) + 1
        m = state["exp_avg"] = b1 * state["exp_avg"] + (1.0 - b1) * g
        v = state["exp_avg_sq"] = b2 * state["exp_avg_sq"] + (1.0 - b2) * (g * g)
        bc1 = 1.0 - b1 ** t
        bc2 = 1.0 - b2 ** t
        denom = self._sqrt(v, fast) * (1.0 / math.sqrt(bc2)) + group["eps"]
        if wd and group["decoupled"]:
            x = x * (1.0 - lr * wd)
        return x - (lr / bc1) * (m / denom)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter); default ``weight_decay=0.01``."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, lr_schedule: Schedule | None = None):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled=True, lr_schedule=lr_schedule)
