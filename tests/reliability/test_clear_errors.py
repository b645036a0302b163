"""Unclear errors at the wrong moment (issue 23): a bad argument is refused where it is given, by
a polygrad error naming the function and the argument -- not an AttributeError from deep inside,
and never a silent wrong number."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.tensor import activations
from polygrad.errors import DTypeError, PolygradError, SparseIndexError
from polygrad.nn import global_add_pool, global_max_pool, global_mean_pool

X = pg.tensor(np.arange(8.0).reshape(4, 2))


@pytest.mark.parametrize("call, names", [
    (lambda: pg.leaky_relu("a"), ("leaky_relu", "x", "str")),
    (lambda: pg.leaky_relu(X, "a"), ("leaky_relu", "negative_slope", "str")),
    (lambda: pg.leaky_relu(X, None), ("leaky_relu", "negative_slope", "NoneType")),
    (lambda: pg.elu(X, "1"), ("elu", "alpha")),
    (lambda: pg.elu([1.0, -1.0]), ("elu", "x", "list")),
    (lambda: pg.softplus(X, beta="2"), ("softplus", "beta")),
    (lambda: pg.softplus(X, threshold=None), ("softplus", "threshold")),
    (lambda: pg.gelu("a"), ("gelu", "x")),
    (lambda: activations.erf(None), ("erf", "x")),
])
def test_activations_name_the_bad_argument(call, names):
    with pytest.raises(DTypeError) as info:
        call()
    for name in names:
        assert name in str(info.value)


def test_activations_still_take_numpy_scalars_and_ints():
    np.testing.assert_allclose(pg.leaky_relu(X - 4.0, np.float32(0.5)).numpy(),
                               np.where(X.numpy() > 4, X.numpy() - 4, 0.5 * (X.numpy() - 4)))
    np.testing.assert_allclose(pg.elu(X, 2).numpy(), X.numpy())


@pytest.mark.parametrize("pool", [global_add_pool, global_mean_pool, global_max_pool])
@pytest.mark.parametrize("size", [None, 3])
def test_negative_batch_id_is_refused_by_every_pool(pool, size):
    """global_add_pool used to add node 1 into the last graph (index -1), mean/max raised numpy's
    "'list' argument must have no negative elements"."""
    batch = np.array([0, -1, 1, 1])
    with pytest.raises(SparseIndexError, match=r"global_(add|mean|max)_pool.*batch\[1\] = -1"):
        pool(X, batch, size)
    with pytest.raises(SparseIndexError, match="negative"):
        pool(X, pg.tensor(batch), size)


@pytest.mark.parametrize("pool", [global_add_pool, global_mean_pool, global_max_pool])
def test_pools_accept_valid_batches_unchanged(pool):
    batch = np.array([0, 0, 2, 2])   # graph 1 has no nodes: a zero row
    out = pool(X, batch).numpy()
    assert out.shape == (3, 2) and (out[1] == 0).all()
    with pytest.raises(PolygradError):
        pool(X, np.array([0.0, 0.5, 1.0, 1.0]))   # float ids: refused (already before)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_scatter_refuses_a_negative_index_without_dim_size(reduce):
    """With no dim_size, scatter_sum(src, [0, -1, 1]) used to wrap -1 to the last row silently."""
    src = pg.ones(3, 2)
    with pytest.raises(SparseIndexError, match=r"index\[1\] = -1"):
        pg.scatter(src, [0, -1, 1], None, reduce)
    assert pg.scatter(src, [0, 2, 1], None, reduce).numpy().shape == (3, 2)
