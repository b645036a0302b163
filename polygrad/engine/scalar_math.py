"""IEEE-754 semantics for Python float math (what numpy gives): the one place they are defined.

Python's arithmetic raises where numpy returns inf/nan (exp overflow, log(0), 1/0, 0 ** -1) or goes
complex (a negative base to a fractional power).  :class:`polygrad.Value` (and so the scalar
backend, the fallback and the reference) uses these so that it agrees with the vectorised
backends.  Each function tries the plain Python operation first: the exceptional path costs
nothing until it is taken, which keeps ``Value`` fast.
"""
from __future__ import annotations

import math
from typing import Any

inf = math.inf
nan = math.nan
_exp = math.exp
_log = math.log
_copysign = math.copysign

tanh = math.tanh  # never raises: -1 .. 1, nan stays nan


def _is_odd_integer(c: Any) -> bool:
    try:
        f = float(c)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(f) and f.is_integer() and int(f) % 2 == 1


def pow_special(x: Any, c: Any) -> float:
    """IEEE pow for the cases where ``x ** c`` raised (0 ** negative, overflow)."""
    negative = _copysign(1.0, x) < 0.0
    return -inf if (negative and _is_odd_integer(c)) else inf


def pow(x: Any, c: Any) -> Any:  # noqa: A001 - mirrors math.pow
    """``x ** c`` with IEEE results instead of exceptions or complex numbers (ints stay ints)."""
    try:
        r = x ** c
    except (ZeroDivisionError, OverflowError):
        return pow_special(x, c)
    if r.__class__ is complex:
        return nan
    return r


def div(a: Any, b: Any) -> Any:
    """``a / b`` with IEEE results on division by zero."""
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return nan
        return _copysign(inf, a) * _copysign(1.0, b)


def reciprocal(x: Any) -> Any:
    return div(1.0, x)


def exp(x: Any) -> float:
    try:
        return _exp(x)
    except OverflowError:
        return inf


def expm1(x: Any) -> float:
    try:
        return math.expm1(x)
    except OverflowError:
        return inf


def log(x: Any) -> float:
    try:
        return _log(x)
    except ValueError:
        return -inf if x == 0 else nan


def sigmoid(x: Any) -> float:
    if x >= 0:
        return 1.0 / (1.0 + _exp(-x))
    e = exp(x)          # x < 0 or NaN: exp cannot overflow (NaN stays NaN)
    return e / (1.0 + e)
