"""Activations GNN layers reach for: leaky_relu, elu, gelu, softplus -- composites of primitives.

Each is written with ``where``/``exp``/``expm1``/``tanh``/... so its gradient comes from the
gradient table, and it runs on every backend (the scalar reference included) and through the
fallback.  Conventions at 0 follow PyTorch:

* ``leaky_relu'(0) = negative_slope`` (PyTorch takes the ``x > 0`` branch only for positive x);
* ``elu'(0) = alpha`` (the ``x <= 0`` branch, as ``torch.nn.functional.elu``), ``elu'(nan) = 1``,
  and ``elu`` is ``alpha * expm1(x)`` there (the primitive ``expm1``, accurate near 0);
* ``gelu'(0) = 0.5`` and ``softplus'(0) = 0.5`` (both smooth there).

Unused branches never poison a gradient: ``where`` routes a zero gradient into the branch it did
not pick, and ``0 * inf`` would be nan, so the exponentials are taken of clamped arguments.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.errors import DTypeError
from .tensor_class import Tensor
from .args import _floating
from .elementwise import where

__all__ = ["leaky_relu", "elu", "gelu", "softplus", "erf"]


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (``torch.nn.functional.leaky_relu``)."""
    _check_args("leaky_relu", x, negative_slope=negative_slope)
    x = _floating(x)
    return where(x > 0, x, x * negative_slope)


def _check_args(op: str, x: Any, **numbers: Any) -> None:
    """A DTypeError naming the argument when ``x`` is not a Tensor or a parameter is not a real
    number (instead of an AttributeError deep inside, or a string broadcast into the graph)."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: x must be a polygrad Tensor, got {type(x).__name__} {x!r:.60}")
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise DTypeError(f"{op}: {name} must be a real number, got {type(value).__name__} {value!r:.60}")


def _nonpositive(x: Tensor, nonpositive: Tensor) -> Tensor:
    """``x`` where ``nonpositive`` (``x <= 0``), else 0: gradient 1 at 0 (unlike ``minimum``'s tie
    split), and 0 at NaN, so a NaN never reaches the exponential of the branch it does not take."""
    return where(nonpositive, x, 0.0)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """``alpha * expm1(x)`` where ``x <= 0``, else ``x`` (``torch.nn.functional.elu``: NaN
    takes the ``x`` branch, so its gradient is 1, as PyTorch's; ``elu(-0.0)`` is -0.0).

    The value is the primitive ``expm1``'s (accurate near 0, where ``exp(x) - 1`` cancels: it
    was 0 at ``-1e-8`` in float32), the gradient ``alpha * exp(x)``, PyTorch's (``expm1``'s rule
    is ``exp(x)``, so the gradient keeps the bits it had as ``exp(x) - 1``)."""
    _check_args("elu", x, alpha=alpha)
    x = _floating(x)
    nonpositive = x <= 0
    negative_branch = _nonpositive(x, nonpositive).expm1()
    if alpha != 1.0:  # (times 1 is exact: skipping it saves a pass and changes no bit)
        negative_branch = negative_branch * alpha
    return where(nonpositive, negative_branch, x)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, linear above ``beta * x > threshold`` (as PyTorch).

    Evaluated as ``max(z, 0) + log(1 + exp(-|z|))`` with ``z = beta * x``, which never overflows;
    the ``|z|`` is built with ``where`` so the gradient at 0 is exactly 0.5 (``abs`` would split
    it).  For very negative inputs the result underflows to 0 where ``log1p`` would keep about
    ``exp(z)`` (below 1e-16 in absolute terms); the gradient stays right.
    """
    _check_args("softplus", x, beta=beta, threshold=threshold)
    x = _floating(x)
    z = x * beta if beta != 1.0 else x
    positive = z > 0
    smooth = where(positive, z, 0.0) + (where(positive, -z, z).exp() + 1.0).log()
    out = smooth * (1.0 / beta) if beta != 1.0 else smooth
    return where(z > threshold, x, out)


# erfc(|z|) ~= t * exp(-z^2 + P(t)), t = 1 / (1 + |z| / 2): Numerical Recipes' erfcc (Chebyshev
# fit), fractional error below 1.2e-7 everywhere, so the tails of gelu stay accurate too.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
                -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfc(z: Tensor) -> Tensor:
    nonneg = z >= 0
    a = where(nonneg, z, -z)  # |z| with gradient +-1 at 0 (abs would give 0 there)
    t = (a * 0.5 + 1.0).reciprocal()
    poly = t * _ERFC_COEFFS[-1]
    for c in reversed(_ERFC_COEFFS[1:-1]):
        poly = (poly + c) * t
    tail = t * (poly + _ERFC_COEFFS[0] - a * a).exp()
    return where(nonneg, tail, 2.0 - tail)


def erf(x: Tensor) -> Tensor:
    """The error function, as a composite (fractional error of ``1 - erf`` below 1.2e-7)."""
    _check_args("erf", x)
    return 1.0 - _erfc(_floating(x))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit ``x * Phi(x)`` (``torch.nn.functional.gelu``).

    ``approximate="none"`` uses ``Phi(x) = erfc(-x / sqrt 2) / 2`` through the composite erfc
    above (agrees with PyTorch's exact gelu to ~1e-7 relative); ``"tanh"`` is PyTorch's tanh
    approximation, reproduced exactly.
    """
    _check_args("gelu", x)
    x = _floating(x)
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (inner.tanh() + 1.0)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    # (x * erfc) * 0.5, the order the results have always had: halving erfc first would avoid the
    # overflow of x * erfc at |x| > ~9e307 (inf where PyTorch gives x) but changes bits in the
    # subnormal tail and, for an upstream gradient above 1, turns the gradient at huge |x| into NaN
    return x * _erfc(x * (-1.0 / math.sqrt(2.0))) * 0.5
