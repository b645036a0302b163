"""Class 1b: derived data never goes stale -- copy semantics and cache keys.

Decision (docs/reliability.md): ``pg.tensor`` copies (as ``torch.tensor``); ``pg.from_numpy`` shares
(as ``torch.from_numpy``); storages shared with the user are marked, and the auto-sparsified matmul
cache re-validates content on them; ``GCNConv(cached=True)`` is keyed on the graph's content.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
import polygrad.nn as nn
from polygrad.sparse import autosparse as sparse_mod  # the module that owns the matmul cache
from polygrad.runtime.config import config


def _mostly_zero(n=200, m=300, seed=0):
    rng = np.random.default_rng(seed)
    a = np.zeros((n, m), dtype=np.float64)
    idx = rng.integers(0, n * m, size=n * m // 100)
    a.flat[idx] = rng.standard_normal(idx.size)
    return a


@pytest.fixture
def sparsify_small(monkeypatch):
    """Let the auto-sparsifier act on test-sized matrices."""
    monkeypatch.setattr(config, "sparse_min_elements", 1)


def _sparse_form_cached(t) -> bool:
    found = sparse_mod._matmul_cache.get(id(t))
    return found is not None and found[1].sparse is not None


# -- pg.tensor copies, pg.from_numpy shares ----------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda a: a, lambda a: a[:, :], lambda a: memoryview(a), lambda a: a.T.T,
], ids=["array", "view", "memoryview", "transposed-twice"])
def test_tensor_copies_the_users_memory(backend, make):
    a = np.arange(6.0).reshape(2, 3)
    t = pg.tensor(make(a), backend=backend)
    a[...] = -1.0
    assert t.numpy().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_tensor_of_tensor_copies():
    a = pg.tensor([1.0, 2.0])
    b = pg.tensor(a)
    a.numpy()[0] = 7.0
    assert b.numpy().tolist() == [1.0, 2.0]


def test_from_numpy_shares_both_ways():
    a = np.arange(4.0)
    t = pg.from_numpy(a)
    a[0] = 10.0
    assert t.numpy()[0] == 10.0
    t.numpy()[1] = 20.0
    assert a[1] == 20.0


@pytest.mark.parametrize("bad, err", [
    ([1.0, 2.0], pg.errors.DTypeError),
    (np.array(["a"]), pg.errors.DTypeError),
    (np.ones((3, 4))[:, ::2], pg.errors.ShapeError),
    (np.array([object()]), pg.errors.DTypeError),
])
def test_from_numpy_refuses_what_it_cannot_share(bad, err):
    with pytest.raises(err):
        pg.from_numpy(bad)


def test_from_numpy_on_a_non_host_backend_copies():
    a = np.arange(3.0)
    t = pg.from_numpy(a, backend="scalar")
    a[0] = 5.0
    assert t.numpy()[0] == 0.0


# -- the auto-sparsified matmul operand ---------------------------------------------------------------

WRITES = {
    "from_numpy-array": lambda A, a: a.__setitem__((slice(None), slice(0, 5)), 3.0),
    "tensor.numpy()": lambda A, a: A.numpy().__setitem__((0, 0), 9.0),
    "np.asarray(tensor)": lambda A, a: np.asarray(A).__setitem__((1, 1), -4.0),
    "view-of-numpy()": lambda A, a: A.numpy()[5:, :].__setitem__((0, 2), 7.0),
    "zero-a-nonzero": lambda A, a: A.numpy().__setitem__(np.nonzero(A.numpy()), 0.0),
    "swap-two-entries": lambda A, a: _swap(A.numpy()),
    "nan": lambda A, a: A.numpy().__setitem__((2, 2), np.nan),
}


def _swap(arr):
    nz = np.argwhere(arr != 0)[0]
    z = np.argwhere(arr == 0)[0]
    arr[tuple(z)], arr[tuple(nz)] = arr[tuple(nz)], 0.0  # same nonzero count, moved entry


@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_matmul_sees_in_place_writes(sparsify_small, write):
    a = _mostly_zero()
    A = pg.from_numpy(a) if write == "from_numpy-array" else pg.tensor(a)
    X = pg.tensor(np.random.default_rng(1).standard_normal((300, 4)))
    np.testing.assert_allclose((A @ X).numpy(), A.numpy() @ X.numpy())
    assert _sparse_form_cached(A)                        # the cache is really in play
    WRITES[write](A, a)
    want = np.asarray(A.numpy()) @ X.numpy()
    np.testing.assert_allclose((A @ X).numpy(), want, equal_nan=True)
    np.testing.assert_allclose((A @ X).numpy(), want, equal_nan=True)   # and again, from the rebuilt cache


def test_matmul_cache_after_data_assignment(sparsify_small):
    A = pg.tensor(_mostly_zero())
    X = pg.tensor(np.ones((300, 2)))
    A @ X
    A.data = pg.tensor(_mostly_zero(seed=5))
    np.testing.assert_allclose((A @ X).numpy(), A.numpy() @ X.numpy())


def test_unshared_storage_is_served_without_revalidation(sparsify_small, monkeypatch):
    """pg.tensor's storage is polygrad's alone: the cache is trusted (no O(n*m) check per call)."""
    A = pg.tensor(_mostly_zero())
    X = pg.tensor(np.ones((300, 2)))
    A @ X
    calls = []
    monkeypatch.setattr(sparse_mod, "_still_matches", lambda *a: calls.append(1) or True)
    A @ X
    assert calls == []


# -- GCNConv(cached=True) ----------------------------------------------------------------------------

def _conv_out(conv, x, ei):
    return conv(x, ei).numpy()


@pytest.mark.parametrize("as_tensor", [False, True])
def test_gcnconv_cache_follows_in_place_edits(as_tensor):
    pg.manual_seed(0)
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    x = pg.tensor(np.random.default_rng(0).standard_normal((5, 3)))
    conv = nn.GCNConv(3, 2, cached=True, dtype=x.dtype)
    graph = pg.from_numpy(ei) if as_tensor else ei
    first = _conv_out(conv, x, graph)
    ei[1, 0] = 4                                           # in place: same object, new graph
    fresh = nn.GCNConv(3, 2, cached=False, dtype=x.dtype)
    fresh.weight.data = conv.weight.detach()
    fresh.bias.data = conv.bias.detach()
    got = _conv_out(conv, x, graph)
    np.testing.assert_allclose(got, _conv_out(fresh, x, graph))
    assert not np.allclose(got, first)


def test_gcnconv_cache_is_reused_for_equal_content():
    ei = np.array([[0, 1], [1, 0]])
    conv = nn.GCNConv(2, 2, cached=True)
    x = pg.ones(2, 2)
    conv(x, ei)
    cached = conv._cache
    conv(x, ei.copy())                                     # another object, same graph: reused
    assert conv._cache is cached


def test_gcnconv_cache_follows_sparse_adjacency_value_edits():
    adj = pg.sparse_coo(np.array([[0, 1], [1, 0]]), np.array([1.0, 1.0]), (2, 2))
    conv = nn.GCNConv(2, 2, cached=True, normalize=False, dtype="float64")
    x = pg.tensor(np.eye(2))
    before = conv(x, adj).numpy()
    adj.values.numpy()[0] = 5.0
    after = conv(x, adj).numpy()
    assert not np.allclose(before, after)


# -- sparse constructors own their index arrays -------------------------------------------------------

def test_sparse_constructors_copy_indices_and_values():
    indptr, idx, v = np.array([0, 1, 2]), np.array([1, 0]), np.array([1.0, 2.0])
    a = pg.sparse_csr(indptr, idx, v, (2, 2))
    coo = np.array([[0, 1], [1, 0]])
    b = pg.sparse_coo(coo, v, (2, 2))
    ei = np.array([[0, 1], [1, 0]])
    c = pg.from_edge_index(ei, 2)
    a_t = a.T @ pg.ones(2, 1, dtype="float64")             # the cached transpose is built now
    idx[0], indptr[1], v[0], coo[0, 0], ei[1, 0] = 0, 0, 9.0, 1, 0
    want = [[0.0, 1.0], [2.0, 0.0]]
    assert a.to_dense().numpy().tolist() == want and b.to_dense().numpy().tolist() == want
    assert c.to_dense().numpy().tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert (a.T @ pg.ones(2, 1, dtype="float64")).numpy().tolist() == a_t.numpy().tolist()


def test_pattern_arrays_are_read_only():
    a = pg.sparse_coo(np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0]), (2, 2))
    for arr in (a.pattern.indptr, a.pattern.cols, a.pattern.rows):
        with pytest.raises(ValueError):
            arr[0] = 5
