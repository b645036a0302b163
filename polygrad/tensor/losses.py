"""Losses: cross_entropy, nll_loss and mse, composites whose gradients come from the gradient table.

``cross_entropy`` and ``nll_loss`` take PyTorch's signatures and semantics (``weight`` per class,
``ignore_index``, ``reduction``, ``label_smoothing``, probability targets), plus polygrad's
keyword-only ``mask`` choosing which rows count (the training nodes of a graph).

Cross-entropy at integer classes with no weight, no smoothing and no ignored row runs as one
primitive, ``Op.CROSS_ENTROPY``, on a backend that has its kernel: the composite's own steps
without their two dozen dispatches (:mod:`polygrad.engine.cross_entropy`), the same bits;
at class probabilities with no weight and no smoothing, likewise ``Op.SOFT_CROSS_ENTROPY``
(probabilities of the logits' dtype and backend, taking no gradient or a leaf of their own; a
backend's kernel may accept only some arrays: a distributed one's in its own row blocks, and
numpy's none, being slower in one process than the composite);
elsewhere, and with the other options, the composite itself.
"""
from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np

from ..engine import dispatch
from ..engine.dispatch import apply
from ..ir.errors import ArgumentError, DTypeError, IndexOutOfRangeError, ShapeError
from ..ir.ops import Op
from ..runtime.registry import registry

from .args import Tensor, _floating
from .creation import tensor as _tensor
from .elementwise import _as_operand
from .reductions import log_softmax
from .indexing import index_add
from .sparse_routing import is_sparse


def _target_indices(target, name: str = "cross_entropy") -> np.ndarray:
    try:
        arr = target.numpy() if isinstance(target, Tensor) else np.asarray(target)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"{name}: class targets must be an integer array: {exc}") from None
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{name}: class targets must be integers, got {arr.dtype}")
    dispatch.guard_host_array(arr)
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:  # would wrap negative
        raise IndexOutOfRangeError(f"{name}: target class {int(arr.max())} out of range (uint64 past int64)")
    return arr.astype(np.int64)


def _check_arguments(name: str, input: Any, size_average: Any, reduce: Any, reduction: str,
                     ignore_index: Any) -> None:
    """What every option of the two losses must be, checked before anything runs."""
    if size_average is not None and not isinstance(size_average, bool):
        # a 4th positional that was reduction (cross_entropy) or ignore_index (nll_loss) before
        # polygrad took PyTorch's signature: say that, not what a legacy flag would mean
        raise ArgumentError(
            f"{name}: the 4th positional argument is PyTorch's deprecated size_average, got {size_average!r}; "
            f"{name} takes PyTorch's signature (input, target, weight=None, size_average=None, ignore_index=-100, "
            "reduce=None, reduction='mean', ...): pass reduction= and ignore_index= by keyword")
    if size_average is not None or reduce is not None:
        # what they meant (PyTorch's _Reduction.legacy_get_string): reduce=False wins, then size_average
        meant = "none" if reduce is False else "sum" if size_average is False else "mean"
        raise ArgumentError(
            f"{name}: size_average= and reduce= are PyTorch's deprecated arguments and polygrad does not take "
            f"them (got size_average={size_average!r}, reduce={reduce!r}); use reduction={meant!r} instead "
            "(reduction= takes 'mean', 'sum' or 'none')")
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise ArgumentError(f"{name}: ignore_index must be an integer class, got {ignore_index!r}")
    if not isinstance(input, Tensor):
        raise DTypeError(f"{name}: input must be a polygrad tensor, got {type(input).__name__}")
    if input.ndim != 2:
        raise ShapeError(f"{name}: input must be [N, C] (polygrad takes no unbatched [C] or [N, C, d1, ...] "
                         f"input: move the class axis last and flatten the rest), got {input.shape}")
    if input.dtype.kind not in "fiub":
        raise DTypeError(f"{name}: input must be real (integers and bools are promoted to floating), "
                         f"got {input.dtype}")


def _smoothing(label_smoothing: Any) -> float:
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, Real) \
            or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ArgumentError(f"cross_entropy: label_smoothing must be a number in [0.0, 1.0], got {label_smoothing!r}")
    return float(label_smoothing)


