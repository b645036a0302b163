"""The parallel SpMM backward (``backends/parallel.py``: ``transposed_spmm``) reads the values as
they are at each call.  It keeps the values it gathered into Aᵀ's order for the next call, reused
only when the values hold the same bits (``_kept_transposed_values``).  A version keyed by the
array's identity served stale values after an optimizer's in-place update of the sparse values (or
``Tensor.update_`` with an array the user edits later) at 2+ threads.  These tests train with
in-place updates and compare every gradient, bit for bit, with one thread and with scipy on the
current values, and check that the kept values are used only for equal bits."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import optim
from polygrad.backends import numpy as nb
from polygrad.backends import parallel
from polygrad.sparse.pattern import Pattern

FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the fixture patches constants only


@pytest.fixture
def force_parallel(monkeypatch):
    monkeypatch.setattr(parallel, "SPARSE_PARALLEL_MIN", 0)
    before = pg.get_num_threads()
    yield
    pg.set_num_threads(before)


class InPlaceSGD(optim.SGD):
    """SGD writing into the parameter's own array (a supported ``_update`` override)."""

    def _update(self, x, g, lr, group, state, fast):
        if fast:
            x -= lr * g
            return x
        return x - lr * g


def _train(threads: int, seed: int, n: int, nnz: int, steps: int):
    pg.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.integers(0, n, nnz), rng.integers(0, n, nnz)])
    A = pg.sparse_coo(idx, rng.uniform(0.5, 1.5, nnz), (n, n), requires_grad=True)
    X = pg.tensor(rng.standard_normal((n, 4)), requires_grad=True)
    opt = InPlaceSGD([A], lr=0.05)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        X.grad = None
        ((A @ X) ** 2).sum().backward()
        # internal reads: .numpy() would mark the storage user-writable, which a values cache
        # keyed on that mark (the round-5 bug) would have honoured, hiding the staleness
        values = np.array(A.values._data, copy=True)
        dense = sp.csr_matrix((values, A.pattern.cols, A.pattern.indptr), shape=(n, n))
        want = 2 * (dense.T @ (dense @ np.array(X._data)))   # d/dX sum((AX)^2) on the values as they are now
        got = np.array(X.grad._data)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        grads.append(got.tobytes())
        opt.step()
    return grads


@settings(max_examples=20, deadline=None, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 50), nnz=st.integers(1, 400), threads=st.sampled_from([2, 3, 7]))
def test_in_place_updates_of_the_values_are_seen_by_every_backward(seed, n, nnz, threads, force_parallel):
    assert _train(threads, seed, n, nnz, 3) == _train(1, seed, n, nnz, 3)


def test_an_array_edited_between_calls_gives_the_serial_bits(force_parallel):
    rng = np.random.default_rng(3)
    pattern, _, _ = Pattern.from_coo((40, 30), rng.integers(0, 40, 300), rng.integers(0, 30, 300))
    indptr, cols = nb.sparsetools_indices(pattern)
    g = rng.standard_normal((40, 4))
    vals = rng.standard_normal(pattern.nnz)

    def backward(threads: int) -> np.ndarray:
        pg.set_num_threads(threads)
        out = np.empty((30, 4))
        parallel.transposed_spmm(pattern, indptr, cols, vals, g, out)
        return out

    for _ in range(3):
        np.testing.assert_array_equal(backward(2), backward(1))
        vals *= -1.5                                       # written in place, the same array object


def test_update_keeps_the_callers_array_as_memory_the_caller_can_write():
    """``Tensor.update_(array)`` keeps a numpy array without a copy, so caches derived from the
    storage must treat it as writable from outside, as after ``pg.from_numpy``; a copy it made
    (another dtype) is polygrad's own."""
    from polygrad.runtime import sharing

    t = pg.zeros(5, dtype=np.float64)
    mine = np.arange(5.0)
    t.update_(mine)
    assert t._data is mine and sharing.is_shared(mine)
    t.update_(np.arange(5, dtype=np.float32))                 # cast: a fresh array, not the caller's
    assert not sharing.is_shared(t._data)


def _pattern(seed: int, n: int, m: int, nnz: int) -> Pattern:
    rng = np.random.default_rng(seed)
    pattern, _, _ = Pattern.from_coo((n, m), rng.integers(0, n, nnz), rng.integers(0, m, nnz))
    return pattern


def _backward(pattern: Pattern, vals: np.ndarray, g: np.ndarray, threads: int) -> np.ndarray:
    pg.set_num_threads(threads)
    indptr, cols = nb.sparsetools_indices(pattern)
    out = np.empty((pattern.shape[1], g.shape[1]), dtype=g.dtype)
    parallel.transposed_spmm(pattern, indptr, cols, vals, g, out)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 60), m=st.integers(1, 60), nnz=st.integers(1, 400),
       threads=st.sampled_from([2, 3, 7]), dtype=st.sampled_from([np.float32, np.float64]))
def test_every_call_gives_the_serial_bits_whatever_values_came_before(seed, n, m, nnz, threads, dtype,
                                                                      force_parallel):
    pattern = _pattern(seed, n, m, nnz)
    rng = np.random.default_rng(seed + 1)
    g = rng.standard_normal((n, 3)).astype(dtype)
    first = rng.standard_normal(pattern.nnz).astype(dtype)
    other = rng.standard_normal(pattern.nnz).astype(dtype)
    signed = first.copy()
    signed[0] = -0.0 if first[0] == 0 else -first[0]          # one value differs, a sign at least
    widened = first.astype(np.float64 if dtype == np.float32 else np.float32)   # the same values, other dtype
    for vals in (first, first.copy(), other, first, signed, widened):
        got = _backward(pattern, vals, g.astype(vals.dtype), threads)
        np.testing.assert_array_equal(got, _backward(pattern, vals, g.astype(vals.dtype), 1))


def test_the_kept_values_serve_equal_bits_only(force_parallel):
    pattern = _pattern(4, 50, 40, 500)
    rng = np.random.default_rng(5)
    g = rng.standard_normal((50, 4))
    vals = rng.standard_normal(pattern.nnz)
    _backward(pattern, vals, g, 2)
    kept = parallel._kept_transposed_values(pattern, vals.copy())      # another array, the same bits
    assert kept is not None
    perm = parallel.transposed_csr(pattern, *nb.sparsetools_indices(pattern))[2]
    np.testing.assert_array_equal(kept, vals[perm])                   # the values in Aᵀ's order
    edited = vals.copy()
    edited[-1] = np.nextafter(edited[-1], np.inf)                     # one ulp
    assert parallel._kept_transposed_values(pattern, edited) is None
    zero = np.zeros(pattern.nnz)
    _backward(pattern, zero, g, 2)
    assert parallel._kept_transposed_values(pattern, -zero) is None   # -0.0 is other bits than +0.0
