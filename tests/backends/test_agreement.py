"""scalar (the reference) and numpy agree on forward and gradient for every dense primitive, on
hypothesis-generated shapes: broadcasting, size-1 and size-0 dimensions where legal."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import polygrad as pg

SETTINGS = settings(max_examples=30, deadline=None)
floats = st.floats(-3, 3, allow_nan=False, width=64)


def arrays(shape):
    return hnp.arrays(np.float64, shape, elements=floats)


def run(fn, arrs, backend):
    ts = [pg.tensor(a, backend=backend, requires_grad=True) for a in arrs]
    out = fn(*ts)
    if out.requires_grad:
        w = pg.tensor(np.linspace(0.5, 1.5, out.numel).reshape(out.shape), dtype=out.dtype, backend=backend)
        (out * w).sum().backward()
    grads = [t.grad.numpy() if t.grad is not None else np.zeros(t.shape) for t in ts]
    return out.numpy(), grads


def assert_agree(fn, arrs):
    out_s, g_s = run(fn, arrs, "scalar")
    out_n, g_n = run(fn, arrs, "numpy")
    assert out_s.shape == out_n.shape and out_s.dtype == out_n.dtype
    np.testing.assert_allclose(out_n, out_s, rtol=1e-10, atol=1e-12, equal_nan=True)
    for a, b in zip(g_n, g_s):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)


binary_ops = st.sampled_from([
    lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, lambda a, b: pg.maximum(a, b),
    lambda a, b: pg.where(a > b, a, b), lambda a, b: a / (b * b + 1), lambda a, b: (a * a + 0.5) ** b,
])
unary_ops = st.sampled_from([
    lambda x: -x, lambda x: x.exp(), lambda x: (x * x + 0.1).log(), lambda x: x.relu(), lambda x: x.tanh(),
    lambda x: (x * x + 1).reciprocal(), lambda x: x.sigmoid(), lambda x: x.abs(), lambda x: x ** 2,
])


@SETTINGS
@given(op=binary_ops, shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3,
                                                                min_side=0, max_side=3), data=st.data())
def test_binary_with_broadcasting(op, shapes, data):
    a = data.draw(arrays(shapes.input_shapes[0]))
    b = data.draw(arrays(shapes.input_shapes[1]))
    assert_agree(op, [a, b])


@SETTINGS
@given(op=unary_ops, shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3), data=st.data())
def test_unary(op, shape, data):
    assert_agree(op, [data.draw(arrays(shape))])


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3), keepdims=st.booleans(),
       reducer=st.sampled_from(["sum", "max", "mean", "softmax", "log_softmax"]), data=st.data())
def test_reductions(shape, keepdims, reducer, data):
    x = data.draw(arrays(shape))
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    if reducer in ("softmax", "log_softmax"):
        fn = (lambda t: getattr(t, reducer)(-1 if axis is None else axis))
    else:
        fn = (lambda t: getattr(t, reducer)(axis, keepdims))
    assert_agree(fn, [x])


@SETTINGS
@given(data=st.data(), n=st.integers(0, 3), k=st.integers(0, 3), m=st.integers(0, 3),
       batch=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=2))
def test_matmul(data, n, k, m, batch):
    a = data.draw(arrays(batch + (n, k)))
    b = data.draw(arrays((k, m)))
    assert_agree(lambda x, y: x @ y, [a, b])


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_movement_and_indexing(shape, data):
    x = data.draw(arrays(shape))
    perm = data.draw(st.permutations(range(len(shape))))
    rows = data.draw(hnp.arrays(np.int64, st.integers(0, 5), elements=st.integers(-shape[0], shape[0] - 1)))
    start = data.draw(st.integers(0, shape[0]))
    assert_agree(lambda t: t.permute(*perm).reshape(-1), [x])
    assert_agree(lambda t: t[rows], [x])
    assert_agree(lambda t: t[start::2], [x])
    assert_agree(lambda t: pg.concat([t, t * 2], axis=0), [x])
    assert_agree(lambda t: pg.stack([t, t], axis=-1), [x])
    assert_agree(lambda t: t.unsqueeze(0).expand((2,) + shape), [x])
