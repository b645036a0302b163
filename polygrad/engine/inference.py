"""Shape and dtype inference, and input validation, for every primitive op.

This runs before any kernel, so a shape or dtype mistake is always reported as the user's error
(ShapeError / DTypeError naming the op and operands), never mistaken for a backend fault, and so
dispatch can check each kernel's output against what the op must produce.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..ir.dtypes import bool_, int64, is_floating, promote
from ..ir.errors import DTypeError, IndexOutOfRangeError, ShapeError
from ..ir.ops import BINARY, COMPARE, FLOAT_UNARY, UNARY, Op

Shape = tuple[int, ...]
Spec = tuple[Shape, np.dtype]


def _shapes_and_dtypes(shapes: tuple[Shape, ...], dtypes: tuple[np.dtype, ...]) -> str:
    return ", ".join(f"{tuple(s)}:{d}" for s, d in zip(shapes, dtypes))


def broadcast_shapes(op: Op, *shapes: Shape) -> Shape:
    """numpy's broadcasting rule (in plain Python: this is on every op's hot path)."""
    first = shapes[0]
    if len(shapes) == 2:  # the common case, without generators
        second = shapes[1]
        if first == second:
            return first
        if len(first) == len(second):
            out2 = []
            for x, y in zip(first, second):
                if x == y or y == 1:
                    out2.append(x)
                elif x == 1:
                    out2.append(y)
                else:
                    break
            else:
                return tuple(out2)
    elif all(s == first for s in shapes):
        return first
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        offset = ndim - len(s)
        for i, n in enumerate(s):
            cur = out[offset + i]
            if n != cur:
                if cur == 1:
                    out[offset + i] = n
                elif n != 1:
                    raise ShapeError(f"op '{op}': shapes {', '.join(map(str, shapes))} cannot be broadcast "
                                     "together (numpy broadcasting rules)")
    return tuple(out)


def normalize_axes(op: Op, axis: Any, ndim: int) -> tuple[int, ...]:
    """axis=None -> all axes; ints may be negative; duplicates and out-of-range are errors."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(axis)
    else:
        raise DTypeError(f"op '{op}': axis must be None, an int or a tuple of ints, got {axis!r}")
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, (bool, np.bool_)):
            raise DTypeError(f"op '{op}': axis must be None, an int or a tuple of ints, got {axis!r}")
        a = int(a)
        if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise ShapeError(f"op '{op}': axis {a} is out of range for a tensor of {ndim} dims")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"op '{op}': repeated axis in {axes}")
    return tuple(sorted(out)) if ndim else ()


def _unary(op, shapes, dtypes, attrs):
    (shape,), (dtype,) = shapes, dtypes
    if op in FLOAT_UNARY and not is_floating(dtype):
        raise DTypeError(f"op '{op}' needs a floating tensor, got {dtype} (use .float())")
    if dtype == bool_ and op in (Op.NEG, Op.RELU):
        raise DTypeError(f"op '{op}' is not defined for bool tensors")
    return shape, dtype


def _cast(op, shapes, dtypes, attrs):
    return shapes[0], attrs["dtype"]


def _binary(op, shapes, dtypes, attrs):
    a, b = shapes
    shape = a if a == b else broadcast_shapes(op, a, b)
    da, db = dtypes
    dtype = da if da == db else promote(da, db)
    if dtype.kind != "f" and (dtype == bool_ and op != Op.MUL or op == Op.POW):
        if op != Op.POW:
            raise DTypeError(f"op '{op}' is not defined for bool tensors ({_shapes_and_dtypes(shapes, dtypes)})")
        raise DTypeError(f"op 'pow' needs a floating base or exponent, got {_shapes_and_dtypes(shapes, dtypes)}")
    return shape, dtype


def _compare(op, shapes, dtypes, attrs):
    return broadcast_shapes(op, *shapes), bool_


def _where(op, shapes, dtypes, attrs):
    if dtypes[0] != bool_:
        raise DTypeError(f"op 'where': condition must be bool, got {dtypes[0]}")
    return broadcast_shapes(op, *shapes), promote(dtypes[1], dtypes[2])


def _reduce(op, shapes, dtypes, attrs):
    (shape,), (dtype,) = shapes, dtypes
    axes, keepdims = attrs["axes"], attrs["keepdims"]
    if op == Op.MAX and any(shape[a] == 0 for a in axes):
        raise ShapeError(f"op 'max': reduction over an empty axis of shape {shape} has no identity")
    out = tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)
    if op == Op.SUM and dtype.kind in "bi":
        dtype = int64
    elif op == Op.SUM and dtype.kind == "u":
        dtype = np.dtype(np.uint64)  # numpy's accumulator for unsigned ints
    return out, dtype


#: the largest dimension numpy can represent (beyond it, allocation code fails in C)
MAX_DIM = int(np.iinfo(np.intp).max)


