"""The parallel SpMM backward (``backends/parallel.py``: ``transposed_spmm``) reads the values as
they are at each call.  Round 5 briefly kept the values gathered into Aᵀ's order across calls,
keyed by the array's identity; an optimizer that updates the sparse values in place (or
``Tensor.update_`` with an array the user edits later) then got gradients from stale values at 2+
threads.  These tests train with in-place updates and compare every gradient, bit for bit, with
one thread and with scipy on the current values."""
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
