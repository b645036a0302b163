"""The graph layers' caches keep a digest, not a copy, of a large graph, and still never serve a
stale structure: every in-place edit of an ``edge_index``, an ``edge_weight`` or a sparse
adjacency's values is seen, between calls and between forward and backward.

The size from which a key holds a digest is set to zero here (``digest_everything``), and the
digest's leaves to a few bytes, so that small generated graphs take the digest path with a
many-leaf hash tree; ``ArrayDigest`` itself is checked against byte equality.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import polygrad as pg
from polygrad import nn
from polygrad.nn import graph_cache
from polygrad.runtime import digest
from polygrad.runtime.digest import ArrayDigest

THREAD_COUNTS = (1, 2, 3, 7)
#: the fixture only patches constants, the same for every generated input
FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@pytest.fixture
def digest_everything(monkeypatch):
    monkeypatch.setattr(graph_cache, "DIGEST_FROM_BYTES", 0)
    monkeypatch.setattr(digest, "BLOCK_BYTES", 24)  # 3 int64 per leaf: many leaves, handed to threads
    before = pg.get_num_threads()
    yield
    pg.set_num_threads(before)


@st.composite
def _edge_index(draw, min_edges=0):
    n = draw(st.integers(1, 8))
    e = draw(st.integers(min_edges, 25))
    ends = st.lists(st.integers(0, n - 1), min_size=e, max_size=e)
    return np.array([draw(ends), draw(ends)], dtype=np.int64).reshape(2, e), n


_edits = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 7)), min_size=1, max_size=3)


def _edit(ei: np.ndarray, n: int, edits) -> None:
    for row, col, node in edits:
        if ei.shape[1]:
            ei[row, col % ei.shape[1]] = node % n  # in place: the same array object


def _no_array_in(key: tuple) -> bool:
    return not any(isinstance(x, np.ndarray) for x in key)


# -- the digest -------------------------------------------------------------------------------------

_arrays = hnp.arrays(st.sampled_from([np.int64, np.int32, np.float32, np.float64]),
                     hnp.array_shapes(min_dims=1, max_dims=3, max_side=9),
                     elements={"allow_nan": False, "min_value": -100, "max_value": 100})


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(a=_arrays)
def test_equal_content_gives_an_equal_digest_whatever_the_memory_layout(a, digest_everything):
    d = ArrayDigest.of(a)
    assert ArrayDigest.of(a.copy()) == d
    assert ArrayDigest.of(np.asfortranarray(a)) == d             # non-contiguous when ndim > 1
    strided = np.repeat(a, 2, axis=0)[::2]                       # a strided view, same content
    assert ArrayDigest.of(strided) == d


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURE_OK)
@given(a=_arrays, where=st.integers(0, 10**6), delta=st.integers(1, 50))
def test_any_edit_changes_the_digest(a, where, delta, digest_everything):
    d = ArrayDigest.of(a)
    b = a.copy()
    flat = b.reshape(-1)
    flat[where % flat.size] += delta
    assert not np.array_equal(a, b)
    assert ArrayDigest.of(b) != d


def test_dtype_and_shape_are_part_of_the_digest(digest_everything):
    a = np.arange(12, dtype=np.int64)
    assert ArrayDigest.of(a) != ArrayDigest.of(a.astype(np.int32))
    assert ArrayDigest.of(a) != ArrayDigest.of(a.reshape(3, 4))
    assert ArrayDigest.of(a.reshape(3, 4)) != ArrayDigest.of(a.reshape(4, 3))
    assert ArrayDigest.of(np.zeros(0)) != ArrayDigest.of(np.zeros((0, 2)))


@settings(max_examples=20, deadline=None, suppress_health_check=FIXTURE_OK)
@given(a=_arrays)
def test_the_digest_does_not_depend_on_the_thread_count(a, digest_everything):
    got = set()
    for n in THREAD_COUNTS:
        pg.set_num_threads(n)
        got.add(ArrayDigest.of(a))
    assert len(got) == 1


def test_small_keys_hold_copies_and_large_ones_digests():
    small = np.zeros((2, 10), dtype=np.int64)
    large = np.zeros(graph_cache.DIGEST_FROM_BYTES // 8, dtype=np.int64)
    key = graph_cache.owned(("edge_index", small, "edge_weight", large))
    assert isinstance(key[1], np.ndarray) and not np.shares_memory(key[1], small)
    assert isinstance(key[3], ArrayDigest)
    assert graph_cache.same_fingerprint(key, ("edge_index", small, "edge_weight", large))
    large[-1] = 1
    assert not graph_cache.same_fingerprint(key, ("edge_index", small, "edge_weight", large))


# -- GCNConv's normalised adjacency --------------------------------------------------------------

def _same_adjacency(a, b) -> None:
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.to_dense().numpy(), b.to_dense().numpy())


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(graph=_edge_index(), edits=_edits, weighted=st.booleans())
def test_gcnconv_never_reuses_an_adjacency_after_an_in_place_edit(graph, edits, weighted, digest_everything):
    ei, n = graph
    w = np.linspace(0.5, 2.0, ei.shape[1]) if weighted else None
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    first = conv.adjacency(ei, n, w)
    assert _no_array_in(conv._cache_key[0])                      # digests, not copies of the graph
    assert conv.adjacency(ei, n, w) is first                     # unchanged content: a hit
    _edit(ei, n, edits)
    if w is not None and w.size:
        w[edits[0][1] % w.size] += 1.0                           # the weights edited in place too
    fresh = nn.GCNConv(3, 2, dtype=pg.float64, cached=False).adjacency(ei.copy(), n, None if w is None else w.copy())
    _same_adjacency(conv.adjacency(ei, n, w), fresh)


def test_gcnconv_sees_a_sparse_adjacency_whose_values_are_edited_in_place(digest_everything):
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    adj = pg.from_edge_index(np.stack([ei[1], ei[0]]), num_nodes=4, dtype=pg.float64)
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    first = conv.adjacency(adj, 4).to_dense().numpy().copy()
    values = adj.values.numpy()
    assert np.shares_memory(values, adj.values.numpy())          # the storage itself, edited below
    values[0] = 5.0
    again = conv.adjacency(adj, 4).to_dense().numpy()
    fresh = nn.GCNConv(3, 2, dtype=pg.float64, cached=False).adjacency(adj, 4).to_dense().numpy()
    np.testing.assert_array_equal(again, fresh)
    assert not np.array_equal(again, first)


# -- message passing layers ---------------------------------------------------------------------

def _layer(name: str):
    pg.manual_seed(0)
    return {"gat": lambda: nn.GATConv(3, 2, heads=2, dtype=pg.float64),   # adds self loops
            "sage": lambda: nn.SAGEConv(3, 4, dtype=pg.float64),
            "sage-max": lambda: nn.SAGEConv(3, 4, aggr="max", dtype=pg.float64),  # the per-edge path
            "gin": lambda: nn.GINConv(nn.Sequential(nn.Linear(3, 4, dtype=pg.float64), nn.ReLU()))}[name]()


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(graph=_edge_index(), edits=_edits, name=st.sampled_from(["gat", "sage", "sage-max", "gin"]))
def test_a_message_passing_layer_gives_the_bits_of_a_fresh_one_after_any_edit(graph, edits, name,
                                                                             digest_everything):
    ei, n = graph
    x = pg.tensor(np.random.default_rng(0).normal(size=(n, 3)), dtype=pg.float64)
    layer = _layer(name)
    layer(x, ei)
    assert _no_array_in(layer._graphs._key[0])
    _edit(ei, n, edits)
    np.testing.assert_array_equal(layer(x, ei).numpy(), _layer(name)(x, ei.copy()).numpy())


@pytest.mark.parametrize("name", ["gat", "sage", "sage-max", "gin"])
def test_an_edit_between_forward_and_backward_leaves_the_gradient(name, digest_everything):
    ei = np.array([[0, 1, 2, 2, 3, 0, 4], [1, 0, 1, 4, 2, 2, 1]])
    x = pg.tensor(np.random.default_rng(1).normal(size=(5, 3)), dtype=pg.float64, requires_grad=True)
    _layer(name)(x, ei).sum().backward()
    want = x.grad.numpy().copy()
    x.grad = None
    out = _layer(name)(x, ei)
    ei[0, :] = 0                                  # the structure saved for backward is the graph's own
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), want)


def test_a_tensor_edge_index_edited_in_place_is_seen(digest_everything):
    ei = pg.tensor(np.array([[0, 1, 2, 3], [1, 2, 3, 0]]), dtype=pg.int64)
    x = pg.tensor(np.random.default_rng(2).normal(size=(4, 3)), dtype=pg.float64)
    layer = _layer("sage")
    before = layer(x, ei).numpy().copy()
    ei.numpy()[1, 0] = 3                          # the tensor's storage, edited in place
    assert ei.numpy()[1, 0] == 3
    after = layer(x, ei).numpy()
    np.testing.assert_array_equal(after, _layer("sage")(x, ei.numpy().copy()).numpy())
    assert not np.array_equal(before, after)