def check_dims(op: "Op | str", shape: Shape) -> None:
    """A target shape given by the user: non-negative ints that numpy can represent."""
    for s in shape:
        if not 0 <= s <= MAX_DIM:
            raise ShapeError(f"op '{op}': invalid dimension {s} in shape {tuple(shape)} (dimensions must be "
                             f"integers in [0, {MAX_DIM}])")
    # numpy refuses shapes whose nonzero dims multiply past intp, even with another dim 0
    if math.prod(s for s in shape if s) > MAX_DIM // 16:
        raise ShapeError(f"op '{op}': shape {tuple(shape)} has more elements than numpy can index")


def _reshape(op, shapes, dtypes, attrs):
    new = attrs["shape"]
    check_dims(op, new)
    if math.prod(new) != math.prod(shapes[0]):
        raise ShapeError(f"op 'reshape': cannot reshape {shapes[0]} into {new}")
    return new, dtypes[0]


def _permute(op, shapes, dtypes, attrs):
    perm, shape = attrs["perm"], shapes[0]
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"op 'permute': {perm} is not a permutation of the {len(shape)} dims of {shape}")
    return tuple(shape[p] for p in perm), dtypes[0]


def _expand(op, shapes, dtypes, attrs):
    target = attrs["shape"]
    check_dims(op, target)
    if broadcast_shapes(op, shapes[0], target) != tuple(target):
        raise ShapeError(f"op 'expand': cannot broadcast {shapes[0]} to {target}")
    return target, dtypes[0]


def index_result_shape(op: Op, shape: Shape, index: tuple) -> Shape:
    """Shape numpy gives for ``x[index]``, computed on a zero-stride view (no allocation)."""
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.int8), shape=shape,
                                            strides=(0,) * len(shape))
    try:
        return probe[index].shape
    except IndexError as exc:
        raise IndexOutOfRangeError(f"op '{op}': index out of range for shape {shape}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"op '{op}': invalid index for shape {shape}: {exc}") from None


def _getitem(op, shapes, dtypes, attrs):
    return index_result_shape(op, shapes[0], attrs["index"]), dtypes[0]


def _index_add(op, shapes, dtypes, attrs):
    target = attrs["shape"]
    check_dims(op, target)
    sel = index_result_shape(op, target, attrs["index"])
    if broadcast_shapes(op, shapes[0], sel) != tuple(sel):
        raise ShapeError(f"op 'index_add': source of shape {shapes[0]} does not fit the selection {sel} "
                         f"of a target of shape {target}")
    return target, dtypes[0]


def _concat(op, shapes, dtypes, attrs):
    axis = attrs["axis"]
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
            raise ShapeError(f"op 'concat': shapes {', '.join(map(str, shapes))} differ outside axis {axis}")
    dtype = dtypes[0]
    for d in dtypes[1:]:
        dtype = promote(dtype, d)
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:], dtype


def _matmul(op, shapes, dtypes, attrs):
    a, b = shapes
    if not a or not b:
        raise ShapeError(f"op 'matmul': operands must be at least 1-D, got {a} and {b}")
    ka = a[-1]
    kb = b[0] if len(b) == 1 else b[-2]
    if ka != kb:
        raise ShapeError(f"op 'matmul': inner dimensions differ: {a} @ {b} ({ka} != {kb})")
    batch = broadcast_shapes(op, a[:-2], b[:-2])
    out = batch + (a[-2:-1] if len(a) >= 2 else ()) + (b[-1:] if len(b) >= 2 else ())
    if bool_ in dtypes:
        raise DTypeError("op 'matmul' is not defined for bool tensors")
    return out, promote(*dtypes)


def _addmm(op, shapes, dtypes, attrs):
    if len(set(dtypes)) != 1:
        raise DTypeError(f"op 'addmm': operands must share one dtype, got {_shapes_and_dtypes(shapes, dtypes)}")
    out, dtype = _matmul(op, shapes[1:], dtypes[1:], attrs)
    if broadcast_shapes(op, out, shapes[0]) != out:
        raise ShapeError(f"op 'addmm': input of shape {shapes[0]} does not broadcast to the product's {out}")
    return out, dtype


def _addcmul(op, shapes, dtypes, attrs):
    if len(set(dtypes)) != 1 or dtypes[0] == bool_:
        raise DTypeError(f"op 'addcmul': operands must share one non-bool dtype, got "
                         f"{_shapes_and_dtypes(shapes, dtypes)}")
    product = broadcast_shapes(op, shapes[1], shapes[2])
    if broadcast_shapes(op, product, shapes[0]) != product:
        raise ShapeError(f"op 'addcmul': input of shape {shapes[0]} does not broadcast to the product's {product}")
    return product, dtypes[0]


