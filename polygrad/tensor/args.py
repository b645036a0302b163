"""Argument checks shared by the tensor API (ints, shapes, dims), and ``Tensor`` as the functions
below the class know it.

The Tensor class (:mod:`polygrad.tensor.tensor_class`) sits above the functions of this package and binds
them as its methods and operators, so they cannot import it: at run time they know a tensor by the
engine's ``TensorBase`` (whose only subclass is ``Tensor``, and whose ``_new`` is ``Tensor._make``),
while type checkers see the class itself.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir.dtypes import default_float
from ..runtime import memory
from ..ir.errors import DTypeError, MemoryBudgetError, ShapeError
from ..engine.inference import check_dims


if TYPE_CHECKING:
    from .tensor_class import Tensor
else:  # see the module docstring
    from ..engine.graph import TensorBase as Tensor


def _int_arg(what: str, value: Any) -> int:
    """``value`` as an int: ints and numpy integers only (a float or a bool is a mistake, not a size)."""
    if type(value) is int:  # the common case, first (shapes in VJP rules)
        return value
    if isinstance(value, (bool, np.bool_)):
        raise DTypeError(f"{what}: expected an integer, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise DTypeError(f"{what}: expected an integer, got {type(value).__name__} {value!r:.60}") from None


def _shape_arg(shape: tuple, what: str = "shape") -> tuple:
    dims = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return tuple(_int_arg(what, s) for s in dims)


def _dim_arg(what: str, dim: Any, ndim: int) -> int:
    """One axis of a tensor of ``ndim`` dims, negative counting from the end; out of range is an error."""
    d = _int_arg(what, dim)
    if not -ndim <= d < ndim:
        raise ShapeError(f"{what}: dim {d} is out of range for a tensor of {ndim} dims")
    return d % ndim


def _alloc(what: str, shape: tuple, dtype: Any, make):
    """Run a host allocation of ``shape``/``dtype``, refusing sizes numpy or the memory budget cannot take."""
    check_dims(what, shape)
    memory.check(what, memory.nbytes(shape, dtype), what=f"a {np.dtype(dtype)} array of shape {shape}")
    try:
        return make()
    except MemoryError as exc:  # the budget is an estimate: the allocation itself may still fail
        raise MemoryBudgetError(f"{what}: cannot allocate a {np.dtype(dtype)} array of shape {shape}: {exc}") from None


def _floating(t: Tensor) -> Tensor:
    return t if t.dtype.kind == "f" else t.cast(default_float)