def _class_weight(name: str, weight: Any, input: Tensor) -> np.ndarray | None:
    """``weight`` as a float64 host array [C] (a constant: no gradient reaches it, as in PyTorch)."""
    if weight is None:
        return None
    if isinstance(weight, Tensor):
        if weight.requires_grad:
            raise ArgumentError(f"{name}: weight takes no gradient (PyTorch does not differentiate it either); "
                                "pass weight.detach()")
        arr = weight.numpy()
    else:
        try:
            arr = np.asarray(weight)
        except (ValueError, TypeError) as exc:
            raise ShapeError(f"{name}: weight must be a 1-D array of one float per class: {exc}") from None
    dispatch.guard_host_array(arr)
    c = input.shape[1]
    if arr.dtype.kind != "f":
        hint = (" (a row mask is passed as mask=..., keyword only: the third positional argument is PyTorch's "
                "class weight)" if arr.dtype.kind in "biu" else "")
        raise DTypeError(f"{name}: weight must be floating (one float per class), got {arr.dtype}{hint}")
    if arr.shape != (c,):
        raise ShapeError(f"{name}: weight of shape {arr.shape} must be [C] = ({c},) for input {input.shape}")
    return arr.astype(np.float64)


def _probabilities(target: Any, input: Tensor) -> Tensor | None:
    """``target`` as class probabilities [N, C] (a floating tensor, or a floating array of the
    input's shape, as PyTorch's "same shape means probabilities"); None for class indices."""
    if isinstance(target, Tensor):
        return target if target.dtype.kind == "f" else None
    if isinstance(target, np.ndarray) and target.dtype.kind == "f" and target.shape == tuple(input.shape):
        return _tensor(target.astype(input.dtype, copy=False), backend=input.backend)
    return None


def _mask_selects(mask: Any, input: Tensor, target: Any) -> tuple[Tensor, Any]:
    rows = _mask_rows(mask, input.shape[0])
    if isinstance(target, Tensor) and target.dtype.kind == "f":
        return input[rows], target[rows]
    probs = _probabilities(target, input)
    if probs is not None:
        return input[rows], probs[rows]
    return input[rows], _target_indices(target)[rows]


def cross_entropy(input: Tensor, target: Any, weight: Any = None, size_average: Any = None,  # noqa: A002
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, mask: Any = None) -> Tensor:
    """Softmax cross-entropy over the last axis of ``input [N, C]`` (logits), PyTorch's
    ``torch.nn.functional.cross_entropy``: same arguments, order and results.

    * ``target``: integer class indices ``[N]``, or class probabilities ``[N, C]`` (a floating
      tensor, or a floating array of the input's shape).
    * ``weight``: a floating ``[C]`` weight per class (a constant).  Each row's loss is scaled by
      its target's weight and "mean" divides by the summed weights of the counted rows (not by
      their number); with probability targets "mean" divides by ``N``.
    * ``ignore_index``: rows whose class is this count for nothing (zero loss, zero gradient,
      left out of the mean's denominator); all rows ignored gives NaN for "mean", as in PyTorch.
      Probability targets take no ``ignore_index`` (it must stay negative).
    * ``label_smoothing`` in ``[0, 1]``: PyTorch's mix ``(1 - e) * nll + e / C * smooth``, where
      ``smooth = -sum_c w[c] log p[c]`` per counted row (divided by the same summed weights for
      "mean"); for probability targets the targets become ``t * (1 - e) + e / C``.
    * ``size_average`` / ``reduce``: PyTorch's deprecated arguments, refused (use ``reduction``).
    * ``mask`` (polygrad's, keyword only): a boolean ``[N]`` mask or an index array choosing which
      rows count (the training nodes of a graph), applied before everything else.

    Under ``pg.compile``, numpy arrays given as classes, ``weight`` or ``mask`` are guarded by
    content (edited in place between calls, the step is captured again); Python lists are read
    when the step is captured, as any host data a ``pure=True`` step turns into tensors itself.
    """
    _check_arguments("cross_entropy", input, size_average, reduce, reduction, ignore_index)
    input = _floating(input)
    eps = _smoothing(label_smoothing)
    if mask is not None:
        input, target = _mask_selects(mask, input, target)
    n, c = input.shape
    w = _class_weight("cross_entropy", weight, input)
    probs = _probabilities(target, input)
    if probs is not None:
        if ignore_index >= 0:
            raise ArgumentError(f"cross_entropy: ignore_index={ignore_index} is not supported for probability "
                                "targets (as in PyTorch)")
        return _soft_cross_entropy(input, probs, w, reduction, eps)
    idx, counted = _class_targets("cross_entropy", target, input, ignore_index)
    if w is None and eps == 0.0 and counted is None:  # PyTorch's plain case: one fused op where it can
        fused = _fused_cross_entropy(input, idx, reduction)
        if fused is not None:
            return fused
        return reduce_losses(-log_softmax(input, -1)[np.arange(n), idx], reduction, "cross_entropy")
    logp = log_softmax(input, -1)
    nll, denominator = _weighted_nll(logp, idx, counted, w, reduction)
    if eps == 0.0:
        return nll
    # the smoothing term: -sum_c w[c] logp[i, c] over the counted rows (PyTorch zeroes the ignored ones)
    rows = np.arange(n) if counted is None else np.flatnonzero(counted)
    picked = logp if rows.size == n else logp[rows]
    if w is not None:
        picked = picked * _tensor(w.astype(input.dtype), backend=input.backend)
    smooth = -picked.sum(-1)
    if reduction == "none":
        smooth_term = smooth if rows.size == n else index_add(smooth, (rows,), (n,))
    else:
        smooth_term = smooth.sum()
        if reduction == "mean":
            smooth_term = _mean(smooth_term, denominator)
    return nll * (1.0 - eps) + smooth_term * (eps / c)


