"""LayerNorm (node mode) and BatchNorm1d at inputs whose variance overflows (round 8).

Before: ``sum((x - mean)**2)`` overflowed to ``inf`` past ``|x| ~ 1e154`` (float64) / ``~1e19``
(float32) and the layer returned a silent 0 -- as PyTorch 2.13's own kernels do (or NaN,
depending on the row length: ``F.layer_norm`` of ``linspace(-1e200, 1e200, 8)`` is NaN, of 33
entries 0).  Now each slice whose ``max |x - mean|`` passes a bound is divided by it first, so
the answer is the normalised input; below the bound the scale is exactly 1 and the old bits
(values and gradients) are kept, checked here with generated inputs against the old formula.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.nn.norm import _overflow_bound

from tests.helpers import assert_bitwise


def _old_layer_norm(x: pg.Tensor, eps: float) -> pg.Tensor:
    centered = x - x.mean(-1, keepdims=True)
    return centered / ((centered * centered).mean(-1, keepdims=True) + eps) ** 0.5


def _old_batch_norm(x: pg.Tensor, eps: float) -> pg.Tensor:
    centered = x - x.mean(0)
    return centered / ((centered * centered).mean(0) + eps) ** 0.5


def _outcome(fn: Any, arr: np.ndarray) -> list:
    x = pg.tensor(arr, requires_grad=True)
    with np.errstate(all="ignore"):
        out = fn(x)
        w = np.linspace(0.5, 1.5, out.numel).reshape(out.shape).astype(arr.dtype)
        (out * pg.tensor(w)).sum().backward()
    return [out.numpy().copy(), str(out.dtype), list(out.shape), x.grad.numpy().copy()]


@st.composite
def _below_the_bound(draw: Any) -> np.ndarray:
    """[n, c] arrays whose |x - mean| stays within the bound (specials included: a NaN or an
    infinity makes every ``x - mean`` of its slice NaN, which keeps the scale at 1 too)."""
    n, c = draw(st.integers(2, 5)), draw(st.integers(1, 5))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    limit = _overflow_bound(dtype) / 2
    value = (st.floats(-limit, limit, width=64 if dtype == np.float64 else 32)
             | st.sampled_from([0.0, -0.0, 1e-30, np.nan, np.inf, -np.inf]))
    arr = np.asarray(draw(st.lists(value, min_size=n * c, max_size=n * c)), dtype=dtype).reshape(n, c)
    return np.asfortranarray(arr) if draw(st.booleans()) else arr


@settings(max_examples=150, deadline=None)
@given(arr=_below_the_bound(), eps=st.sampled_from([1e-5, 0.0, 1.0]))
def test_below_the_bound_the_old_bits_are_kept(arr: np.ndarray, eps: float) -> None:
    node = nn.LayerNorm(arr.shape[1], eps=eps, mode="node", affine=False, dtype=arr.dtype)
    assert_bitwise(_outcome(node, arr), _outcome(lambda x: _old_layer_norm(x, eps), arr))
    batch = nn.BatchNorm1d(arr.shape[1], eps=eps, affine=False, track_running_stats=False, dtype=arr.dtype)
    assert_bitwise(_outcome(batch, arr), _outcome(lambda x: _old_batch_norm(x, eps), arr))


@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e160), (np.float64, 1e300), (np.float64, -3e307),
                                          (np.float32, 1e20), (np.float32, 3e37)])
@pytest.mark.parametrize("backend", ["numpy", "scalar"])
def test_huge_inputs_are_normalised_not_zeroed(dtype: Any, scale: float, backend: str) -> None:
    """LayerNorm(s * z) = LayerNorm_{eps=0}(z) and its gradient is that gradient / s."""
    z = np.array([[-1.0, 0.25, 0.5, 2.0, -0.75], [3.0, -2.0, 0.0, 1.0, 1.5]], dtype=dtype)
    weights = np.arange(10.0).reshape(2, 5).astype(dtype)
    rtol = 1e-12 if dtype == np.float64 else 2e-6

    def run(layer: Any, arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = pg.tensor(arr, requires_grad=True, backend=backend)
        out = layer(x)
        (out * pg.tensor(weights if out.shape == weights.shape else weights.T, backend=backend)).sum().backward()
        return out.numpy(), x.grad.numpy()

    big, z = (z * scale).astype(dtype), z * np.sign(scale)  # LayerNorm(s * z) = LayerNorm(sign(s) * z)

    def node(e: float) -> Any:
        return nn.LayerNorm(5, eps=e, mode="node", affine=False, dtype=dtype, backend=backend)

    def batch(e: float) -> Any:
        return nn.BatchNorm1d(2, eps=e, affine=False, dtype=dtype, backend=backend)

    for make, arr, ref_arr in ((node, big, z), (batch, big.T.copy(), z.T.copy())):
        out, grad = run(make(1e-5), arr)
        want_out, want_grad = run(make(0.0), ref_arr)
        assert np.all(np.isfinite(out)) and np.abs(out).max() > 0.5
        np.testing.assert_allclose(out, want_out, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(grad * abs(scale), want_grad, rtol=10 * rtol, atol=10 * rtol)


def test_batch_norm_running_variance_past_the_float_range_is_inf() -> None:
    """The running variance is the batch's true (unbiased) one: past the float range it is inf,
    as PyTorch's; the training output is still the normalised batch."""
    bn = nn.BatchNorm1d(1, momentum=1.0, dtype=np.float64)
    out = bn(pg.tensor(np.array([[1e200], [-1e200]])))
    np.testing.assert_allclose(out.numpy().ravel(), [1.0, -1.0], rtol=1e-12)
    assert bn.running_var.numpy().tolist() == [np.inf]
    bn = nn.BatchNorm1d(1, momentum=1.0, dtype=np.float64)
    bn(pg.tensor(np.array([[1e100], [-1e100]])))  # below the range: the variance as before
    np.testing.assert_allclose(bn.running_var.numpy(), [2e200], rtol=1e-12)


