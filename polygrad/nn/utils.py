"""Gradient utilities: ``clip_grad_norm_`` (dense and sparse gradients); ``move_tensor`` for ``Module.to``."""
from __future__ import annotations

import math
from typing import Iterable

from typing import Any

import polygrad as pg
from polygrad.ir.errors import NonFiniteError
from polygrad.tensor import Tensor, is_sparse

__all__ = ["clip_grad_norm_", "grad_norm", "move_tensor"]


def move_tensor(t: Tensor, be: Any) -> Tensor:
    """``t`` on backend ``be`` (a Backend object), for :meth:`Module.to`.

    A leaf (parameter, buffer) moves *in place* and is returned: its storage (and its gradient)
    is re-created on ``be`` while the tensor object stays the same, so whoever holds it -- an
    optimizer, a shared weight -- sees the move.  A sparse leaf moves its stored values; its
    pattern is host memory, converted per backend on first use.  A non-leaf cannot move in place
    (its graph lives on the old backend); it comes back as a detached copy.
    """
    if t._be is be:
        return t
    if not t.is_leaf:
        return t.detach().to(be)
    if is_sparse(t):
        _move_storage(t.values, be)
        t._be = be
        t._grad_view = None
    else:
        _move_storage(t, be)
    return t


def _move_storage(t: Tensor, be: Any) -> None:
    if t._be is be:
        return
    grad = t.grad
    t._data = be.from_numpy(t.numpy())
    t._be = be
    if grad is not None:
        t.grad = grad.to(be)


def _dense_part(g: Tensor) -> Tensor:
    """The numbers a gradient actually holds: a sparse gradient's stored values, a dense one itself."""
    return g.values if is_sparse(g) else g


def grad_norm(parameters: "Iterable[Tensor] | Tensor") -> float:
    """L2 norm of all gradients together (parameters without a gradient are skipped)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    total = 0.0
    with pg.no_grad():
        for p in params:
            if p.grad is None:
                continue
            g = _dense_part(p.grad)
            total += float((g * g).sum().item())
    return math.sqrt(total)


def clip_grad_norm_(parameters: "Iterable[Tensor] | Tensor", max_norm: float = 1.0,
                    error_if_nonfinite: bool = False, eps: float = 1e-6) -> float:
    """Scale the gradients in place so their joint L2 norm is at most ``max_norm``; return the norm.

    The norm is taken before clipping, over dense gradients and the stored values of sparse ones
    (a sparse gradient keeps its pattern).  With ``error_if_nonfinite`` a NaN/Inf norm raises
    :class:`~polygrad.errors.NonFiniteError`; otherwise the gradients are left as they are.
    """
    if max_norm <= 0 or not math.isfinite(max_norm):
        raise ValueError(f"clip_grad_norm_: max_norm must be a positive finite number, got {max_norm}")
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    norm = grad_norm(params)
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise NonFiniteError(f"clip_grad_norm_: the total gradient norm is {norm}")
        return norm
    coef = max_norm / (norm + eps)
    if coef < 1.0:
        with pg.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad = p.grad * coef
    return norm
