"""Movement: reshape, permute, transpose, expand, (un)squeeze, flatten, concat, stack."""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


from ..engine.dispatch import apply
from ..ir.errors import DTypeError, ShapeError
from ..engine.inference import normalize_axes
from ..ir.ops import Op
from .torch_names import accept_torch_names

from .args import Tensor, _dim_arg, _shape_arg
from .sparse_routing import _sparse, is_sparse


# -- movement -----------------------------------------------------------------------------------------

def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = _shape_arg(tuple(shape), "reshape")
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {shape}")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or x.numel % known:
            raise ShapeError(f"reshape: cannot reshape {x.shape} into {shape}")
        shape = tuple(x.numel // known if s == -1 else s for s in shape)
    if shape == x.shape:
        return x
    return apply(Op.RESHAPE, (x,), {"shape": shape})


def permute(x: Tensor, dims: Sequence[int]) -> Tensor:
    perm = tuple(_dim_arg("permute", d, x.ndim) for d in dims) if x.ndim else _shape_arg(tuple(dims), "permute")
    if perm == tuple(range(x.ndim)):
        return x
    return apply(Op.PERMUTE, (x,), {"perm": perm})


def transpose(x: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
    if is_sparse(x):
        return _sparse("transpose")(x)
    if x.ndim < 2:
        return x
    dim0, dim1 = _dim_arg("transpose", dim0, x.ndim), _dim_arg("transpose", dim1, x.ndim)
    perm = list(range(x.ndim))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return permute(x, perm)


def expand(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = _shape_arg(tuple(shape), "expand")
    if shape == x.shape:
        return x
    return apply(Op.EXPAND, (x,), {"shape": shape})


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    dim = _dim_arg("unsqueeze", dim, x.ndim + 1)
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


def squeeze(x: Tensor, dim=None) -> Tensor:
    if dim is None:
        return reshape(x, tuple(s for s in x.shape if s != 1))
    dims = normalize_axes(Op.RESHAPE, dim, x.ndim)
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if not (i in dims and s == 1)))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1,))
    s, e = _dim_arg("flatten", start_dim, x.ndim), _dim_arg("flatten", end_dim, x.ndim)
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def _tensor_list(what: str, tensors: Any) -> list:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Iterable):
        raise DTypeError(f"{what}: expects a sequence of tensors, got {type(tensors).__name__}")
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise DTypeError(f"{what}: expects tensors, got a {type(t).__name__}")
    return tensors


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _tensor_list("concat", tensors)
    if not tensors:
        raise ShapeError("concat: needs at least one tensor")
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ShapeError("concat: zero-dimensional tensors cannot be concatenated (use stack)")
    if any(t.ndim != ndim for t in tensors):
        raise ShapeError(f"concat: all tensors need the same number of dims, got "
                         f"{', '.join(str(t.shape) for t in tensors)}")
    axis = normalize_axes(Op.CONCAT, axis, ndim)[0]
    if len(tensors) == 1:
        return tensors[0]
    return apply(Op.CONCAT, tuple(tensors), {"axis": axis})


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = _tensor_list("stack", tensors)
    if not tensors:
        raise ShapeError("stack: needs at least one tensor")
    axis = _dim_arg("stack", axis, tensors[0].ndim + 1)
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ShapeError(f"stack: all tensors need the same shape, got {', '.join(str(t.shape) for t in tensors)}")
    parts = [unsqueeze(t, axis) for t in tensors]
    return parts[0] if len(parts) == 1 else apply(Op.CONCAT, tuple(parts), {"axis": axis})


# dim=/keepdim= wherever axis=/keepdims= are taken (see polygrad.tensor.torch_names); wrapped here,
# once, so each op keeps one signature in numpy's names.
concat = accept_torch_names(concat)
stack = accept_torch_names(stack)
cat = concat
