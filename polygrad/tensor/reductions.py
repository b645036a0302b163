"""Reductions (sum, mean, max, min, argmax, argmin) and the softmax family (logsumexp, softmax,
log_softmax), composed from primitives."""
from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from ..engine.dispatch import apply
from ..ir.dtypes import int64
from ..ir.errors import ShapeError
from ..engine.inference import normalize_axes
from ..ir.ops import Op
from .torch_names import accept_torch_names

from .args import Tensor, _dim_arg, _floating
from .sparse_routing import _sparse, is_sparse
from .movement import squeeze
from .creation import tensor
from .elementwise import where


# -- reductions ---------------------------------------------------------------------------------------

def sum(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    if is_sparse(x):
        return _sparse("sum")(x, axis, keepdims)
    return apply(Op.SUM, (x,), _reduce_attrs(Op.SUM, axis, x.ndim, keepdims))


#: the attrs of a reduction over all axes, by (op, ndim, keepdims): one dict each, shared by every
#: call (nothing writes an op's attrs), so pg.compile's forward plan matches them by identity
_ALL_AXES: dict[tuple, dict] = {}


def _reduce_attrs(op: Op, axis: Any, ndim: int, keepdims: Any) -> dict:
    """The attrs of reduction ``op`` over ``axis`` (None: all axes, then shared) of an ``ndim``-d tensor."""
    if axis is None and type(keepdims) is bool:
        attrs = _ALL_AXES.get((op, ndim, keepdims))
        if attrs is None:
            attrs = _ALL_AXES[(op, ndim, keepdims)] = {"axes": tuple(range(ndim)), "keepdims": keepdims}
        return attrs
    return {"axes": normalize_axes(op, axis, ndim), "keepdims": keepdims}


def mean(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    axes = normalize_axes(Op.SUM, axis, x.ndim)
    count = math.prod(x.shape[a] for a in axes)
    return _sum(_floating(x), None if axis is None else axes, keepdims) * (1.0 / count if count else math.nan)


def max(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The maximum over ``axis`` (all axes by default).  ``max(dim=1)`` gives the values only -- numpy's
    ``amax``, PyTorch's ``torch.amax`` -- not PyTorch's ``(values, indices)``: use ``argmax`` for those."""
    return apply(Op.MAX, (x,), {"axes": normalize_axes(Op.MAX, axis, x.ndim), "keepdims": keepdims})


def min(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """The minimum over ``axis``; like :func:`max`, the values only (``argmin`` gives the indices)."""
    if x.dtype.kind in "ub":  # negation would wrap (unsigned) or is undefined (bool)
        return (-max(-x.cast(int64), axis, keepdims)).cast(x.dtype)
    return -max(-x, axis, keepdims)


def argmax(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the maximum (no gradient); computed on the host.  Ties: the first index."""
    return _arg_extreme("argmax", np.argmax, x, axis, keepdims)


def argmin(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the minimum (no gradient); computed on the host.  Ties: the first index."""
    return _arg_extreme("argmin", np.argmin, x, axis, keepdims)


def _arg_extreme(name: str, np_fn, x: Tensor, axis, keepdims: bool) -> Tensor:
    if axis is not None:
        axis = _dim_arg(name, axis, builtins.max(x.ndim, 1))
    if x.numel == 0 or (axis is not None and x.ndim and x.shape[axis] == 0):
        raise ShapeError(f"{name}: reduction over an empty axis of shape {x.shape} has no identity")
    arr = x.numpy()
    out = np_fn(arr, axis=axis, keepdims=bool(keepdims)) if x.ndim else np_fn(arr)
    return tensor(out, dtype=int64, backend=x._be)


def _row_max(x: Tensor, axis) -> Tensor:
    """The max along ``axis`` (kept) of the detached input: the max records no graph node, and the
    results below are shift-invariant, so no gradient needs to flow through it.  Over an empty
    axis (no max) the shift is 0: softmax of nothing is empty and logsumexp of nothing is -inf, as
    in PyTorch."""
    if x.dtype.kind == "b":  # bool - bool has no meaning: promoted, as the shift always did
        x = _floating(x)
    if x.numel == 0:
        axes = normalize_axes(Op.MAX, axis, x.ndim)
        if any(x.shape[a] == 0 for a in axes):
            kept = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
            return tensor(np.zeros(kept, dtype=x.dtype), backend=x._be)
    return max(x.detach(), axis, keepdims=True)


def _shift(x: Tensor, axis) -> Tensor:
    """``logsumexp``'s shift: the row max with non-finite maxima replaced by 0, as
    ``torch.logsumexp`` does (a row of -inf gives -inf, one +inf gives +inf, not inf - inf = nan)."""
    m = _row_max(x, axis)
    # (m * 0 == 0 would test finiteness in two ops instead of three, but inf * 0 makes numpy warn)
    return where(m.abs() < math.inf, m, 0.0)


def logsumexp(x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    m = _shift(x, axis)
    out = sum((x - m).exp(), axis, keepdims=True).log() + m
    return out if keepdims else squeeze(out, normalize_axes(Op.SUM, axis, x.ndim))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``.  Shifted by the plain row max, as
    PyTorch's kernel: a row whose max is not finite (+inf, or all -inf) is NaN throughout."""
    e = (x - _row_max(x, axis)).exp()
    return e / sum(e, axis, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``; a row whose max is not finite is NaN
    throughout (its gradient too), as ``torch.log_softmax``."""
    shifted = x - _row_max(x, axis)
    return shifted - sum(shifted.exp(), axis, keepdims=True).log()


# dim=/keepdim= wherever axis=/keepdims= are taken (see polygrad.tensor.torch_names); wrapped here,
# once, so each op keeps one signature in numpy's names.
_sum, _mean = sum, mean  # unwrapped: Tensor.sum / Tensor.mean call these (their own wrapper took the names)
sum = accept_torch_names(sum)  # noqa: A001
mean = accept_torch_names(mean)
max = accept_torch_names(max)  # noqa: A001
min = accept_torch_names(min)  # noqa: A001
argmax = accept_torch_names(argmax)
argmin = accept_torch_names(argmin)
logsumexp = accept_torch_names(logsumexp)
softmax = accept_torch_names(softmax)
log_softmax = accept_torch_names(log_softmax)
