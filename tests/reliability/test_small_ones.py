"""Class 6: tensors pickle; the scalar and numpy backends agree on integer overflow."""
from __future__ import annotations

import copy
import multiprocessing
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
import polygrad.nn as nn


# -- pickling --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "uint8"])
def test_dense_tensor_round_trip(backend, dtype):
    t = pg.tensor(np.arange(6).reshape(2, 3).astype(dtype), backend=backend)
    u = pickle.loads(pickle.dumps(t))
    assert u.backend == backend and u.dtype == t.dtype and u.shape == t.shape
    np.testing.assert_array_equal(u.numpy(), t.numpy())


def test_requires_grad_grad_and_name_survive():
    t = pg.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    t.name = "w"
    (t * t).sum().backward()
    u = pickle.loads(pickle.dumps(t))
    assert u.requires_grad and u.is_leaf and u.name == "w"
    assert u.grad.numpy().tolist() == [2.0, 4.0]
    (u * 3).sum().backward()               # a working leaf, independent of t
    assert u.grad.numpy().tolist() == [5.0, 7.0] and t.grad.numpy().tolist() == [2.0, 4.0]


def test_non_leaf_pickles_as_a_leaf():
    x = pg.tensor([1.0], requires_grad=True)
    y = x * 2
    z = pickle.loads(pickle.dumps(y))
    assert z.is_leaf and z.requires_grad and z.numpy().tolist() == [2.0]


def test_zero_d_and_empty_tensors():
    for t in (pg.tensor(3.5), pg.zeros(0, 4)):
        u = pickle.loads(pickle.dumps(t))
        assert u.shape == t.shape


@pytest.mark.parametrize("layout", ["csr", "coo"])
def test_sparse_round_trip(layout):
    s = pg.sparse_coo(np.array([[0, 2, 1], [1, 0, 2]]), np.array([1.0, 2.0, 3.0]), (3, 3),
                      requires_grad=True, layout=layout)
    (s @ pg.ones(3, 2, dtype="float64")).sum().backward()
    u = pickle.loads(pickle.dumps(s))
    assert u.layout == layout and u.requires_grad
    np.testing.assert_array_equal(u.to_dense().numpy(), s.to_dense().numpy())
    np.testing.assert_array_equal(u.grad.to_dense().numpy(), s.grad.to_dense().numpy())


def test_deepcopy_and_module_pickle():
    pg.manual_seed(0)
    model = nn.MLP(2, [4, 1])
    clone = pickle.loads(pickle.dumps(model))
    x = pg.randn(5, 2)
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())
    deep = copy.deepcopy(model)
    for p, q in zip(model.parameters(), deep.parameters()):
        assert p is not q and np.array_equal(p.numpy(), q.numpy())
        q.numpy()[...] = 0.0                 # the copy owns its storage
    assert any(p.numpy().any() for p in model.parameters())


def _square_sum(t):
    return float((t * t).sum().item())


def test_tensors_cross_process_boundaries():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.map(_square_sum, [pg.tensor([1.0, 2.0]), pg.tensor([3.0])])
    assert got == [5.0, 9.0]


# -- integer overflow: scalar and numpy agree (both wrap, two's complement) -------------------------

INT_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "neg": lambda a, b: -a, "abs": lambda a, b: a.abs(), "sum": lambda a, b: (a * b).sum(),
    "maximum": lambda a, b: a.maximum(b), "matmul": lambda a, b: a.reshape(1, -1) @ b.reshape(-1, 1),
}


def _both(fn, a, b, dtype):
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for be in ("numpy", "scalar"):
            x = pg.tensor(np.array(a, dtype=dtype), backend=be)
            y = pg.tensor(np.array(b, dtype=dtype), backend=be)
            r = fn(x, y)
            out[be] = (r.numpy().tolist(), r.dtype)
    return out


@pytest.mark.parametrize("op", list(INT_OPS))
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_extremes_agree(op, dtype):
    info = np.iinfo(dtype)
    vals = [int(info.min), int(info.max), int(info.max) // 2 + 1, 0, 1][: 5]
    other = [int(info.max), int(info.max), 3, int(info.min), int(info.max)]
    got = _both(INT_OPS[op], vals, other, dtype)
    assert got["numpy"] == got["scalar"], got


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["int8", "int32", "int64", "uint8"]), st.sampled_from(list(INT_OPS)), st.data())
def test_random_integers_agree(dtype, op, data):
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    a = data.draw(st.lists(ints, min_size=1, max_size=4))
    b = data.draw(st.lists(ints, min_size=len(a), max_size=len(a)))
    got = _both(INT_OPS[op], a, b, dtype)
    assert got["numpy"] == got["scalar"], got


@pytest.mark.parametrize("target", ["int8", "int32", "int64", "uint8", "uint64"])
def test_casts_out_of_range_agree(target):
    """Float -> int casts out of range (numpy's platform result) and int -> narrower int (wraps)."""
    floats = [1e20, -1e20, 3e9, 300.0, -1.5, np.nan, np.inf]
    ints = [2 ** 40 + 7, -(2 ** 40) - 3, 255, -129]
    got = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for be in ("numpy", "scalar"):
            got[be] = (pg.tensor(floats, dtype="float64", backend=be).cast(target).numpy().tolist(),
                       pg.tensor(ints, dtype="int64", backend=be).cast(target).numpy().tolist())
    assert got["numpy"] == got["scalar"], got
