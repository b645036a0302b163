"""Every primitive op's gradient vs central differences (float64), on the scalar and numpy backends,
and the forward vs numpy computing the same math directly."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.sparse.pattern import Pattern
from polygrad.tensor import sddmm as T_sddmm, segment_sum as T_segment_sum, spmm as T_spmm
from tests.helpers import analytic_grads, numerical_grads

rng = np.random.default_rng(0)


def away_from_zero(*shape):
    x = rng.uniform(0.2, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return x


def positive(*shape):
    return rng.uniform(0.3, 2.0, size=shape)


def small_pattern():
    # 3 x 4 with an empty row and an empty column
    indptr = np.array([0, 2, 2, 4])
    cols = np.array([0, 2, 1, 2])
    return Pattern((3, 4), indptr, cols, "csr")


PATTERN = small_pattern()

# name -> (function of tensors, numpy reference of the forward, input arrays)
CASES = {
    "neg": (lambda x: -x, lambda x: -x, [away_from_zero(2, 3)]),
    "exp": (lambda x: x.exp(), np.exp, [away_from_zero(2, 3)]),
    "log": (lambda x: x.log(), np.log, [positive(3, 2)]),
    "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0), [away_from_zero(4)]),
    "tanh": (lambda x: x.tanh(), np.tanh, [away_from_zero(2, 2)]),
    "reciprocal": (lambda x: x.reciprocal(), lambda x: 1 / x, [away_from_zero(3)]),
    "add_broadcast": (lambda a, b: a + b, lambda a, b: a + b, [away_from_zero(2, 3), away_from_zero(3)]),
    "mul_broadcast": (lambda a, b: a * b, lambda a, b: a * b, [away_from_zero(2, 1), away_from_zero(1, 3)]),
    "pow": (lambda a, b: a ** b, np.power, [positive(2, 3), away_from_zero(2, 3)]),
    "pow_number": (lambda a: a ** 3, lambda a: a ** 3, [away_from_zero(4)]),
    "maximum": (lambda a, b: pg.maximum(a, b), np.maximum, [away_from_zero(3, 2), away_from_zero(3, 2)]),
    "where": (lambda a, b: pg.where(a > b, a, b * 2), lambda a, b: np.where(a > b, a, b * 2),
              [away_from_zero(5), away_from_zero(5)]),
    "sum_axis": (lambda x: x.sum(axis=1), lambda x: x.sum(axis=1), [away_from_zero(2, 3, 2)]),
    "sum_keepdims": (lambda x: x.sum(axis=(0, 2), keepdims=True), lambda x: x.sum(axis=(0, 2), keepdims=True),
                     [away_from_zero(2, 3, 2)]),
    "sum_all": (lambda x: x.sum(), np.sum, [away_from_zero(2, 3)]),
    "max_axis": (lambda x: x.max(axis=0), lambda x: x.max(axis=0), [away_from_zero(3, 4)]),
    "reshape": (lambda x: x.reshape(3, 2) * 2, lambda x: x.reshape(3, 2) * 2, [away_from_zero(2, 3)]),
    "permute": (lambda x: x.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1), [away_from_zero(2, 3, 4)]),
    "expand": (lambda x: x.expand(3, 2, 4), lambda x: np.broadcast_to(x, (3, 2, 4)), [away_from_zero(2, 1)]),
    "getitem_basic": (lambda x: x[1:, ::2], lambda x: x[1:, ::2], [away_from_zero(3, 4)]),
    "getitem_gather_rows": (lambda x: x[np.array([2, 0, 2, 1])], lambda x: x[np.array([2, 0, 2, 1])],
                            [away_from_zero(3, 2)]),
    "getitem_pairs": (lambda x: x[np.array([0, 1, 1]), np.array([2, 0, 0])],
                      lambda x: x[np.array([0, 1, 1]), np.array([2, 0, 0])], [away_from_zero(2, 3)]),
    "index_add": (lambda s: pg.index_add(s, np.array([1, 1, 3]), (4, 2)),
                  lambda s: np.add.at(z := np.zeros((4, 2)), np.array([1, 1, 3]), s) or z,
                  [away_from_zero(3, 2)]),
    "concat": (lambda a, b: pg.concat([a, b], axis=1), lambda a, b: np.concatenate([a, b], 1),
               [away_from_zero(2, 2), away_from_zero(2, 3)]),
    "stack": (lambda a, b: pg.stack([a, b], axis=0), lambda a, b: np.stack([a, b]),
              [away_from_zero(3), away_from_zero(3)]),
    "matmul": (lambda a, b: a @ b, np.matmul, [away_from_zero(2, 3), away_from_zero(3, 4)]),
    "matmul_batched": (lambda a, b: a @ b, np.matmul, [away_from_zero(2, 2, 3), away_from_zero(3, 2)]),
    "matmul_vec": (lambda a, b: a @ b, np.matmul, [away_from_zero(3), away_from_zero(3, 2)]),
    "matmul_matvec": (lambda a, b: a @ b, np.matmul, [away_from_zero(2, 3), away_from_zero(3)]),
    "spmm": (lambda v, x: T_spmm(v, x, PATTERN),
             lambda v, x: _dense(v) @ x, [away_from_zero(4), away_from_zero(4, 2)]),
    "spmm_vec": (lambda v, x: T_spmm(v, x, PATTERN),
                 lambda v, x: _dense(v) @ x, [away_from_zero(4), away_from_zero(4)]),
    "sddmm": (lambda p, q: T_sddmm(p, q, PATTERN),
              lambda p, q: (p @ q.T)[PATTERN.rows, PATTERN.cols], [away_from_zero(3, 2), away_from_zero(4, 2)]),
    "segment_sum": (lambda v: T_segment_sum(v, PATTERN),
                    lambda v: _dense(v).sum(axis=1), [away_from_zero(4)]),
}


def _dense(v):
    d = np.zeros(PATTERN.shape)
    d[PATTERN.rows, PATTERN.cols] = v
    return d


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradient(name, backend):
    f, ref, arrays = CASES[name]
    weights = np.random.default_rng(1).uniform(0.5, 1.5, size=np.shape(ref(*[a.copy() for a in arrays])))
    out, grads = analytic_grads(f, arrays, backend, weights)
    np.testing.assert_allclose(out, ref(*[a.copy() for a in arrays]), rtol=1e-6, atol=1e-12)
    expected = numerical_grads(f, arrays, backend, weights)
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(CASES))
def test_scalar_and_numpy_agree(name):
    f, _, arrays = CASES[name]
    out_s, grads_s = analytic_grads(f, arrays, "scalar")
    out_n, grads_n = analytic_grads(f, arrays, "numpy")
    np.testing.assert_allclose(out_n, out_s, rtol=1e-12, atol=1e-12)
    for gs, gn in zip(grads_s, grads_n):
        np.testing.assert_allclose(gn, gs, rtol=1e-10, atol=1e-12)


def test_relu_subgradient_at_zero_is_zero(backend):
    x = pg.tensor([-1.0, 0.0, 2.0], dtype=pg.float64, requires_grad=True, backend=backend)
    x.relu().sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0]


def test_ties_split_the_gradient(backend):
    a = pg.tensor([1.0, 2.0], dtype=pg.float64, requires_grad=True, backend=backend)
    b = pg.tensor([1.0, 3.0], dtype=pg.float64, requires_grad=True, backend=backend)
    pg.maximum(a, b).sum().backward()
    assert a.grad.tolist() == [0.5, 0.0] and b.grad.tolist() == [0.5, 1.0]
    x = pg.tensor([[2.0, 2.0, 2.0, 1.0]], dtype=pg.float64, requires_grad=True, backend=backend)
    x.max(axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1 / 3, 1 / 3, 1 / 3, 0.0]])


def test_comparisons_carry_no_gradient(backend):
    x = pg.tensor([1.0, -2.0], requires_grad=True, backend=backend)
    mask = x > 0
    assert mask.dtype == pg.bool_ and not mask.requires_grad
    assert mask.tolist() == [True, False]


def test_cast_passes_the_gradient_through_in_the_input_dtype(backend):
    x = pg.tensor([1.5, -2.0], dtype=pg.float64, requires_grad=True, backend=backend)
    y = x.cast(pg.float32)
    assert y.dtype == pg.float32
    (y * pg.tensor([2.0, 3.0], backend=backend)).sum().backward()
    assert x.grad.dtype == pg.float64 and x.grad.tolist() == [2.0, 3.0]
    i = x.cast(pg.int64)
    assert i.tolist() == [1, -2] and not i.requires_grad
