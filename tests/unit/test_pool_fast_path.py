"""global_add_pool / global_mean_pool over a sorted batch (one SpMM with the pooling matrix)
against the scatter they replace, with hypothesis-generated batches; gradients numerically."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg
from polygrad.errors import SparseIndexError
from polygrad.sparse.graph_ops import scatter
from polygrad.nn import global_add_pool, global_max_pool, global_mean_pool
from polygrad.testing import check_grads


@st.composite
def sorted_batches(draw):
    counts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=8))  # empty graphs included
    batch = np.repeat(np.arange(len(counts)), counts).astype(np.int64)
    width = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31))
    x = np.random.default_rng(seed).normal(size=(batch.shape[0], width))
    extra = draw(st.integers(0, 2))  # size beyond the last graph: trailing empty graphs
    return x, batch, len(counts) + extra


@settings(max_examples=60, deadline=None)
@given(sorted_batches(), st.sampled_from([np.float64, np.float32]))
def test_sorted_pool_equals_scatter(case, dtype):
    x, batch, size = case
    for pool, reduce in ((global_add_pool, "sum"), (global_mean_pool, "mean")):
        a = pg.tensor(x.astype(dtype), requires_grad=True)
        b = pg.tensor(x.astype(dtype), requires_grad=True)
        fast = pool(a, batch, size)
        slow = scatter(b, batch, size, reduce)
        assert fast.shape == slow.shape
        if reduce == "sum" and dtype == np.float64:  # both add each graph's rows in node order: the same bits
            np.testing.assert_array_equal(fast.numpy(), slow.numpy())
        else:  # float32: the scatter accumulates in float64; mean: scaled before (fast) or after (slow)
            np.testing.assert_allclose(fast.numpy(), slow.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-14,
                                       atol=1e-5 if dtype == np.float32 else 1e-14)
        w = np.random.default_rng(0).normal(size=fast.shape).astype(dtype)
        (fast * pg.tensor(w)).sum().backward()
        (slow * pg.tensor(w)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-14,
                                   atol=1e-6 if dtype == np.float32 else 1e-15)


def test_unsorted_batch_still_pools():
    x = np.arange(8.0).reshape(4, 2)
    batch = np.array([1, 0, 1, 0])
    np.testing.assert_array_equal(global_add_pool(pg.tensor(x), batch).numpy(), [[8.0, 10.0], [4.0, 6.0]])
    np.testing.assert_array_equal(global_mean_pool(pg.tensor(x), batch).numpy(), [[4.0, 5.0], [2.0, 3.0]])


def test_pool_gradients_numerically():
    batch = np.array([0, 0, 1, 1, 1, 3])
    x = np.random.default_rng(1).normal(size=(6, 3))
    for pool in (global_add_pool, global_mean_pool, global_max_pool):
        check_grads(lambda t, pool=pool: pool(t, batch, 4), [x])


def test_bad_batch_vectors_are_named():
    x = pg.tensor(np.ones((3, 2)))
    for pool in (global_add_pool, global_mean_pool, global_max_pool):
        with pytest.raises(SparseIndexError, match="is negative"):
            pool(x, np.array([0, -1, 1]))
        with pytest.raises(SparseIndexError, match="integer"):
            pool(x, np.array([0.0, 1.0, 1.0]))
    with pytest.raises(SparseIndexError, match="size is 1"):
        global_add_pool(x, np.array([0, 0, 1]), size=1)
