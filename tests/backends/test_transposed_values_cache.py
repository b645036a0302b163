"""The parallel SpMM backward keeps the values it gathered into Aᵀ's order for the next call on
the same values array, and never serves them for another array, nor for an array the user can
write (``backends/parallel.py``: ``_transposed_values``).  Every call gives the serial kernel's bits."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.backends import numpy as nb
from polygrad.backends import parallel
from polygrad.runtime import sharing
from polygrad.sparse.pattern import Pattern

FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the fixture patches constants only


@pytest.fixture
def force_parallel(monkeypatch):
    monkeypatch.setattr(parallel, "SPARSE_PARALLEL_MIN", 0)
    before = pg.get_num_threads()
    yield
    pg.set_num_threads(before)


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


def _kept(pattern: Pattern):
    entry = pattern.derived(parallel._TRANSPOSED_VALUES_KEY, lambda p: {}).get("entry")
    return None if entry is None else entry[0]()


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE_OK)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 60), m=st.integers(1, 60), nnz=st.integers(1, 400),
       threads=st.sampled_from([2, 3, 7]))
def test_every_call_gives_the_serial_bits_whatever_array_came_before(seed, n, m, nnz, threads, force_parallel):
    pattern = _pattern(seed, n, m, nnz)
    rng = np.random.default_rng(seed + 1)
    g = rng.standard_normal((n, 3))
    first = rng.standard_normal(pattern.nnz)
    other = rng.standard_normal(pattern.nnz)            # another array on the same pattern
    for vals in (first, first, other, first):
        got = _backward(pattern, vals, g, threads)
        np.testing.assert_array_equal(got, _backward(pattern, vals, g, 1))
    assert _kept(pattern) is first


def test_a_values_array_the_user_can_write_is_gathered_every_call(force_parallel):
    pattern = _pattern(0, 40, 30, 300)
    rng = np.random.default_rng(1)
    g = rng.standard_normal((40, 4))
    vals = rng.standard_normal(pattern.nnz)
    sharing.mark_shared(vals)                            # as pg.from_numpy or t.numpy() would
    _backward(pattern, vals, g, 2)
    assert _kept(pattern) is None
    vals[:10] = 7.0                                      # the user writes into it
    np.testing.assert_array_equal(_backward(pattern, vals, g, 2), _backward(pattern, vals, g, 1))


def test_a_new_array_after_the_kept_one_died_is_gathered_again(force_parallel):
    pattern = _pattern(2, 50, 50, 400)
    rng = np.random.default_rng(3)
    g = rng.standard_normal((50, 2))
    _backward(pattern, rng.standard_normal(pattern.nnz), g, 2)   # kept, then unreferenced
    gc.collect()
    assert _kept(pattern) is None                        # a weak reference: dead with its array
    vals = rng.standard_normal(pattern.nnz)               # may reuse the address: not the same array
    np.testing.assert_array_equal(_backward(pattern, vals, g, 2), _backward(pattern, vals, g, 1))
