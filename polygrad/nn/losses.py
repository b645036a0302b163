"""Losses: cross-entropy over logits (with a node mask), ``nll_loss``, ``binary_cross_entropy_with_logits``,
mean squared error, max-margin (hinge), L2; host-side metrics ``accuracy`` and ``roc_auc_score``.

All are compositions of polygrad ops, so their gradients come from the gradient table.
Shape mismatches that broadcasting would silently turn into a wrong answer (``[N, 1]`` against
``[N]`` gives ``[N, N]``) are refused with a :class:`~polygrad.errors.ShapeError` instead.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

import polygrad as pg
from polygrad.tensor.activations import softplus
from polygrad.ir.errors import DTypeError, ShapeError
from polygrad.tensor import Tensor, mse, reduce_losses as _reduce  # mse: one definition, pg.mse
from polygrad.tensor.losses import cross_entropy as _cross_entropy, nll_loss as _nll_loss

__all__ = ["cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "mse", "max_margin", "hinge",
           "l2_penalty", "accuracy", "roc_auc_score"]


def cross_entropy(input: Tensor, target: Any, weight: Any = None, size_average: Any = None,  # noqa: A002
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, mask: Any = None) -> Tensor:
    """Softmax cross-entropy of logits ``input [N, C]``: PyTorch's ``cross_entropy`` arguments
    (``weight`` per class, ``ignore_index``, ``reduction``, ``label_smoothing``, probability
    targets) plus polygrad's keyword-only ``mask``, a boolean ``[N]`` array or an index array
    choosing which rows count (the training nodes of a graph).  See :func:`polygrad.cross_entropy`.
    """
    return _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing,
                          mask=mask)


def _host(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, Tensor) else np.asarray(value)


def binary_cross_entropy_with_logits(input: Tensor, target: Any, weight: Any = None, reduction: str = "mean",
                                     pos_weight: Any = None) -> Tensor:  # noqa: A002 - PyTorch's name
    """``-[p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))]`` per element, times ``weight``
    (PyTorch's ``binary_cross_entropy_with_logits``, ``p = pos_weight``, broadcast over the last
    axis).  Evaluated as ``(1 - y) x + (1 + (p - 1) y) softplus(-x)``, which neither overflows
    nor loses the small losses of confident predictions.  ``target`` may be a constant array or
    a tensor (its gradient then flows too); shapes must match exactly.
    """
    if not isinstance(input, Tensor):
        raise DTypeError("binary_cross_entropy_with_logits: input must be a polygrad tensor, "
                         f"got {type(input).__name__}")
    if input.dtype.kind != "f":
        raise DTypeError(f"binary_cross_entropy_with_logits: input must be floating, got {input.dtype}")
    y = target if isinstance(target, Tensor) else pg.tensor(np.asarray(target, dtype=input.dtype),
                                                               backend=input.backend)
    if tuple(y.shape) != tuple(input.shape):
        raise ShapeError(f"binary_cross_entropy_with_logits: target of shape {tuple(y.shape)} must match input "
                         f"of shape {tuple(input.shape)}")
    soft = softplus(-input)
    if pos_weight is None:
        losses = input - input * y + soft
    else:
        p = pos_weight if isinstance(pos_weight, Tensor) else pg.tensor(np.asarray(pos_weight, dtype=input.dtype),
                                                                        backend=input.backend)
        losses = input - input * y + (y * (p - 1.0) + 1.0) * soft
    if weight is not None:
        losses = losses * (weight if isinstance(weight, Tensor)
                           else pg.tensor(np.asarray(weight, dtype=input.dtype), backend=input.backend))
    return _reduce(losses, reduction, "binary_cross_entropy_with_logits")


def nll_loss(input: Tensor, target: Any, weight: Any = None, size_average: Any = None,  # noqa: A002
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean", *, mask: Any = None) -> Tensor:
    """Negative log-likelihood of log-probabilities ``input [N, C]`` at integer classes ``target [N]``
    (PyTorch's ``nll_loss``, same arguments and order): ``-w[t] input[i, t]`` per row; rows whose
    target is ``ignore_index`` count for nothing; "mean" divides by the summed weights of the
    counted rows (NaN when none counts).  ``mask`` (keyword only) chooses the rows first."""
    return _nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction, mask=mask)


def roc_auc_score(y_true: Any, y_score: Any) -> float:
    """Area under the ROC curve of binary labels ``y_true`` against scores (host-side, like
    ``sklearn.metrics.roc_auc_score``): the probability that a random positive scores above a
    random negative, ties counting one half (sklearn's trapezoid over tied thresholds gives the
    same).  Needs both classes present."""
    y = _host(y_true).reshape(-1)
    s = _host(y_score).reshape(-1).astype(np.float64)
    if y.shape != s.shape:
        raise ShapeError(f"roc_auc_score: {y.shape[0]} labels for {s.shape[0]} scores")
    if np.isnan(s).any():
        raise ValueError("roc_auc_score: scores contain NaN")
    labels = np.unique(y)
    if labels.shape[0] != 2:
        raise ValueError(f"roc_auc_score: needs exactly two classes in y_true, got {labels.tolist()}")
    pos = y == labels[1]
    # mid-ranks: a tied group shares the mean of its ranks, so each positive-negative tie counts 1/2
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], s.shape[0]]
    mid = (starts + ends + 1) / 2.0  # 1-based mean rank of each group
    ranks = np.empty(s.shape[0])
    ranks[order] = np.repeat(mid, ends - starts)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


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
