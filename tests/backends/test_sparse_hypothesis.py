"""Hypothesis-generated patterns (any shape up to 4x4, duplicates, empty rows/columns, nnz = 0):
every sparse op checked on the scalar reference against central differences and the dense
computation restricted to the pattern, and numpy checked against scalar."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import polygrad as pg
from tests.unit._sparse_helpers import analytic, check_sparse_op

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def patterns(draw, square: bool = False):
    n = draw(st.integers(1, 4))
    m = n if square else draw(st.integers(1, 4))
    k = draw(st.integers(0, 7))
    rows = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    cols = draw(st.lists(st.integers(0, m - 1), min_size=k, max_size=k))
    vals = draw(st.lists(st.floats(0.25, 2.0) | st.floats(-2.0, -0.25), min_size=k, max_size=k))
    return np.array([rows, cols], dtype=np.int64).reshape(2, k), (n, m), np.array(vals, dtype=np.float64)


def _mask(idx, shape):
    m = np.zeros(shape)
    m[idx[0], idx[1]] = 1.0
    return m


def agree(op, idx, shape, vals, extras=(), dense_op=None, **kw):
    """Scalar: numerical + dense checks.  Numpy: same forward and gradients as scalar."""
    ref = check_sparse_op(op, idx, shape, vals, extras, dense_op=dense_op, backend="scalar", **kw)
    arrays = [vals] + [np.asarray(e, dtype=np.float64) for e in extras]
    wrt = [True] * len(arrays)
    out, grads = analytic(lambda v, *xs: op(pg.sparse_coo(idx, v, shape), *xs), arrays, "numpy", wrt)
    got = out.to_dense().numpy() if pg.is_sparse(out) else out.numpy()
    np.testing.assert_allclose(got, ref["out"], rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref["grads"]):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-11)


@SETTINGS
@given(p=patterns(), f=st.integers(1, 3), data=st.data())
def test_spmm_both_directions(p, f, data):
    idx, shape, vals = p
    x = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=shape[1] * f, max_size=shape[1] * f)))
    agree(lambda a, x: a @ x, idx, shape, vals, [x.reshape(shape[1], f)], dense_op=lambda d, x: d @ x)
    y = np.linspace(-1, 1, f * shape[0]).reshape(f, shape[0])
    agree(lambda a, y: y @ a, idx, shape, vals, [y], dense_op=lambda d, y: y @ d)


@SETTINGS
@given(p=patterns(), q=st.data(), which=st.sampled_from(["add", "mul", "sub"]))
def test_binary_with_another_pattern(p, q, which):
    idx, shape, vals = p
    k = q.draw(st.integers(0, 6))
    idx_b = np.array([q.draw(st.lists(st.integers(0, shape[0] - 1), min_size=k, max_size=k)),
                      q.draw(st.lists(st.integers(0, shape[1] - 1), min_size=k, max_size=k))],
                     dtype=np.int64).reshape(2, k)
    vb = np.linspace(-1.5, 1.7, k)
    fns = {"add": (lambda a, b: a + b), "mul": (lambda a, b: a * b), "sub": (lambda a, b: a - b)}
    fn = fns[which]
    agree(lambda a, v: fn(a, pg.sparse_coo(idx_b, v, shape)), idx, shape, vals, [vb],
          dense_op=lambda d, v: fn(d, pg.index_add(v, (idx_b[0], idx_b[1]), shape)))


@SETTINGS
@given(p=patterns(), axis=st.sampled_from([None, 0, 1]),
       unary=st.sampled_from(["T", "exp", "tanh", "scale", "softmax", "dense"]))
def test_reductions_and_unary(p, axis, unary):
    idx, shape, vals = p
    agree(lambda a: a.sum(axis), idx, shape, vals, dense_op=lambda d: d.sum(axis))
    mask = _mask(idx, shape)
    if unary == "T":
        agree(lambda a: a.T, idx, shape, vals, dense_op=lambda d: d.T)
    elif unary == "exp":
        agree(lambda a: a.exp(), idx, shape, vals, dense_op=lambda d: d.exp())
    elif unary == "tanh":
        agree(lambda a: a.tanh() * 2.0, idx, shape, vals, dense_op=lambda d: d.tanh() * 2.0)
    elif unary == "scale":
        r = np.linspace(0.5, 1.5, shape[0])
        agree(lambda a, r: pg.scale_rows(a, r), idx, shape, vals, [r], dense_op=lambda d, r: d * r.reshape(-1, 1))
    elif unary == "softmax":
        def dense(d):
            e = d.exp() * mask
            s = e.sum(1, keepdims=True)
            return e / (s + (s == 0).cast(s.dtype))
        agree(lambda a: a.row_softmax(), idx, shape, vals, dense_op=dense)
    else:
        agree(lambda a: a.to_dense(), idx, shape, vals, dense_op=lambda d: d * 1.0)


@SETTINGS
@given(p=patterns(square=True))
def test_gcn_norm_and_self_loops(p):
    idx, shape, vals = p
    vals = np.abs(vals)  # positive weights: positive degrees
    n = shape[0]
    missing = np.diag((np.diag(_mask(idx, shape)) == 0).astype(np.float64))

    def dense(d):
        d2 = d + pg.tensor(missing, backend=d.backend)
        dinv = d2.sum(1) ** -0.5
        return d2 * dinv.reshape(n, 1) * dinv.reshape(1, n)

    agree(lambda a: pg.gcn_norm(a), idx, shape, vals, dense_op=dense)
    agree(lambda a: pg.add_self_loops(a, 2.0), idx, shape, vals,
          dense_op=lambda d: d + 2.0 * pg.tensor(np.eye(n), backend=d.backend))


@SETTINGS
@given(p=patterns(), data=st.data())
def test_sparse_at_sparse(p, data):
    idx, shape, vals = p
    m2 = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(0, 5))
    idx_b = np.array([data.draw(st.lists(st.integers(0, shape[1] - 1), min_size=k, max_size=k)),
                      data.draw(st.lists(st.integers(0, m2 - 1), min_size=k, max_size=k))],
                     dtype=np.int64).reshape(2, k)
    vb = np.linspace(-1, 2, k)
    agree(lambda a, v: a @ pg.sparse_coo(idx_b, v, (shape[1], m2)), idx, shape, vals, [vb],
          dense_op=lambda d, v: d @ pg.index_add(v, (idx_b[0], idx_b[1]), (shape[1], m2)))