def _soft_cross_entropy(input: Tensor, probs: Tensor, w: np.ndarray | None, reduction: str, eps: float) -> Tensor:
    """PyTorch's ``cross_entropy_loss_prob_target``: ``-sum_c logp * t * w`` per row; "mean"
    divides by ``N`` (NaN for no rows), whatever the weights."""
    if probs.shape != input.shape:
        raise ShapeError(f"cross_entropy: probability targets {probs.shape} must match input {input.shape}")
    if w is None and eps == 0.0:  # the plain case: one fused op where it can
        fused = _fused_soft_cross_entropy(input, probs, reduction)
        if fused is not None:
            return fused
    logp = log_softmax(input, -1)
    if eps > 0.0:
        probs = probs * (1.0 - eps) + eps / input.shape[1]
    terms = logp * probs if w is None else logp * probs * _tensor(w.astype(input.dtype), backend=input.backend)
    return reduce_losses(-terms.sum(-1), reduction, "cross_entropy")


def _class_targets(name: str, target: Any, input: Tensor, ignore_index: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The classes as int64 ``[N]``, checked, and which rows count (None: every row, the common
    case, told apart by the classes' range alone -- two reductions instead of four passes)."""
    idx = _target_indices(target, name)
    n, c = input.shape
    if idx.shape != (n,):
        raise ShapeError(f"{name}: targets {idx.shape} must be [N] = ({n},) for input {input.shape}")
    if not idx.size:
        return idx, None
    lo, hi = int(idx.min()), int(idx.max())
    if 0 <= lo and hi < c and not lo <= ignore_index <= hi:
        return idx, None
    counted = idx != ignore_index
    bad = counted & ((idx < 0) | (idx >= c))
    if bad.any():
        raise ShapeError(f"{name}: target class out of range [0, {c}) for input {input.shape}: "
                         f"{int(idx[bad][0])} (ignore_index={ignore_index})")
    return idx, (None if counted.all() else counted)


def _mean(total: Tensor, denominator: float) -> Tensor:
    """``total / denominator`` as polygrad's means compute it (times the reciprocal); a tiny
    denominator, whose reciprocal overflows ``total``'s dtype where the quotient need not, is
    scaled by 2**64 on both sides first (exact), so summed weights of 1e-310 (or 1e-40 for
    float32 input) give PyTorch's finite mean, not inf."""
    with np.errstate(divide="ignore", over="ignore"):  # summed weights of 0: total * inf (0 / 0 is NaN), as PyTorch
        scale = float(np.float64(1.0) / np.float64(denominator))
        overflows = bool(np.isinf(np.asarray(scale, dtype=total.dtype)))
    if overflows and denominator != 0.0:
        return (total * 2.0 ** 64) * float(np.float64(1.0) / np.float64(denominator * 2.0 ** 64))
    return total * scale


def _weighted_nll(logp: Tensor, idx: np.ndarray, counted: np.ndarray | None, w: np.ndarray | None,
                  reduction: str) -> tuple[Tensor, float]:
    """``-w[t] logp[i, t]`` over the counted rows (``counted`` None: all), reduced as PyTorch's
    ``nll_loss`` ("mean" divides by the counted rows' summed weights), and that denominator."""
    n = logp.shape[0]
    rows = np.arange(n) if counted is None else np.flatnonzero(counted)
    cls = idx[rows]
    picked = logp[rows, cls]
    if w is not None:
        picked = picked * _tensor(w[cls].astype(logp.dtype), backend=logp.backend)
    if reduction == "none":  # no counted row: zeros that still reach ``logp`` (a zero gradient)
        return index_add(-picked, (rows,), (n,)), 1.0
    total = -picked.sum()
    if reduction == "sum":
        return total, 1.0
    denominator = float(w[cls].sum()) if w is not None else float(rows.size)
    return _mean(total, denominator), denominator


def nll_loss(input: Tensor, target: Any, weight: Any = None, size_average: Any = None,  # noqa: A002
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean", *, mask: Any = None) -> Tensor:
    """Negative log-likelihood of log-probabilities ``input [N, C]`` at integer classes ``target [N]``,
    PyTorch's ``torch.nn.functional.nll_loss``: ``-w[t] input[i, t]`` per row; rows whose target
    is ``ignore_index`` count for nothing; "mean" divides by the summed weights of the counted
    rows (NaN when none counts).  ``mask`` (keyword only) chooses the rows first, as in
    :func:`cross_entropy`; ``size_average`` / ``reduce`` are refused (use ``reduction``)."""
    _check_arguments("nll_loss", input, size_average, reduce, reduction, ignore_index)
    input = _floating(input)
    if mask is not None:
        rows = _mask_rows(mask, input.shape[0])
        input, target = input[rows], _target_indices(target, "nll_loss")[rows]
    w = _class_weight("nll_loss", weight, input)
    idx, counted = _class_targets("nll_loss", target, input, ignore_index)
    return _weighted_nll(input, idx, counted, w, reduction)[0]


_KEY = (Op.CROSS_ENTROPY, "dense")


def _fused_cross_entropy(logits: Tensor, idx: np.ndarray, reduction: str) -> Tensor | None:
    """The loss as one ``Op.CROSS_ENTROPY`` where it gives the composite's result (a dense
    floating ``[N, C >= 1]`` tensor on a backend with the op's kernel, validated int64 classes
    ``[N]``, a known reduction); None where the composite must run."""
    if (is_sparse(logits) or logits.dtype.kind != "f" or logits.shape[1] < 1
            or reduction not in ("mean", "sum", "none")):
        return None
    kernel = registry.tables.get(logits._be.name, _NONE).get(_KEY)
    # a kernel may serve only some arrays with the composite's result (``kernel.accepts(array)``:
    # a distributed backend's logits split into blocks of its own); the others run the composite
    if kernel is None or not getattr(kernel, "accepts", _ALL)(logits._data):
        return None
    return apply(Op.CROSS_ENTROPY, (logits,), {"target": idx, "reduction": reduction})


_SOFT_KEY = (Op.SOFT_CROSS_ENTROPY, "dense")


def _fused_soft_cross_entropy(logits: Tensor, probs: Tensor, reduction: str) -> Tensor | None:
    """The loss as one ``Op.SOFT_CROSS_ENTROPY`` where it gives the composite's result: dense
    floating logits and probabilities of one dtype on one backend with the op's kernel, a known
    reduction, and probabilities that take no gradient or are a leaf of their own (a gradient
    that reaches the logits by two paths would be accumulated in another order); None where the
    composite must run."""
    if (is_sparse(logits) or is_sparse(probs) or logits.dtype.kind != "f" or probs.dtype != logits.dtype
            or probs._be is not logits._be or logits.shape[1] < 1 or reduction not in ("mean", "sum", "none")
            or probs is logits or (probs.requires_grad and not probs.is_leaf)):
        return None
    kernel = registry.tables.get(logits._be.name, _NONE).get(_SOFT_KEY)
    # as for Op.CROSS_ENTROPY: a kernel may serve only some arrays (``kernel.accepts(logits, probs)``)
    if kernel is None or not getattr(kernel, "accepts", _ALL)(logits._data, probs._data):
        return None
    return apply(Op.SOFT_CROSS_ENTROPY, (logits, probs), {"reduction": reduction})


def _ALL(*arrays: Any) -> bool:  # noqa: N802 - a constant predicate
    return True


_NONE: dict = {}


def reduce_losses(losses: Tensor, reduction: str, name: str) -> Tensor:
    """The ``reduction=`` argument every loss takes: "mean", "sum" or "none"."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    raise ArgumentError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _mask_rows(mask, n: int) -> np.ndarray:
    try:
        arr = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise ShapeError(f"mask must be a bool mask [{n}] or integer row indices: {exc}") from None
    dispatch.guard_host_array(arr)
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