def test_an_empty_axis_still_normalises_to_an_empty_result() -> None:
    with np.errstate(all="ignore"):
        assert nn.LayerNorm(0, mode="node")(pg.tensor(np.zeros((3, 0), np.float32))).shape == (3, 0)
        layer = nn.BatchNorm1d(4, track_running_stats=False).eval()
        assert layer(pg.tensor(np.zeros((0, 4), np.float32))).shape == (0, 4)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float64, np.float32]))
def test_any_huge_slice_is_normalised_like_its_float64_reference(data: Any, dtype: Any) -> None:
    """Generated rows of huge magnitude (some slices big, others ordinary): each comes out as
    the normalised row computed in float64 from the unscaled pattern."""
    n, c = data.draw(st.integers(2, 4)), data.draw(st.integers(2, 6))
    pattern = np.asarray(data.draw(st.lists(st.floats(-4, 4), min_size=n * c, max_size=n * c))).reshape(n, c)
    pattern[:, 0] += 8.0  # each row has a spread (its normalised value is well defined)
    top = 300 if dtype == np.float64 else 36  # (the row's sum, for its mean, must stay finite)
    exponents = np.asarray(data.draw(st.lists(st.integers(0, top), min_size=n, max_size=n)), dtype=np.float64)
    arr = (pattern * 10.0 ** exponents[:, None]).astype(dtype)
    with np.errstate(all="ignore"):
        out = nn.LayerNorm(c, eps=0.0, mode="node", affine=False, dtype=dtype)(pg.tensor(arr)).numpy()
    ref = arr.astype(np.float64) / 10.0 ** exponents[:, None]  # the pattern as stored, scaled back exactly enough
    ref = (ref - ref.mean(-1, keepdims=True)) / ref.std(-1, keepdims=True)
    tol = 1e-9 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