def _cross_entropy(op, shapes, dtypes, attrs):
    (shape,), (dtype,) = shapes, dtypes
    target, reduction = attrs["target"], attrs["reduction"]
    if len(shape) != 2 or shape[1] < 1 or not is_floating(dtype):
        raise ShapeError(f"op 'cross_entropy': logits must be floating [N, C] with C >= 1, got {shape}:{dtype}")
    if not isinstance(target, np.ndarray) or target.dtype != int64 or target.shape != shape[:1]:
        raise ShapeError(f"op 'cross_entropy': target must be an int64 array [{shape[0]}], got "
                         f"{getattr(target, 'dtype', type(target).__name__)} {getattr(target, 'shape', '')}")
    if target.size and (int(target.min()) < 0 or int(target.max()) >= shape[1]):
        raise IndexOutOfRangeError(f"op 'cross_entropy': target class out of range [0, {shape[1]})")
    if reduction not in ("mean", "sum", "none"):
        raise ShapeError(f"op 'cross_entropy': reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return (shape[:1] if reduction == "none" else ()), dtype


def _soft_cross_entropy(op, shapes, dtypes, attrs):
    (shape, probs), (dtype, probs_dtype) = shapes, dtypes
    if len(shape) != 2 or shape[1] < 1 or not is_floating(dtype):
        raise ShapeError(f"op 'soft_cross_entropy': logits must be floating [N, C] with C >= 1, got {shape}:{dtype}")
    if probs != shape:
        raise ShapeError(f"op 'soft_cross_entropy': probabilities {probs} must have the logits' shape {shape}")
    if probs_dtype != dtype:
        raise DTypeError(f"op 'soft_cross_entropy': probabilities of dtype {probs_dtype} for logits of {dtype} "
                         "(the front end runs the composite, which promotes)")
    reduction = attrs["reduction"]
    if reduction not in ("mean", "sum", "none"):
        raise ShapeError(f"op 'soft_cross_entropy': reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return (shape[:1] if reduction == "none" else ()), dtype


def _check_pattern_values(op, shape, pattern):
    if len(shape) != 1 or shape[0] != pattern.nnz:
        raise ShapeError(f"op '{op}': values must be 1-D with nnz={pattern.nnz} entries, got {shape}")


def _spmm(op, shapes, dtypes, attrs):
    pattern = attrs["pattern"]
    _check_pattern_values(op, shapes[0], pattern)
    x = shapes[1]
    if len(x) not in (1, 2) or x[0] != pattern.shape[1]:
        raise ShapeError(f"op 'spmm': sparse {pattern.shape} ({pattern.layout}) @ dense {x}: "
                         f"dense operand must be 1-D or 2-D with {pattern.shape[1]} rows")
    return (pattern.shape[0],) + x[1:], promote(*dtypes)


def _sddmm(op, shapes, dtypes, attrs):
    pattern = attrs["pattern"]
    p, q = shapes
    if len(p) != 2 or len(q) != 2 or p[1] != q[1] or p[0] != pattern.shape[0] or q[0] != pattern.shape[1]:
        raise ShapeError(f"op 'sddmm': needs P [{pattern.shape[0]}, F] and Q [{pattern.shape[1]}, F] for "
                         f"a {pattern.shape} pattern, got {p} and {q}")
    return (pattern.nnz,), promote(*dtypes)


def _segment(op, shapes, dtypes, attrs):
    pattern = attrs["pattern"]
    _check_pattern_values(op, shapes[0], pattern)
    return (pattern.shape[0],), dtypes[0]


_RULES: dict[Op, Callable[..., Spec]] = {
    **{op: _unary for op in UNARY - {Op.CAST}},
    Op.CAST: _cast,
    **{op: _binary for op in BINARY},
    **{op: _compare for op in COMPARE},
    Op.WHERE: _where,
    Op.SUM: _reduce, Op.MAX: _reduce,
    Op.RESHAPE: _reshape, Op.PERMUTE: _permute, Op.EXPAND: _expand,
    Op.GETITEM: _getitem, Op.INDEX_ADD: _index_add, Op.CONCAT: _concat,
    Op.MATMUL: _matmul, Op.ADDMM: _addmm, Op.ADDCMUL: _addcmul, Op.CROSS_ENTROPY: _cross_entropy,
    Op.SOFT_CROSS_ENTROPY: _soft_cross_entropy,
    Op.SPMM: _spmm, Op.SDDMM: _sddmm, Op.SEGMENT_SUM: _segment, Op.SEGMENT_MAX: _segment,
}


def infer(op: Op, shapes: tuple[Shape, ...], dtypes: tuple[np.dtype, ...], attrs: dict) -> Spec:
    """(output shape, output dtype) of ``op`` on operands of these shapes/dtypes; raises on misuse."""
    return _RULES[op](op, shapes, dtypes, attrs)

