"""Dense products on the numpy backend give the same bits at 1, 2, 3 and 7 threads.

OpenBLAS's own threads do not promise that: ``xᵀ @ g`` for a 2708 x 1433 ``x`` and a 2708 x 16
``g`` (a dense first layer's weight gradient on Cora) differs at 1 and 2 OpenBLAS threads, and
splitting a product's rows at other places than before changes the bits in ~10-25% of random
shapes (measured).  So polygrad runs BLAS on one thread and cuts large products itself, at
places that depend on the shape only (``backends/parallel.py``: ``matmul``).  The block sizes are
shrunk here so that small generated shapes are cut into several blocks.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.backends import parallel
from polygrad.ir.ops import Op
from polygrad.runtime.registry import registry
from tests.helpers import count_block_runs

THREAD_COUNTS = (1, 2, 3, 7)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the fixture patches constants only


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(parallel, "GEMM_ROWS", 8)
    monkeypatch.setattr(parallel, "GEMM_SUM_ROWS", 16)
    monkeypatch.setattr(parallel, "SPARSE_PARALLEL_MIN", 0)
    before = pg.get_num_threads()
    yield
    pg.set_num_threads(before)


def _matmul():
    return registry.get("numpy").kernels[(Op.MATMUL, "dense")]


def _at_each_count(fn) -> list[np.ndarray]:
    out = []
    for n in THREAD_COUNTS:
        pg.set_num_threads(n)
        out.append(np.array(fn()))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(m=st.integers(1, 90), k=st.integers(1, 90), n=st.integers(1, 9), transposed=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16))
def test_a_product_has_the_same_bits_at_any_thread_count(m, k, n, transposed, dtype, seed, small_blocks):
    rng = np.random.default_rng(seed)
    # transposed: the weight gradient's xᵀ @ g, a transposed view summed over its long axis
    a = rng.standard_normal((k, m)).astype(dtype).T if transposed else rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    got = _at_each_count(lambda: parallel.matmul(a, b, np.empty((m, n), dtype=dtype)))
    assert all(np.array_equal(g, got[0]) for g in got)
    np.testing.assert_allclose(got[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2708, 1433, 16), (40_000, 64, 64), (300, 70_000, 8)])
def test_the_backend_matmul_has_the_same_bits_at_any_thread_count(shape):
    """At the real block sizes: a Cora-sized weight gradient, a tall product, a long reduction."""
    rows, cols, out = shape
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    g = rng.standard_normal((rows, out)).astype(np.float32)
    w = rng.standard_normal((cols, out)).astype(np.float32)
    before = pg.get_num_threads()
    try:
        for fn in (lambda: _matmul()(x.T, g), lambda: _matmul()(x, w)):
            got = _at_each_count(fn)
            assert all(np.array_equal(r, got[0]) for r in got)
    finally:
        pg.set_num_threads(before)


def test_a_tall_product_is_cut_into_blocks_and_a_long_reduction_into_partial_sums(small_blocks, monkeypatch):
    calls = count_block_runs(monkeypatch, parallel)
    pg.set_num_threads(2)
    a = np.ones((40, 3), dtype=np.float32)
    parallel.matmul(a, np.ones((3, 2), dtype=np.float32), np.empty((40, 2), dtype=np.float32))
    parallel.matmul(a.T, np.ones((40, 2), dtype=np.float32), np.empty((3, 2), dtype=np.float32))
    assert calls == [5, 3]  # 40 rows in blocks of 8; the 40-long sum in chunks of 16
