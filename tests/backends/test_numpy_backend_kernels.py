"""The numpy backend's own fast paths: int32 sparsetools indices, BLAS leading-axes sums, branch-free where."""
from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad.backends.numpy as nb
from polygrad.ir.ops import Op
from polygrad.sparse.pattern import Pattern
from polygrad.runtime.registry import registry


def _kernel(op: Op, layout: str = "dense"):
    registry.load()
    return registry.tables["numpy"][(op, layout)]


def _pattern(n: int, m: int, density: float, seed: int) -> Pattern:
    rows, cols = np.nonzero(np.random.default_rng(seed).random((n, m)) < density)
    return Pattern.from_sorted((n, m), rows, cols)


def test_sparsetools_indices_are_int32_copies_made_once_per_pattern():
    p = _pattern(40, 30, 0.2, seed=0)
    indptr, cols = nb.sparsetools_indices(p)
    assert indptr.dtype == np.int32 and cols.dtype == np.int32
    np.testing.assert_array_equal(indptr, p.indptr)
    np.testing.assert_array_equal(cols, p.cols)
    again = nb.sparsetools_indices(p)
    assert again[0] is indptr and again[1] is cols          # cached: no per-call copy
    assert p.indptr.dtype == np.int64 and p.cols.dtype == np.int64  # the pattern itself is unchanged


@pytest.mark.parametrize("nnz, shape", [(nb.INT32_MAX + 1, (10, 10)), (5, (nb.INT32_MAX + 1, 3)),
                                         (5, (3, nb.INT32_MAX + 1))])
def test_sparsetools_indices_stay_int64_past_int32(nnz, shape):
    # checked on a stand-in (no 2**31-entry allocation): past int32's range the originals are used
    indptr, cols = np.zeros(4, dtype=np.int64), np.zeros(3, dtype=np.int64)
    fake = types.SimpleNamespace(nnz=nnz, shape=shape, indptr=indptr, cols=cols,
                                 derived=lambda *a: pytest.fail("converted a pattern too large for int32"))
    got = nb.sparsetools_indices(fake)
    assert got[0] is indptr and got[1] is cols


