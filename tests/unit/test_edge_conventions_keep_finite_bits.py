"""The PyTorch edge conventions of round 7 change only non-finite (or overflowing) points.

softmax / log_softmax / cross_entropy now shift by the plain row max (a +-inf max makes the row
NaN, as in PyTorch) and elu takes NaN down its ``x`` branch (round 8 then made elu's value
``expm1``'s, keeping its gradient's bits).  For finite inputs each must give
the bits of the formula it replaced, values and gradients: checked here against those formulas,
with generated inputs in float64 and float32.  (gelu keeps its formula: halving Phi first, tried
in this round, changed bits in the subnormal tail and made the gradient at huge |x| NaN.)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.tensor import reductions as R
from polygrad.tensor.elementwise import where

from tests.helpers import assert_bitwise
from tests.helpers import weighted_outcome as _outcome


def _old_shift(x: pg.Tensor, axis: int) -> pg.Tensor:
    m = R.max(x.detach(), axis, keepdims=True)
    return where(m.abs() < math.inf, m, 0.0)


def _old_log_softmax(x: pg.Tensor, axis: int) -> pg.Tensor:
    shifted = x - _old_shift(x, axis)
    return shifted - R.sum(shifted.exp(), axis, keepdims=True).log()


def _old_softmax(x: pg.Tensor, axis: int) -> pg.Tensor:
    e = (x - _old_shift(x, axis)).exp()
    return e / R.sum(e, axis, keepdims=True)


def _old_elu(x: pg.Tensor, alpha: float) -> pg.Tensor:
    return where(x > 0, x, (where(x > 0, 0.0, x).exp() - 1.0) * alpha)


# per dtype: the range drawn, and the smallest nonzero magnitude
WIDE = {np.float64: (-1.7e308, 1.7e308, 0.0), np.float32: (-(2.0 ** 127), 2.0 ** 127, 0.0)}


@st.composite
def _finite(draw: Any, bounds: dict) -> np.ndarray:
    """A [n, c] array of finite values in [lo, hi], of magnitude 0 or at least tiny."""
    n, c = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    lo, hi, tiny = bounds[dtype]
    value = st.floats(lo, hi, width=64 if dtype == np.float64 else 32).filter(lambda v: v == 0 or abs(v) >= tiny)
    return np.asarray(draw(st.lists(value, min_size=n * c, max_size=n * c)), dtype=dtype).reshape(n, c)


@settings(max_examples=100, deadline=None)
@given(arr=_finite(WIDE), axis=st.sampled_from([0, 1]))
def test_softmax_family_keeps_its_finite_bits(arr: np.ndarray, axis: int) -> None:
    assert_bitwise(_outcome(lambda x: pg.log_softmax(x, axis), arr), _outcome(lambda x: _old_log_softmax(x, axis), arr))
    assert_bitwise(_outcome(lambda x: pg.softmax(x, axis), arr), _outcome(lambda x: _old_softmax(x, axis), arr))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), arr=_finite(WIDE))
def test_cross_entropy_keeps_its_finite_bits(data: Any, arr: np.ndarray) -> None:
    n, c = arr.shape
    target = np.asarray(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    assert_bitwise(_outcome(lambda x: pg.cross_entropy(x, target), arr),
                   _outcome(lambda x: (-_old_log_softmax(x, -1)[np.arange(n), target]).mean(), arr))


@settings(max_examples=100, deadline=None)
@given(arr=_finite(WIDE), alpha=st.sampled_from([1.0, 0.5, 2.0]))
def test_elu_keeps_its_finite_gradient_bits_and_its_value_is_expm1s(arr: np.ndarray, alpha: float) -> None:
    """Round 8 made elu's value ``alpha * expm1(x)`` (``exp(x) - 1`` cancelled near 0): the
    gradient keeps the old formula's bits, the value is within a few ulps of numpy's expm1, and
    the positive branch keeps its bits."""
    new, old = _outcome(lambda x: pg.elu(x, alpha), arr), _outcome(lambda x: _old_elu(x, alpha), arr)
    assert_bitwise(new[1:], old[1:])
    positive = arr > 0
    assert_bitwise(new[0][positive], old[0][positive])
    neg = arr[~positive]
    want = (alpha * np.expm1(neg.astype(np.float64))).astype(arr.dtype)
    got = new[0][~positive]
    assert np.all(np.signbit(got) == np.signbit(want))
    assert np.all(np.abs(got.astype(np.float64) - want) <= 6 * np.spacing(np.abs(want))), (neg, got, want)


def test_gelu_gradient_at_huge_inputs_stays_finite_for_any_upstream_gradient() -> None:
    """The review's counterexample to halving Phi first: ``g * x`` overflowed into the erfc chain,
    and inf * exp(-a**2) = inf * 0 made the gradient NaN; PyTorch gives [2, 0]."""
    for dtype, big in ((np.float64, 1e308), (np.float32, 2e38)):
        x = pg.tensor(np.array([big, -big], dtype=dtype), requires_grad=True)
        with np.errstate(all="ignore"):
            (pg.gelu(x) * 2.0).sum().backward()
        assert x.grad.numpy().tolist() == [2.0, 0.0]


def test_softmax_family_of_bool_is_promoted_as_before() -> None:
    """The plain-max shift must not leave a bool tensor to bool arithmetic (a DTypeError naming
    'neg'): bool is promoted to the default float, as the old shift's float where() did."""
    flags = np.array([[True, False], [False, False]])
    x = pg.tensor(flags)
    as_float = pg.tensor(flags.astype(np.float32))
    assert_bitwise([pg.softmax(x, -1).numpy()], [pg.softmax(as_float, -1).numpy()])
    assert_bitwise([pg.log_softmax(x, -1).numpy()], [pg.log_softmax(as_float, -1).numpy()])
