"""Losses: cross-entropy over logits (with a node mask), mean squared error, max-margin (hinge), L2.

All are compositions of polygrad ops, so their gradients come from the gradient table.
Shape mismatches that broadcasting would silently turn into a wrong answer (``[N, 1]`` against
``[N]`` gives ``[N, N]``) are refused with a :class:`~polygrad.errors.ShapeError` instead.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

import polygrad as pg
from polygrad.errors import ShapeError
from polygrad.tensor import Tensor, mse, reduce_losses as _reduce  # mse: one definition, pg.mse

__all__ = ["cross_entropy", "mse", "max_margin", "hinge", "l2_penalty", "accuracy"]


def cross_entropy(logits: Tensor, target: Any, mask: Any = None, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of ``logits [N, C]`` against integer classes ``[N]``.

    ``mask``: a boolean ``[N]`` array or an index array choosing which rows count (the training
    nodes of a graph); the loss is averaged over those rows only.
    """
    return pg.cross_entropy(logits, target, mask=mask, reduction=reduction)


def max_margin(scores: Tensor, target: Any, margin: float = 1.0, reduction: str = "mean") -> Tensor:
    """Max-margin (hinge) loss ``relu(margin - y * score)`` with labels ``y`` in {-1, +1}.

    micrograd's moons loss.  ``scores`` of shape ``[N, 1]`` are flattened to match ``[N]`` labels.
    """
    if isinstance(target, Tensor) and target.requires_grad:
        labels = target
        if (scores.shape != labels.shape and scores.ndim == 2 and scores.shape[1] == 1
                and labels.shape == scores.shape[:1]):
            scores = scores.reshape(labels.shape)
        return _reduce((margin - labels * scores).relu(), reduction, "max_margin")
    # constant labels: fold the sign into them on the host, so the graph is mul, add, relu
    # (three ops instead of five: this loss sits in micrograd's hot training loop)
    y = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    if y.shape != scores.shape and scores.ndim == 2 and scores.shape[1] == 1 and y.shape == scores.shape[:1]:
        y = y.reshape(scores.shape)
    if y.shape != scores.shape:
        raise ShapeError(f"max_margin: scores of shape {scores.shape} and labels of shape {y.shape} differ")
    neg_y = pg.tensor(-np.asarray(y, dtype=scores.dtype), backend=scores.backend)
    return _reduce((neg_y * scores + margin).relu(), reduction, "max_margin")


hinge = max_margin


def l2_penalty(parameters: Iterable[Tensor]) -> Tensor:
    """``sum(p**2)`` over ``parameters`` (micrograd's ``reg_loss`` without the alpha)."""
    params = list(parameters)
    if not params:
        raise ValueError("l2_penalty: no parameters")
    total = (params[0] * params[0]).sum()
    for p in params[1:]:
        total = total + (p * p).sum()
    return total


def accuracy(logits_or_scores: Tensor, target: Any, mask: Any = None) -> float:
    """Fraction of correct predictions (host-side, no gradient).

    ``[N, C]`` logits are compared by argmax against integer classes; ``[N]`` / ``[N, 1]`` scores
    by sign against labels in {-1, +1} (or {0, 1}: a positive score predicts 1).
    """
    out = logits_or_scores.numpy() if isinstance(logits_or_scores, Tensor) else np.asarray(logits_or_scores)
    y = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    if out.ndim == 2 and out.shape[1] > 1:
        pred = out.argmax(axis=1)
    else:
        out = out.reshape(-1)
        pos = out > 0
        pred = np.where(pos, 1, -1) if y.size and y.min() < 0 else pos.astype(np.int64)
    if pred.shape != y.shape:
        raise ShapeError(f"accuracy: {pred.shape[0]} predictions for {y.shape} targets")
    if mask is not None:
        m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
        idx = np.flatnonzero(m) if m.dtype == bool else m.astype(np.int64)
        pred, y = pred[idx], y[idx]
    return float((pred == y).mean()) if y.size else float("nan")