def test_sparsetools_indices_at_the_int32_boundary_convert():
    seen = []
    fake = types.SimpleNamespace(nnz=nb.INT32_MAX, shape=(nb.INT32_MAX, 1),
                                 derived=lambda key, make: seen.append(key) or ("i", "c"))
    assert nb.sparsetools_indices(fake) == ("i", "c") and seen == ["numpy.int32"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes", [((2708, 16), (0,)), ((64, 32, 8), (0, 1)), ((64, 32, 8), (0,)),
                                         ((9000, 1), (0,)), ((7, 5, 3), (0, 1)), ((1, 4), (0,))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_leading_axes_sum_matches_numpy(dtype, shape, axes, keepdims):
    x = np.random.default_rng(1).normal(size=shape).astype(dtype)
    got = _kernel(Op.SUM)(x, axes=axes, keepdims=keepdims)
    want = x.sum(axis=axes, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


@pytest.mark.parametrize("x, axes", [
    (np.arange(12.0).reshape(3, 4).T, (0,)),                 # not C-contiguous: numpy's own sum
    (np.arange(12, dtype=np.int64).reshape(3, 4), (0,)),     # integers keep numpy's exact sum
    (np.arange(12.0).reshape(3, 4), (1,)),                   # not a leading axis
    (np.arange(12.0).reshape(3, 4), (0, 1)),                 # every axis
    (np.zeros((0, 4)), (0,)),                                # empty
])
def test_leading_axes_sum_other_cases_fall_back_exactly(x, axes):
    got = _kernel(Op.SUM)(x, axes=axes, keepdims=False)
    want = x.sum(axis=axes)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_leading_axes_sum_propagates_nan_and_inf():
    x = np.zeros((3000, 3), dtype=np.float32)  # large enough for the BLAS path
    x[:3] = [[np.nan, 1.0, np.inf], [1.0, 2.0, -np.inf], [0.0, 3.0, 1.0]]
    with np.errstate(invalid="ignore"):
        got = _kernel(Op.SUM)(x, axes=(0,), keepdims=False)
    assert np.isnan(got[0]) and got[1] == 6.0 and np.isnan(got[2])


def test_bias_gradient_through_the_blas_sum_is_right():
    rng = np.random.default_rng(2)
    from polygrad.testing import check_grads
    check_grads(lambda a, b: ((a + b) * (a + b)).sum(), [rng.normal(size=(50, 3)), rng.normal(size=3)],
                backend="numpy")


@pytest.mark.parametrize("size", [nb.BRANCH_FREE_WHERE_MIN - 1, nb.BRANCH_FREE_WHERE_MIN, 43_328,
                                  nb.BRANCH_FREE_WHERE_GENERAL_MIN - 1, nb.BRANCH_FREE_WHERE_GENERAL_MIN])
def test_where_at_and_around_the_branch_free_threshold_is_np_where(size):
    rng = np.random.default_rng(3)
    a = rng.normal(size=size).astype(np.float32)
    a[::7] = -0.0
    a[::11] = np.nan
    cond = rng.random(size) < 0.5
    zero = np.zeros((), dtype=np.float32)
    for args in ((cond, zero, a), (cond, a, a[::-1].copy())):
        got, want = _kernel(Op.WHERE)(*args), np.where(*args)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.array_equal(got.view(np.int32), want.view(np.int32))  # bit for bit


def test_numpy_spmm_runs_on_the_int32_copies(monkeypatch):
    p = _pattern(30, 20, 0.2, seed=4)
    seen = []
    from polygrad.backends import parallel  # the compiled kernels are called from there

    real = parallel._sparsetools.csr_matvecs
    monkeypatch.setattr(parallel._sparsetools, "csr_matvecs",
                        lambda *a: seen.append((a[3].dtype, a[4].dtype)) or real(*a))
    values = np.random.default_rng(5).normal(size=p.nnz).astype(np.float32)
    x = np.random.default_rng(6).normal(size=(20, 4)).astype(np.float32)
    out = _kernel(Op.SPMM, "csr")(values, x, pattern=p)
    dense = np.zeros(p.shape, np.float64)
    dense[p.rows, p.cols] = values
    np.testing.assert_allclose(out, dense @ x, rtol=1e-5, atol=1e-5)
    if _kernel(Op.SPMM, "csr").__module__ == nb.__name__:  # not overridden by some plugin
        assert seen == [(np.int32, np.int32)]


@pytest.mark.parametrize("x, shape", [
    (np.asarray(1.5), (4, 3)), (np.arange(3.0), (2, 3)), (np.arange(3.0).reshape(3, 1), (3, 5)),
    (np.arange(6.0).reshape(2, 3), (2, 3)), (np.arange(6.0).reshape(2, 3), (4, 2, 3)),
    (np.arange(12.0).reshape(3, 4)[:, ::2], (2, 3, 2)),          # non-contiguous: np.broadcast_to
    (np.arange(3.0), (0, 3)), (np.ones((1, 1), dtype=np.float32), (1, 0)),
])
def test_expand_is_np_broadcast_to(x, shape):
    got, want = _kernel(Op.EXPAND)(x, shape=shape), np.broadcast_to(x, shape)
    assert got.shape == want.shape and got.dtype == want.dtype and not got.flags.writeable
    np.testing.assert_array_equal(got, want)
    assert np.shares_memory(got, x) or got.size == 0


@pytest.mark.parametrize("x, shape", [(np.arange(3.0), (2, 4)), (np.arange(6.0).reshape(2, 3), (3,)),
                                      (np.arange(6.0).reshape(2, 3), (3, 3))])
def test_expand_refuses_what_np_broadcast_to_refuses(x, shape):
    with pytest.raises(ValueError):
        _kernel(Op.EXPAND)(x, shape=shape)


@settings(max_examples=80, deadline=None)
@given(itemsize=st.sampled_from([4, 8]), rows=st.integers(1, 40), cols=st.integers(1, 9),
       broadcast=st.sampled_from(["none", "cond-row", "a-scalar", "b-column", "cond-scalar"]),
       seed=st.integers(0, 2**32 - 1), zero_a=st.booleans())
def test_branch_free_where_gives_np_wheres_bits_for_any_bit_pattern(itemsize, rows, cols, broadcast, seed, zero_a):
    """Every path of the branch-free kernel (forced on small arrays) against np.where, on random
    bit patterns: NaNs with payloads, -0.0, subnormals and infinities all included."""
    rng = np.random.default_rng(seed)
    ints, floats = np.dtype(f"i{itemsize}"), np.dtype(f"f{itemsize}")
    shape = (rows, cols)
    shapes = {"cond": shape, "a": shape, "b": shape}
    if broadcast == "cond-row":
        shapes["cond"] = (cols,)
    elif broadcast == "a-scalar":
        shapes["a"] = ()
    elif broadcast == "b-column":
        shapes["b"] = (rows, 1)
    elif broadcast == "cond-scalar":
        shapes["cond"] = ()

    def bits(s):
        return rng.integers(np.iinfo(ints).min, np.iinfo(ints).max, size=s, dtype=ints, endpoint=True)
    cond = np.asarray(rng.random(shapes["cond"]) < 0.5)
    a = np.zeros((), floats) if zero_a else bits(shapes["a"]).view(floats)
    b = bits(shapes["b"]).view(floats)
    for first, second in ((a, b), (a.view(ints), b.view(ints))):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nb, "BRANCH_FREE_WHERE_MIN", 0)
            mp.setattr(nb, "BRANCH_FREE_WHERE_GENERAL_MIN", 0)
            got = nb.branch_free_where(cond, first, second)
        want = np.where(cond, first, second)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()
