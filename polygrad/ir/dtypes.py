"""Dtypes: polygrad names numpy's dtype objects, so every backend speaks one vocabulary."""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError

float32 = np.dtype("float32")
float64 = np.dtype("float64")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
bool_ = np.dtype("bool")

# Like PyTorch: float32 unless asked otherwise.
default_float: np.dtype = float32

_ALIASES: dict[str, np.dtype] = {"float": float32, "double": float64, "long": int64, "int": int64, "bool": bool_}


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise a user dtype (pg.float32, np.float64, "float64", float, ...) to a numpy dtype."""
    if isinstance(dtype, str) and dtype in _ALIASES:
        return _ALIASES[dtype]
    if dtype is float:
        return float64
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError, KeyError) as exc:  # numpy rejects odd specs with any of these
        raise DTypeError(f"unknown dtype {dtype!r}") from exc
    if dt.kind not in "fiub":
        raise DTypeError(f"unsupported dtype {dt} (polygrad supports float, int and bool)")
    return dt


def is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f"


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Result dtype of an op mixing two dtypes, as PyTorch does: a float operand keeps its width
    against ints and bools (numpy would turn int64 + float32 into float64, doubling memory), and
    int64 with uint64 stays int64 (numpy: float64).  Otherwise numpy's rules."""
    if a == b:
        return a
    if a.kind == "f" and b.kind != "f":
        return a
    if b.kind == "f" and a.kind != "f":
        return b
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    result = np.promote_types(a, b)
    if result.kind == "f" and a.kind != "f":  # int64 with uint64: numpy says float64
        return int64
    return result


def needs_cast(a: np.dtype, b: np.dtype) -> bool:
    """Whether numpy-style kernels would compute a different dtype than :func:`promote` says."""
    return a != b and np.promote_types(a, b) != promote(a, b)


def infer_from_data(data: Any) -> np.dtype:
    """Dtype a Python/numpy value gets when it becomes a tensor: floats -> default_float."""
    arr = np.asarray(data)
    if arr.dtype.kind == "f":
        return arr.dtype if isinstance(data, np.ndarray) else default_float
    if arr.dtype.kind == "b":
        return bool_
    if arr.dtype.kind in "iu":
        return int64 if not isinstance(data, np.ndarray) else arr.dtype
    raise DTypeError(f"cannot make a tensor from data of dtype {arr.dtype}")
