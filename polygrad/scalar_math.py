"""IEEE-754 semantics for Python float math (what numpy gives), shared by Value and the reference.

Python's ``math`` raises where numpy returns inf/nan (exp overflow, log(0), 1/0, pow of a negative
base): the scalar reference must agree with the vectorised backends, so it uses these.
"""
from __future__ import annotations

import math

inf = math.inf
nan = math.nan


def exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return inf


def log(x: float) -> float:
    if x > 0:
        return math.log(x)
    if x == 0:
        return -inf
    return nan  # negative or nan


def tanh(x: float) -> float:
    return math.tanh(x)


def reciprocal(x: float) -> float:
    if x == 0:
        return math.copysign(inf, x)
    return 1.0 / x


def div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or a != a:
            return nan
        return math.copysign(inf, a) * math.copysign(1.0, b)
    return a / b


def pow(a: float, b: float) -> float:  # noqa: A001 - mirrors math.pow
    try:
        r = a ** b
    except ZeroDivisionError:  # 0 ** negative
        return inf if not (float(b).is_integer() and int(b) % 2 and math.copysign(1.0, a) < 0) else -inf
    except OverflowError:
        return inf if a > 0 or float(b).is_integer() and int(b) % 2 == 0 else -inf
    if isinstance(r, complex):  # negative base, fractional exponent
        return nan
    return float(r)


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
