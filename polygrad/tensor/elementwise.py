"""Elementwise arithmetic and comparisons (add, mul, sub, div, pow, maximum, minimum, abs, clip,
where, sigmoid): primitives through ``apply``, composites written with them so their gradients
come from the gradient table."""
from __future__ import annotations

from numbers import Number
from typing import Any

import numpy as np

from ..engine.dispatch import apply
from ..ir.dtypes import bool_, default_float, int64
from ..ir.errors import DTypeError, ShapeError
from ..ir.ops import Op
from ..engine.inference import broadcast_shapes
from ..runtime.registry import registry

from .args import Tensor, _floating
from .sparse_routing import _sparse_binary, is_sparse
from .creation import tensor, tensor_from_numpy


# -- operand handling ---------------------------------------------------------------------------------

def _as_operand(x: Any, like: Tensor) -> Tensor:
    """A Python number / numpy array as a constant tensor on ``like``'s backend."""
    if isinstance(x, Tensor):
        return x
    try:  # zero-cost unless raised; an int too large for the dtype is the user's error
        tx = type(x)
        if tx is float:  # the common case first: a Python float next to a float tensor
            return _constant(x, like.dtype if like.dtype.kind == "f" else default_float, like._be)
        if tx is int and like.dtype.kind in "fi":
            return _constant(x, like.dtype, like._be)
        if isinstance(x, (bool, np.bool_)):
            dtype = bool_ if like.dtype == bool_ else like.dtype
        elif isinstance(x, (complex, np.complexfloating)):
            raise DTypeError(f"complex operand {x!r} is not supported (polygrad supports float, int and bool)")
        elif isinstance(x, Number) and not isinstance(x, (int, np.integer)):
            dtype = like.dtype if like.dtype.kind == "f" else default_float
        elif isinstance(x, (int, np.integer)):
            dtype = like.dtype if like.dtype != bool_ else int64
        else:
            try:
                arr = np.asarray(x)
            except (ValueError, TypeError) as exc:  # ragged nested lists
                raise ShapeError(f"cannot use a {type(x).__name__} as a tensor operand: {exc}") from None
            if arr.dtype == object:
                raise DTypeError(f"cannot use a {type(x).__name__} as a tensor operand")
            return tensor(arr, backend=like._be)
        return tensor_from_numpy(np.asarray(x, dtype=dtype), like._be)
    except OverflowError as exc:
        raise DTypeError(f"operand {x!r:.60} does not fit a tensor of dtype {like.dtype}: {exc}") from None


#: constant operands made from Python floats and ints, by (type, value, dtype, backend): one 0-d
#: tensor each, shared by every op that uses it -- polygrad never writes an operand's array and
#: never hands these tensors to the user -- so a step's ``1 - x``, ``0.5 * h`` or ``x.mean()`` does
#: not build its constants again on every call.  NaN and float zeros are not kept (NaN != NaN,
#: and -0.0 == 0.0 would share a key); the table is bounded (a value that changes every call).
_CONSTANTS: dict[tuple, Tensor] = {}
_MAX_CONSTANTS = 256


def _constant(x: int | float, dtype: np.dtype, be: Any) -> Tensor:
    """``x`` as a 0-d constant tensor of ``dtype`` on backend ``be`` (from :data:`_CONSTANTS`)."""
    key = (type(x), x, dtype, be)
    t = _CONSTANTS.get(key)
    if t is None:
        try:
            array = np.asarray(x, dtype=dtype)
        except OverflowError as exc:  # an int too large for the dtype is the user's error
            raise DTypeError(f"operand {x!r:.60} does not fit a tensor of dtype {dtype}: {exc}") from None
        t = Tensor._new(be.from_numpy(array), be, (), dtype)
        if x == x and (x or type(x) is int):
            if len(_CONSTANTS) >= _MAX_CONSTANTS:
                _CONSTANTS.clear()
            _CONSTANTS[key] = t
    return t


def _pair(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor):
        if not isinstance(b, Tensor):
            raise DTypeError("at least one operand must be a polygrad tensor")
        a = _as_operand(a, b)
        if a.dtype.kind == "f" and b.dtype.kind != "f":  # int tensor * 0.5 -> default float, as PyTorch
            b = b.cast(a.dtype)
    elif not isinstance(b, Tensor):
        b = _as_operand(b, a)
        if b.dtype.kind == "f" and a.dtype.kind != "f":
            a = a.cast(b.dtype)
    if getattr(a, "layout", "dense") != "dense" or getattr(b, "layout", "dense") != "dense":
        sparse = a if getattr(a, "layout", "dense") != "dense" else b
        raise ShapeError(f"this op has no sparse form: got a sparse {sparse.shape} ({sparse.layout}) operand; "
                         "apply it to the stored values (A.apply_values(fn)) or densify (A.to_dense())")
    return a, b


