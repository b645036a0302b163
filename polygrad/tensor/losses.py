"""Losses: cross_entropy and mse, composites whose gradients come from the gradient table.

Cross-entropy at integer classes runs as one primitive, ``Op.CROSS_ENTROPY``, on a backend that
has its kernel: the composite's own steps without their two dozen dispatches
(:mod:`polygrad.engine.cross_entropy`), the same bits; elsewhere, the composite itself.
"""
from __future__ import annotations


import numpy as np

from ..engine import dispatch
from ..engine.dispatch import apply
from ..ir.errors import DTypeError, IndexOutOfRangeError, ShapeError
from ..ir.ops import Op
from ..runtime.registry import registry

from .args import Tensor
from .elementwise import _as_operand
from .reductions import log_softmax
from .sparse_routing import is_sparse


def _target_indices(target) -> np.ndarray:
    try:
        arr = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"cross_entropy: class targets must be an integer array: {exc}") from None
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"cross_entropy: class targets must be integers, got {arr.dtype}")
    return arr.astype(np.int64)


def cross_entropy(logits: Tensor, target, mask=None, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis of ``logits`` [N, C].

    ``target``: integer class indices [N] (or class probabilities [N, C]).  ``mask``: a boolean
    mask [N] or an index array selecting which rows count (e.g. the training nodes of a graph).
    """
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must be [N, C], got {logits.shape}")
    if mask is not None:
        rows = _mask_rows(mask, logits.shape[0])
        logits = logits[rows]
        if isinstance(target, Tensor) and target.dtype.kind == "f":
            target = target[rows]
        else:
            target = _target_indices(target)[rows]
    if not (isinstance(target, Tensor) and target.dtype.kind == "f"):
        fused = _fused_cross_entropy(logits, target, reduction)
        if fused is not None:
            return fused
    logp = log_softmax(logits, -1)
    if isinstance(target, Tensor) and target.dtype.kind == "f":
        if target.shape != logits.shape:
            raise ShapeError(f"cross_entropy: probability targets {target.shape} must match logits {logits.shape}")
        losses = -(target * logp).sum(-1)
    else:
        idx = _target_indices(target)
        if idx.shape != (logits.shape[0],):
            raise ShapeError(f"cross_entropy: targets {idx.shape} must be [N] for logits {logits.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= logits.shape[1]):
            raise ShapeError(f"cross_entropy: target class out of range [0, {logits.shape[1]})")
        losses = -logp[np.arange(idx.shape[0]), idx]
    return reduce_losses(losses, reduction, "cross_entropy")


_KEY = (Op.CROSS_ENTROPY, "dense")


def _fused_cross_entropy(logits: Tensor, target, reduction: str) -> Tensor | None:
    """The loss as one ``Op.CROSS_ENTROPY`` where it gives the composite's result (a dense
    floating ``[N, C >= 1]`` tensor on a backend with the op's kernel, integer targets, a known
    reduction); None where the composite must run (or report the error)."""
    if (is_sparse(logits) or logits.dtype.kind != "f" or logits.shape[1] < 1
            or reduction not in ("mean", "sum", "none")
            or registry.tables.get(logits._be.name, _NONE).get(_KEY) is None):
        return None
    idx = _target_indices(target)
    if idx.shape != (logits.shape[0],) or (idx.size and (idx.min() < 0 or idx.max() >= logits.shape[1])):
        return None  # the composite names the problem
    rec = dispatch._recording.get()
    if rec is not None:  # pg.compile guards the classes by content, as it does a getitem's index
        rec.host_array(idx)
    return apply(Op.CROSS_ENTROPY, (logits,), {"target": idx, "reduction": reduction})


_NONE: dict = {}


def reduce_losses(losses: Tensor, reduction: str, name: str) -> Tensor:
    """The ``reduction=`` argument every loss takes: "mean", "sum" or "none"."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _mask_rows(mask, n: int) -> np.ndarray:
    try:
        arr = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"mask must be a bool mask [{n}] or integer row indices: {exc}") from None
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ShapeError(f"mask of shape {arr.shape} does not match {n} rows")
        return np.flatnonzero(arr)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise DTypeError(f"mask must be a bool mask [{n}] or 1-D integer row indices, got {arr.dtype} {arr.shape}")
    rows = arr.astype(np.int64).reshape(-1)
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise IndexOutOfRangeError(f"mask: row index out of range for {n} rows")
    return rows


def mse(pred: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean squared error; ``pred`` and a tensor ``target`` must have the same shape (an [N, 1]
    prediction against [N] targets would otherwise broadcast to [N, N] silently)."""
    target = _as_operand(target, pred)
    if target.shape != pred.shape and target.ndim:
        raise ShapeError(f"mse: prediction of shape {pred.shape} and target of shape {target.shape} differ "
                         "(reshape one explicitly; broadcasting them would be a silent mistake)")
    d = pred - target
    return reduce_losses(d * d, reduction, "mse")
