"""Indexing: ``x[index]`` (basic and integer-array), index_add, nonzero, and the out-of-place
writes ``masked_fill`` and ``index_put`` (polygrad tensors are never written in place)."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from ..engine import dispatch
from ..engine.dispatch import apply
from ..ir.dtypes import bool_
from ..ir.errors import DTypeError, ShapeError
from ..ir.ops import Op

from .args import Tensor, _shape_arg
from .elementwise import _as_operand, where
from .movement import expand
from .sparse_routing import is_sparse
from .creation import tensor, tensor_from_numpy


def _normalize_index(index: Any, shape: tuple) -> tuple:
    """A numpy-style index with tensors/lists turned into int64 arrays and bool masks into indices."""
    if not isinstance(index, tuple):
        index = (index,)
    out: list = []
    dim = 0
    for pos, item in enumerate(index):
        if isinstance(item, Tensor):
            item = item.numpy()
        else:
            dispatch.guard_host_array(item)
        if isinstance(item, list):
            try:
                item = np.asarray(item)
            except (ValueError, TypeError) as exc:  # ragged nested lists
                raise ShapeError(f"getitem: invalid index list for a tensor of shape {shape}: {exc}") from None
        if isinstance(item, np.ndarray):
            if item.dtype == bool and item.ndim == 0:
                raise DTypeError("getitem: a 0-d bool tensor is not a valid index")
            if item.dtype == bool:
                if item.shape != shape[dim:dim + item.ndim]:
                    raise ShapeError(f"getitem: boolean mask of shape {item.shape} does not match "
                                     f"dims {shape[dim:dim + item.ndim]} of a tensor of shape {shape}")
                out.extend(np.nonzero(item))
                dim += item.ndim
                continue
            if item.dtype.kind not in "iu":
                raise DTypeError(f"getitem: index arrays must be integer or bool, got {item.dtype}")
            out.append(item.astype(np.int64, copy=False))
            dim += 1
        elif isinstance(item, (bool, np.bool_)):
            raise DTypeError("getitem: a bare bool is not a valid index")
        elif isinstance(item, (int, np.integer)):
            out.append(int(item))
            dim += 1
        elif item is None or item is Ellipsis:
            out.append(item)
            if item is Ellipsis:
                dim = len(shape) - builtins.sum(_dims_consumed(i) for i in index[pos + 1:])
        elif isinstance(item, slice):
            out.append(item)
            dim += 1
        else:
            raise DTypeError(f"getitem: unsupported index {item!r}")
    return tuple(out)


def _dims_consumed(item: Any) -> int:
    if item is None or item is Ellipsis:
        return 0
    if isinstance(item, np.ndarray) and item.dtype == bool:
        return item.ndim
    return 1


def getitem(x: Tensor, index: Any) -> Tensor:
    if is_sparse(x):
        raise ShapeError("indexing a sparse tensor is not supported; use to_dense() or gather rows densely")
    return apply(Op.GETITEM, (x,), {"index": _normalize_index(index, x.shape)})


def index_add(src: Tensor, index: Any, shape: Sequence[int]) -> Tensor:
    """zeros(shape) with ``src`` added at ``index`` (repeated positions accumulate)."""
    shape = _shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), "index_add")
    return apply(Op.INDEX_ADD, (src,), {"index": _normalize_index(index, shape), "shape": shape})


def nonzero(x: Tensor, as_tuple: bool = False) -> Any:
    """PyTorch's ``torch.nonzero`` (see :meth:`Tensor.nonzero`); reads the values on the host."""
    if is_sparse(x):
        raise ShapeError("nonzero of a sparse tensor: its stored positions are x.pattern (rows, cols)")
    dispatch.note_host_read(x)  # a pg.compile capture guards what the indices came from
    host = x.numpy()
    if as_tuple:
        parts = np.nonzero(host.reshape(1) if host.ndim == 0 else host)
        return tuple(tensor_from_numpy(p.astype(np.int64), x._be) for p in parts)
    return tensor_from_numpy(np.argwhere(host).astype(np.int64), x._be)


def masked_fill(x: Tensor, mask: Any, value: Any) -> Tensor:
    """PyTorch's ``masked_fill``, out of place and differentiable: ``value`` (a number or a 0-d
    tensor) where the bool ``mask`` (broadcast to ``x``) is set, ``x`` elsewhere; ``x``'s dtype."""
    m = mask if isinstance(mask, Tensor) else tensor(np.asarray(mask), backend=x._be)
    if m.dtype != bool_:
        raise DTypeError(f"masked_fill: the mask must be a bool tensor, got {m.dtype} (tensor of shape {x.shape})")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
    out = where(m, value, x)
    if out.shape != x.shape:
        raise ShapeError(f"masked_fill: mask of shape {m.shape} does not broadcast to the tensor's {x.shape}")
    return out if out.dtype == x.dtype else out.cast(x.dtype)


def index_put(x: Tensor, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
    """PyTorch's ``index_put``, out of place and differentiable in ``x`` and ``values``.

    ``indices``: a tuple (or list) of index tensors / arrays, one per leading dimension (bool
    masks allowed), or one mask; ``values`` broadcast to ``x[indices]``.  ``accumulate=True``
    adds (repeated positions add up, as PyTorch); otherwise the positions are overwritten, and a
    position named twice is an error (PyTorch leaves the result undefined).
    """
    index = tuple(indices) if isinstance(indices, list) else indices
    norm = _normalize_index(index, x.shape)
    selected = np.zeros(x.shape, dtype=np.int64)
    np.add.at(selected, norm, 1)  # how often each position is named
    shape = np.zeros(x.shape, dtype=bool)[norm].shape
    v = values if isinstance(values, Tensor) else _as_operand(values, x)
    v = v if v.dtype == x.dtype else v.cast(x.dtype)
    if v.shape != shape:
        try:
            target = np.broadcast_shapes(v.shape, shape)
        except ValueError:
            target = None
        if target != shape:
            raise ShapeError(f"index_put: values of shape {v.shape} do not broadcast to x[indices] of shape {shape} "
                             f"(tensor of shape {x.shape})")
        v = expand(v.reshape((1,) * (len(shape) - v.ndim) + v.shape), shape)
    placed = index_add(v, norm, x.shape)
    if accumulate:
        return x + placed
    if (selected > 1).any():
        where_twice = tuple(int(i) for i in np.argwhere(selected > 1)[0])
        raise ShapeError(f"index_put: position {where_twice} of a tensor of shape {x.shape} is named more than once "
                         "(the result would depend on the order); pass accumulate=True to add")
    return where(tensor_from_numpy(selected > 0, x._be), placed, x)