def add(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("add", a, b)
    a, b = _pair(a, b)
    return apply(Op.ADD, (a, b))


def mul(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("mul", a, b)
    a, b = _pair(a, b)
    return apply(Op.MUL, (a, b))


def sub(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("sub", a, b)
    a, b = _pair(a, b)
    return apply(Op.ADD, (a, apply(Op.NEG, (b,))))


def div(a, b) -> Tensor:
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("div", a, b)
    a, b = _pair(a, b)
    return apply(Op.MUL, (_floating(a), apply(Op.RECIPROCAL, (_floating(b),))))


_ADDCMUL_KEY = (Op.ADDCMUL, "dense")
_NO_KERNELS: dict = {}


def addcmul(input, tensor1, tensor2) -> Tensor:  # noqa: A002 - PyTorch's name
    """``input + tensor1 * tensor2`` (PyTorch's ``torch.addcmul`` without ``value``).  Dense floating
    tensors of one dtype whose product has the output's shape run as one op, ``Op.ADDCMUL``, on a
    backend with its kernel (the composite's bits, forward and backward); anything else runs the
    composite itself."""
    if (isinstance(input, Tensor) and isinstance(tensor1, Tensor) and isinstance(tensor2, Tensor)
            and tensor1 is not tensor2 and input.dtype.kind == "f"
            and input.dtype == tensor1.dtype == tensor2.dtype
            and not (is_sparse(input) or is_sparse(tensor1) or is_sparse(tensor2))
            and registry.tables.get(input._be.name, _NO_KERNELS).get(_ADDCMUL_KEY) is not None):
        try:
            product = broadcast_shapes(Op.ADDCMUL, tensor1.shape, tensor2.shape)
            fits = broadcast_shapes(Op.ADDCMUL, product, input.shape) == product
        except ShapeError:  # the composite names the mismatch
            fits = False
        if fits:
            return apply(Op.ADDCMUL, (input, tensor1, tensor2))
    return input + tensor1 * tensor2


def pow(a, b) -> Tensor:  # noqa: A001
    if is_sparse(a) or is_sparse(b):
        return _sparse_binary("pow", a, b)
    a, b = _pair(a, b)
    if a.dtype.kind != "f" and b.dtype.kind != "f":
        a = a.cast(default_float)
    return apply(Op.POW, (a, b))


def maximum(a, b) -> Tensor:
    a, b = _pair(a, b)
    return apply(Op.MAXIMUM, (a, b))


def minimum(a, b) -> Tensor:
    a, b = _pair(a, b)
    if a.dtype.kind != "f" and b.dtype.kind != "f":  # no gradient, and negation would wrap unsigned
        return where(a <= b, a, b)
    return -apply(Op.MAXIMUM, (-a, -b))  # -max(-a, -b): ties split the gradient as in maximum


def abs(x: Tensor) -> Tensor:  # noqa: A001 - |x| = max(x, -x); gradient 0 at 0 by the tie rule
    if x.dtype.kind in "ub":
        return x
    return maximum(x, -x)


def clip(x: Tensor, lo=None, hi=None) -> Tensor:
    """``x`` limited to ``[lo, hi]``.  As PyTorch's clamp, the gradient w.r.t. ``x`` is 1 on the
    closed interval (its bounds included), 0 outside and at NaN (which stays NaN); a tensor bound
    gets the gradient where it is the one taken."""
    # inside the bounds: x; outside: the bound; NaN: stays NaN with gradient 0 (PyTorch)
    if lo is not None:
        x = where(x >= lo, x, where(x < lo, lo, x.detach()))
    if hi is not None:
        x = where(x <= hi, x, where(x > hi, hi, x.detach()))
    return x


def _compare(op: Op, a, b) -> Tensor:
    a, b = _pair(a, b)
    return apply(op, (a, b))


def where(cond, a, b) -> Tensor:
    """Elementwise ``a if cond else b`` (cond: bool tensor or array); differentiable in a and b."""
    like = next((x for x in (a, b, cond) if isinstance(x, Tensor)), None)
    if like is None:
        raise DTypeError("where(): at least one operand must be a polygrad tensor")
    if not isinstance(cond, Tensor):
        try:
            cond = np.asarray(cond, dtype=bool)
        except (ValueError, TypeError) as exc:  # ragged nested lists
            raise ShapeError(f"where(): cannot use a {type(cond).__name__} as a condition: {exc}") from None
        cond = tensor(cond, backend=like._be)
    if not isinstance(a, Tensor):
        a = _as_operand(a, b if isinstance(b, Tensor) else like)
    if not isinstance(b, Tensor):
        b = _as_operand(b, a)
    return apply(Op.WHERE, (cond, a, b))


def sigmoid(x: Tensor) -> Tensor:
    # 1 / (1 + exp(-x)), written as 0.5 * (1 + tanh(x / 2)): never overflows, same gradient
    x = _floating(x)
    return 0.5 * (1 + (x * 0.5).tanh())
