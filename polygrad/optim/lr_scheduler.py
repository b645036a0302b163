"""Learning-rate schedulers with PyTorch's names and semantics: ``StepLR``, ``CosineAnnealingLR``,
``ReduceLROnPlateau``, ``LambdaLR``.

    opt = optim.SGD(model.parameters(), lr=0.1)
    sched = optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    for epoch in range(100):
        train_one_epoch(); opt.step()
        sched.step()                      # ReduceLROnPlateau: sched.step(val_loss)

As in PyTorch, a scheduler *writes* each parameter group's ``"lr"`` (constructing one records
the groups' current rates as ``base_lrs`` and counts as epoch 0), ``get_last_lr()`` returns the
rates it last set, and the formulas are PyTorch's recursive ("chainable") ones, so two
schedulers on one optimizer compose as they do there and the rates agree with PyTorch's to the
last bit.

Differences, on purpose: the base rates live on the scheduler (``base_lrs``), not as an
``"initial_lr"`` key in each group, so an optimizer's ``state_dict`` does not change by
attaching a scheduler; resuming is ``sched.load_state_dict(saved)`` rather than
``last_epoch=N`` at construction.  polygrad's own ``lr_schedule=`` argument of the optimizers
is a multiplier applied on top of ``group["lr"]``; it composes with these schedulers.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence, cast

from ..compile import host_call
from ..errors import ArgumentError
from .optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "CosineAnnealingLR", "ReduceLROnPlateau", "MinLrsMismatchError"]


def _check_optimizer(name: str, optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{name}: expected a polygrad.optim.Optimizer, got {type(optimizer).__name__}")


class LRScheduler:
    """Base class: ``step()`` advances ``last_epoch`` and writes :meth:`get_lr` into the groups."""

    def __init__(self, optimizer: Optimizer) -> None:
        _check_optimizer(type(self).__name__, optimizer)
        self.optimizer = optimizer
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.last_epoch = -1
        self._step_count = 0
        self.step()  # epoch 0: as PyTorch, constructing the scheduler sets the first rates

    def get_lr(self) -> list[float]:
        """The rates for epoch ``last_epoch`` (from the groups' current rates: chainable)."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step()`` set, one per parameter group."""
        return list(self._last_lr)

    def step(self) -> None:
        host_call(self.step, idempotent=False)  # inside a pg.compile'd step: every replay steps it too
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (and, for LambdaLR, the functions), for ``pg.save``."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k not in ("optimizer", "lr_lambdas")})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, last_lr={self.get_last_lr()})"


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; ``lr_lambda`` is one function or one per group."""

    def __init__(self, optimizer: Optimizer, lr_lambda: "Callable[[int], float] | Sequence[Callable[[int], float]]"):
        _check_optimizer("LambdaLR", optimizer)
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"LambdaLR: expected {n} lr_lambdas (one per parameter group), got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        if not all(callable(f) for f in self.lr_lambdas):
            raise TypeError("LambdaLR: lr_lambda must be a callable of the epoch (or a list of them)")
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """Multiply the rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
            raise ValueError(f"StepLR: step_size must be a positive int, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]


class CosineAnnealingLR(LRScheduler):
    """Cosine from ``base_lr`` down to ``eta_min`` over ``T_max`` epochs (SGDR without restarts:
    past ``T_max`` it rises again, as PyTorch's)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):  # noqa: N803 - PyTorch's name
        if isinstance(T_max, bool) or not isinstance(T_max, int) or T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max must be a positive int, got {T_max!r}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if t == 0:
            return [g["lr"] for g in groups]
        if (t - 1 - T) % (2 * T) == 0:
            return [g["lr"] + (base - lo) * (1 - math.cos(math.pi / T)) / 2 for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (g["lr"] - lo) + lo
                for g in groups]


class MinLrsMismatchError(ArgumentError, RuntimeError):
    """``ReduceLROnPlateau``'s per-group ``min_lr`` list no longer has one value per parameter
    group (a RuntimeError, as PyTorch's; an :class:`~polygrad.errors.ArgumentError` too)."""


class ReduceLROnPlateau:
    """Multiply the rate by ``factor`` when a metric has stopped improving for ``patience`` epochs.

    ``sched.step(metric)`` once per epoch; ``mode="min"`` (a loss) or ``"max"`` (an accuracy);
    improvement is relative (``threshold_mode="rel"``: better than ``best * (1 -+ threshold)``)
    or absolute; after a reduction, ``cooldown`` epochs are not counted; no rate goes below
    ``min_lr`` (a number or one per group), and changes smaller than ``eps`` are skipped.
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: "float | Sequence[float]" = 0.0, eps: float = 1e-8):
        _check_optimizer("ReduceLROnPlateau", optimizer)
        if not factor < 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1.0, got {factor!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        n = len(optimizer.param_groups)
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise ValueError(f"ReduceLROnPlateau: expected {n} min_lrs (one per parameter group), "
                                 f"got {len(min_lr)}")
            self.min_lrs = [float(m) for m in min_lr]
            self.default_min_lr: float | None = None
        else:
            self.default_min_lr = float(cast(float, min_lr))  # not a list or tuple: one number
            self.min_lrs = [self.default_min_lr] * n
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.eps = cooldown, eps
        self.last_epoch = 0
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics: Any) -> None:
        # the metric is read on the host: inside a pg.compile'd step it would be frozen, so refuse
        host_call(self.step, idempotent=False, replayable=False)
        current = float(metrics)  # a 1-element tensor or a number
        self.last_epoch += 1
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._match_groups()
            for i, group in enumerate(self.optimizer.param_groups):
                old = float(group["lr"])
                new = max(old * self.factor, self.min_lrs[i])
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _match_groups(self) -> None:
        """One ``min_lr`` per parameter group, as PyTorch: groups added since construction
        (``add_param_group``) get the one number given, and a per-group list that no longer fits
        is an error naming both counts (PyTorch's RuntimeError)."""
        groups = len(self.optimizer.param_groups)
        if groups == len(self.min_lrs):
            return
        if self.default_min_lr is None:
            raise MinLrsMismatchError(
                f"ReduceLROnPlateau: the optimizer has {groups} parameter groups but min_lr gave "
                f"{len(self.min_lrs)} (one per group when the scheduler was made), usually because "
                "add_param_group added one since; set scheduler.min_lrs to one value per group")
        self.min_lrs = [self.default_min_lr] * groups

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k != "optimizer"})

    def __repr__(self) -> str:
        return f"ReduceLROnPlateau(mode={self.mode!r}, factor={self.factor}, patience={self.patience}, " \
               f"best={self.best}, last_lr={self.get_last_lr()})"
