"""The softmax family's shift (and so cross_entropy's) against the composition it replaces, bit for bit.

The detached max shift of ``logsumexp`` / ``softmax`` / ``log_softmax`` takes the max of the
detached input (so the max records no graph node) instead of detaching the max (``logsumexp``
then replaces a non-finite max by 0, as ``torch.logsumexp``; the other two keep it, as PyTorch's
softmax kernels).  It must give the
slow composition's values and gradients exactly, non-finite rows included; the gradients also
match numerical differentiation in float64.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.tensor import reductions as R
from polygrad.tensor.elementwise import where

from tests.helpers import assert_bitwise, numerical_grads
from tests.helpers import weighted_outcome as _outcome


def _slow_shift(x: pg.Tensor, axis: Any) -> pg.Tensor:
    """The shift as it was: the max of the attached input, detached, non-finite maxima (|m| < inf
    false) replaced by 0."""
    m = R.max(x, axis, keepdims=True).detach()
    return where(m.abs() < math.inf, m, 0.0)


def _slow_row_max(x: pg.Tensor, axis: Any) -> pg.Tensor:
    """softmax's and log_softmax's shift: the max of the attached input, detached (non-finite kept,
    so a row whose max is +-inf turns NaN, as in PyTorch)."""
    return R.max(x, axis, keepdims=True).detach()


def _slow_log_softmax(x: pg.Tensor, axis: int = -1) -> pg.Tensor:
    shifted = x - _slow_row_max(x, axis)
    return shifted - R.sum(shifted.exp(), axis, keepdims=True).log()


def _slow_softmax(x: pg.Tensor, axis: int = -1) -> pg.Tensor:
    e = (x - _slow_row_max(x, axis)).exp()
    return e / R.sum(e, axis, keepdims=True)


def _slow_logsumexp(x: pg.Tensor, axis: Any = None, keepdims: bool = False) -> pg.Tensor:
    m = _slow_shift(x, axis)
    out = R.sum((x - m).exp(), axis, keepdims=True).log() + m
    if keepdims:
        return out
    return out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in _axes(axis, x.ndim)))


def _axes(axis: Any, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in (axis if isinstance(axis, tuple) else (axis,)))


def _slow_cross_entropy_mean(logits: pg.Tensor, target: np.ndarray) -> pg.Tensor:
    return (-_slow_log_softmax(logits, -1)[np.arange(target.shape[0]), target]).mean()


SPECIAL = [0.0, -0.0, 1.5, -2.25, 700.0, -700.0, 1e308, -1e308, math.inf, -math.inf, math.nan]


@st.composite
def _logits(draw: Any, allow_special: bool = True) -> np.ndarray:
    n = draw(st.integers(1, 5))
    c = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    finite = st.floats(-50, 50, width=32)
    element = st.one_of(finite, st.sampled_from(SPECIAL)) if allow_special else finite
    values = draw(st.lists(element, min_size=n * c, max_size=n * c))
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float64).reshape(n, c).astype(dtype)


@settings(max_examples=150, deadline=None)
@given(arr=_logits(), axis=st.sampled_from([0, 1, -1]))
def test_softmax_family_bits_match_the_slow_shift(arr: np.ndarray, axis: int) -> None:
    assert_bitwise(_outcome(lambda x: pg.log_softmax(x, axis), arr),
                   _outcome(lambda x: _slow_log_softmax(x, axis), arr))
    assert_bitwise(_outcome(lambda x: pg.softmax(x, axis), arr), _outcome(lambda x: _slow_softmax(x, axis), arr))
    for keep in (False, True):
        for ax in (axis, None):
            assert_bitwise(_outcome(lambda x: pg.logsumexp(x, ax, keepdims=keep), arr),
                           _outcome(lambda x: _slow_logsumexp(x, ax, keep), arr), f"axis={ax} keepdims={keep}")


@settings(max_examples=150, deadline=None)
@given(data=st.data(), arr=_logits())
def test_cross_entropy_bits_match_the_slow_log_softmax(data: Any, arr: np.ndarray) -> None:
    n, c = arr.shape
    target = np.asarray(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    fast = _outcome(lambda x: nn.cross_entropy(x, target), arr)
    assert_bitwise(fast, _outcome(lambda x: _slow_cross_entropy_mean(x, target), arr))
    assert_bitwise(_outcome(lambda x: nn.cross_entropy(x, target, reduction="sum"), arr),
                   _outcome(lambda x: (-_slow_log_softmax(x)[np.arange(n), target]).sum(), arr))


def test_cross_entropy_mean_of_no_rows_is_nan_with_a_zero_gradient() -> None:
    x = pg.tensor(np.zeros((3, 2)), requires_grad=True)
    with np.errstate(all="ignore"):
        loss = nn.cross_entropy(x, [0, 1, 0], mask=np.zeros(3, dtype=bool))
    assert math.isnan(loss.item())


def test_the_shift_records_no_graph_node_for_its_max() -> None:
    x = pg.tensor(np.array([[1.0, 2.0], [3.0, -1.0]]), requires_grad=True)
    s = R._shift(x, -1)
    assert not s.requires_grad and s.op is None


@pytest.mark.parametrize("fn", [
    lambda x: pg.log_softmax(x, -1), lambda x: pg.softmax(x, 0), lambda x: pg.logsumexp(x, 1),
    lambda x: nn.cross_entropy(x, np.array([1, 0, 2])), lambda x: nn.cross_entropy(x, [2, 2, 0], reduction="sum"),
])
def test_gradients_match_numerical_differentiation(fn: Callable) -> None:
    rng = np.random.default_rng(3)
    arr = rng.normal(size=(3, 3)) * 4
    x = pg.tensor(arr, requires_grad=True)
    out = fn(x)
    w = rng.normal(size=out.shape)
    (out * pg.tensor(w)).sum().backward()
    (num,) = numerical_grads(fn, [arr], "numpy", weights=w)
    np.testing.assert_allclose(x.grad.numpy(), num, rtol=1e-6, atol=1e-8)
