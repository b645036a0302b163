"""Gradient utilities: ``clip_grad_norm_`` and ``total_norm`` (PyTorch's, one fused norm over dense
and sparse gradients); ``move_tensor`` for ``Module.to``."""
from __future__ import annotations

import math
from typing import Any, Iterable

import polygrad as pg
from polygrad.engine.dispatch import note_host_read
from polygrad.ir.errors import NonFiniteError
from polygrad.tensor import Tensor, is_sparse

__all__ = ["clip_grad_norm_", "grad_norm", "total_norm", "move_tensor"]


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


def _gradients(parameters: "Iterable[Tensor] | Tensor") -> tuple[list[Tensor], list[Tensor]]:
    """(the parameters, the dense part of each gradient there is, in parameter order)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return params, [_dense_part(p.grad) for p in params if p.grad is not None]


def _namespace(grads: list[Tensor]) -> Any:
    """The array namespace every gradient's storage speaks (numpy, cupy), or None when one does
    not (the scalar backend, a lazy one) or they differ: then the norm is taken with tensor ops."""
    spaces = {type(g.array) for g in grads}
    if len(spaces) != 1 or not hasattr(grads[0].array, "__array_namespace__"):
        return None
    return grads[0].array.__array_namespace__()


def _flat_norm(flat: Any, p: float, xp: Any) -> Any:
    """The p-norm of a non-empty flat array, with the kernels the tensor path's ops run (so both
    give the same bits on numpy): ``|x|`` is ``maximum(x, -x)`` and a root is ``power(s, 1/p)``."""
    if p == 2.0:
        return xp.pow(xp.sum(flat * flat, axis=0), xp.asarray(0.5, dtype=flat.dtype))
    a = xp.maximum(flat, -flat)
    if p == math.inf:
        return xp.max(a, axis=0)
    if p == -math.inf:
        return xp.min(a, axis=0)
    if p == 1.0:
        return xp.sum(a, axis=0)
    return xp.pow(xp.sum(xp.pow(a, xp.asarray(p, dtype=flat.dtype)), axis=0), xp.asarray(1.0 / p, dtype=flat.dtype))


def _tensor_norm(flat: Tensor, p: float) -> Tensor:
    """:func:`_flat_norm` in polygrad ops, for storages without an array namespace."""
    if p == 2.0:
        return (flat * flat).sum() ** 0.5
    a = abs(flat)
    if p == math.inf:
        return a.max()
    if p == -math.inf:
        return a.min()
    if p == 1.0:
        return a.sum()
    return (a ** p).sum() ** (1.0 / p)


def total_norm(grads: list[Tensor], norm_type: float = 2.0, foreach: bool | None = None) -> Tensor:
    """The ``norm_type``-norm of ``grads`` viewed as one vector (PyTorch's ``get_total_norm``), as
    a 0-d tensor on their backend (0.0 when there is no element at all).

    One fused reduction over their concatenation: on the raw arrays when they speak the array
    API (numpy, cupy: a few array calls however many tensors), else in polygrad ops; both give
    the same bits.  ``foreach`` as in PyTorch: None picks, True requires the array path
    (``RuntimeError`` when the storage has none), False takes the ops.  ``norm_type`` is any
    nonzero number or +-inf; 0 is refused (PyTorch's total of it counts the *tensors* that
    have a nonzero, not the nonzeros: nothing to clip by).
    """
    p = float(norm_type)
    if math.isnan(p) or p == 0.0:
        raise ValueError(f"clip_grad_norm_: norm_type must be a nonzero number or +-inf, got {norm_type!r}")
    xp = _namespace(grads) if grads and foreach is not False else None
    if foreach and grads and xp is None:
        kinds = sorted({type(g.array).__name__ for g in grads})
        raise RuntimeError(f"clip_grad_norm_: foreach=True was passed, but the gradients' storage "
                           f"({', '.join(kinds)}) has no array namespace to fuse the norm over")
    if not sum(g.numel for g in grads):
        return pg.tensor(0.0, dtype=grads[0].dtype, backend=grads[0].backend) if grads else pg.tensor(0.0)
    with pg.no_grad():
        if xp is None:
            flat = pg.concat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
            return _tensor_norm(flat, p)
        for g in grads:
            note_host_read(g)  # a pg.compile capture refuses a step that reads computed values
        arrays = [xp.reshape(g.array, (-1,)) for g in grads]
        flat = xp.concat(arrays) if len(arrays) > 1 else arrays[0]
        return pg.tensor(_flat_norm(flat, p, xp), backend=grads[0].backend)


def grad_norm(parameters: "Iterable[Tensor] | Tensor", norm_type: float = 2.0) -> float:
    """The ``norm_type``-norm of all gradients together (parameters without a gradient are skipped)."""
    return float(total_norm(_gradients(parameters)[1], norm_type))


def clip_grad_norm_(parameters: "Iterable[Tensor] | Tensor", max_norm: float = 1.0, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None, *, eps: float = 1e-6) -> Tensor:
    """PyTorch's ``clip_grad_norm_``: scale the gradients so their joint ``norm_type``-norm is at
    most ``max_norm`` (by ``min(max_norm / (norm + eps), 1)``); return the norm before clipping,
    as a 0-d tensor.

    The norm is taken over dense gradients and the stored values of sparse ones (a sparse
    gradient keeps its pattern), fused into one reduction (:func:`total_norm`, where ``foreach``
    is explained).  A non-finite norm raises :class:`~polygrad.errors.NonFiniteError` with
    ``error_if_nonfinite``; otherwise the gradients are scaled by it anyway (NaN, or 0 for an
    infinite norm), as in PyTorch.  Each clipped gradient is a new tensor (the old one is not
    written: autodiff may have handed one gradient tensor to several parameters).  Unlike
    PyTorch, a ``max_norm`` that is not positive and finite is a ``ValueError``.
    """
    if not max_norm > 0 or not math.isfinite(max_norm):
        raise ValueError(f"clip_grad_norm_: max_norm must be a positive finite number, got {max_norm}")
    params, grads = _gradients(parameters)
    norm = total_norm(grads, norm_type, foreach)
    value = float(norm)
    if not math.isfinite(value) and error_if_nonfinite:
        raise NonFiniteError(f"clip_grad_norm_: the total norm of order {float(norm_type)} of the gradients is "
                             f"{value}, so it cannot be clipped (error_if_nonfinite=False scales them anyway)")
    coef = max_norm / (value + eps)
    if coef >= 1.0:  # PyTorch multiplies by min(coef, 1): by 1 leaves every bit as it is
        return norm
    with pg.no_grad():
        for p in params:
            g = p.grad
            if g is None:
                continue
            if is_sparse(g) or not hasattr(g.array, "__array_namespace__") or foreach is False:
                p.grad = g * coef
            else:
                p.grad = g.detach().update_(g.array * coef)
    return norm
