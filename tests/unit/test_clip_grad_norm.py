"""``nn.utils.clip_grad_norm_``: PyTorch's signature and semantics, one fused norm.

* the fused norm over the raw arrays (``foreach=None``/``True`` on numpy) gives the bits of the
  same computation in polygrad ops (``foreach=False``), for every ``norm_type``, dtype, and for
  sparse gradients (hypothesis-generated);
* it returns the norm before clipping as a 0-d tensor; a non-finite norm raises with
  ``error_if_nonfinite`` and otherwise scales the gradients anyway, as PyTorch does;
* against ``torch.nn.utils.clip_grad_norm_`` where torch is installed (float64, 1e-12).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.errors import NonFiniteError

NORMS = [2.0, 1.0, math.inf, -math.inf, 3.0, 0.5, -1.5]


def _params(arrays: list[np.ndarray], sparse_at: int | None = None) -> list[pg.Tensor]:
    """Leaves holding ``arrays`` as gradients (the one at ``sparse_at`` a sparse CSR gradient)."""
    out = []
    for k, a in enumerate(arrays):
        if k == sparse_at:
            dense = np.where(np.abs(a) > 0.5, a, 0).astype(a.dtype)
            p = pg.tensor(dense, layout="csr", requires_grad=True)
            p.grad = pg.tensor(dense, layout="csr")  # the same pattern, as a sparse parameter's gradient has
        else:
            p = pg.tensor(np.zeros_like(a), requires_grad=True)
            p.grad = pg.tensor(a)
        out.append(p)
    return out


def _grad_bytes(params: list[pg.Tensor]) -> list[bytes]:
    return [(p.grad.values if p.grad.layout != "dense" else p.grad).numpy().tobytes() for p in params]


shapes = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(shapes=shapes, dtype=st.sampled_from([np.float32, np.float64]), norm_type=st.sampled_from(NORMS),
       max_norm=st.floats(1e-3, 1e3), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16),
       sparse=st.booleans())
def test_the_fused_norm_gives_the_bits_of_the_tensor_ops(shapes, dtype, norm_type, max_norm, scale, seed, sparse):
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    sparse_at = next((k for k, a in enumerate(arrays) if a.ndim == 2), None) if sparse else None
    fused, ops = _params(arrays, sparse_at), _params(arrays, sparse_at)
    n_fused = nn.clip_grad_norm_(fused, max_norm, norm_type, foreach=True)
    n_ops = nn.clip_grad_norm_(ops, max_norm, norm_type, foreach=False)
    assert n_fused.shape == () and n_fused.numpy().tobytes() == n_ops.numpy().tobytes()
    assert _grad_bytes(fused) == _grad_bytes(ops)
    # and the number is the norm of the concatenated gradients
    flat = np.concatenate([(p.grad.values if p.grad.layout != "dense" else p.grad).numpy().ravel()
                           for p in _params(arrays, sparse_at)]).astype(np.float64)
    want = np.linalg.norm(flat, ord=norm_type) if flat.size else 0.0
    np.testing.assert_allclose(float(n_fused), want, rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_clips_to_max_norm_returns_the_norm_before_and_leaves_small_gradients_alone():
    a, b = _params([np.array([3.0, 0.0]), np.array([4.0])])
    norm = nn.clip_grad_norm_([a, b], 1.0)
    assert isinstance(norm, pg.Tensor) and norm.shape == () and float(norm) == 5.0
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.0], rtol=1e-6)
    before = b.grad
    assert float(nn.clip_grad_norm_([a, b], 10.0)) == pytest.approx(1.0, rel=1e-6)
    assert b.grad is before  # coefficient 1: nothing multiplied, not even by 1
    assert float(nn.clip_grad_norm_([pg.tensor([1.0], requires_grad=True)], 1.0)) == 0.0  # no gradient


def test_a_gradient_shared_by_two_parameters_is_scaled_once_for_each():
    g = pg.tensor([3.0, 4.0], dtype=pg.float64)
    a, b = (pg.tensor([0.0, 0.0], dtype=pg.float64, requires_grad=True) for _ in range(2))
    a.grad = b.grad = g
    nn.clip_grad_norm_([a, b], 1.0)
    want = np.array([3.0, 4.0]) * (1.0 / (math.sqrt(50.0) + 1e-6))  # the coefficient, once
    np.testing.assert_array_equal(a.grad.numpy(), want)
    np.testing.assert_array_equal(b.grad.numpy(), want)
    np.testing.assert_array_equal(g.numpy(), [3.0, 4.0])  # the tensor autodiff handed out is not written


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")  # inf * 0, as torch
@pytest.mark.parametrize("bad, scaled", [(np.nan, [np.nan, np.nan]), (np.inf, [np.nan, 0.0])])
def test_a_nonfinite_norm_raises_on_request_and_scales_anyway_otherwise(bad, scaled):
    (a,) = _params([np.array([bad, 1.0])])
    with pytest.raises(NonFiniteError, match="error_if_nonfinite"):
        nn.clip_grad_norm_(a, 1.0, error_if_nonfinite=True)
    assert a.grad.numpy()[1] == 1.0  # raised before touching anything
    norm = float(nn.clip_grad_norm_(a, 1.0))
    assert math.isnan(norm) if math.isnan(bad) else norm == math.inf
    np.testing.assert_array_equal(a.grad.numpy(), scaled)  # PyTorch: grad * min(max_norm / (norm + eps), 1)


def test_bad_arguments_are_named():
    (a,) = _params([np.array([1.0])])
    with pytest.raises(ValueError, match="max_norm"):
        nn.clip_grad_norm_(a, 0.0)
    for norm_type in (float("nan"), 0):
        with pytest.raises(ValueError, match="norm_type"):
            nn.clip_grad_norm_(a, 1.0, norm_type)


def test_foreach_true_needs_an_array_namespace():
    a = pg.tensor([0.0, 0.0], requires_grad=True, backend="scalar")
    a.grad = pg.tensor([3.0, 4.0], backend="scalar")
    with pytest.raises(RuntimeError, match="foreach=True"):
        nn.clip_grad_norm_(a, 1.0, foreach=True)
    norm = nn.clip_grad_norm_(a, 1.0)  # foreach=None: the tensor ops
    assert float(norm) == pytest.approx(5.0) and norm.backend == a.backend
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.8], rtol=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3.0])
def test_matches_torch(norm_type):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference here, not a polygrad dependency")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in [(4, 3), (3,), (2, 2, 2)]]
    ours = _params(arrays)
    theirs = [torch.zeros(a.shape, dtype=torch.float64, requires_grad=True) for a in arrays]
    for t, a in zip(theirs, arrays):
        t.grad = torch.tensor(a)
    got = nn.clip_grad_norm_(ours, 0.5, norm_type)
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)
