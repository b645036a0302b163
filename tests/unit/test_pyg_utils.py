"""PyG-shaped edge_index utilities, Data and transforms: hand-computed expectations, and exactly
PyG's outputs where torch_geometric is installed (generated graphs, hypothesis)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg
from polygrad.data import Data, HeteroData
from polygrad.data import transforms as T
from polygrad.data import utils as U
from polygrad.data.csr import CSRMatrix
from polygrad.errors import DataError

try:  # PyG is optional: the comparisons below skip without it
    import torch
    import torch_geometric.transforms as PT
    import torch_geometric.utils as PU
    from torch_geometric.data import Data as PData
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

needs_pyg = pytest.mark.skipif(torch is None, reason="torch / torch_geometric not installed (optional baseline)")


@st.composite
def graphs(draw, max_nodes: int = 9, max_edges: int = 24, attr_dim: int = 0):
    n = draw(st.integers(1, max_nodes))
    e = draw(st.integers(0, max_edges))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    ei = np.array([src, dst], dtype=np.int64).reshape(2, e)
    shape = (e,) if attr_dim == 0 else (e, attr_dim)
    attr = np.arange(1, e * max(attr_dim, 1) + 1, dtype=np.float64).reshape(shape) * 0.5
    return n, ei, attr


def _t(a):
    return torch.as_tensor(np.asarray(a))


def _same(ours, theirs):
    np.testing.assert_array_equal(np.asarray(ours), theirs.numpy() if hasattr(theirs, "numpy") else theirs)


# -- hand-computed ---------------------------------------------------------------------------------

def test_to_undirected_hand():
    ei = np.array([[0, 1, 1], [1, 0, 2]])
    np.testing.assert_array_equal(U.to_undirected(ei), [[0, 1, 1, 2], [1, 0, 2, 1]])
    out, w = U.to_undirected(ei, np.array([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(w, [2.0, 2.0, 1.0, 1.0])  # (0,1) given both ways: summed
    _, w = U.to_undirected(ei, np.array([1.0, 3.0, 1.0]), reduce="mean")
    np.testing.assert_array_equal(w, [2.0, 2.0, 1.0, 1.0])
    assert U.to_undirected(ei, None)[1] is None           # an edge_attr argument returns a tuple
    np.testing.assert_array_equal(U.to_undirected(ei, 4), [[0, 1, 1, 2], [1, 0, 2, 1]])  # int = num_nodes


def test_degree_and_self_loops_hand():
    np.testing.assert_array_equal(U.degree(np.array([0, 1, 0, 2, 0])), [3.0, 1.0, 1.0])
    assert U.degree(np.array([0]), 4, dtype=np.int64).tolist() == [1, 0, 0, 0]
    ei = np.array([[0, 1, 0], [1, 0, 0]])
    w = np.array([0.5, 0.5, 0.5])
    out, attr = U.add_self_loops(ei, w)
    np.testing.assert_array_equal(out, [[0, 1, 0, 0, 1], [1, 0, 0, 0, 1]])
    np.testing.assert_array_equal(attr, [0.5, 0.5, 0.5, 1.0, 1.0])
    np.testing.assert_array_equal(U.add_self_loops(ei, w, fill_value=2.0)[1], [0.5, 0.5, 0.5, 2.0, 2.0])
    np.testing.assert_array_equal(U.add_self_loops(ei, w, fill_value="add")[1], [0.5, 0.5, 0.5, 1.0, 0.5])
    out, attr = U.remove_self_loops(ei, w)
    np.testing.assert_array_equal(out, [[0, 1], [1, 0]])
    np.testing.assert_array_equal(attr, [0.5, 0.5])


def test_subgraph_and_k_hop_hand():
    ei = np.array([[0, 1, 1, 2, 2, 3, 3, 4, 4, 5], [1, 0, 2, 1, 3, 2, 4, 3, 5, 4]])
    out, attr = U.subgraph([2, 4, 5], ei, relabel_nodes=True)
    np.testing.assert_array_equal(out, [[1, 2], [2, 1]])
    assert attr is None
    subset, sub_ei, mapping, mask = U.k_hop_subgraph(3, 1, ei)  # node 3 and its in-neighbours 2, 4
    np.testing.assert_array_equal(subset, [2, 3, 4])
    np.testing.assert_array_equal(sub_ei, [[2, 3, 3, 4], [3, 2, 4, 3]])
    np.testing.assert_array_equal(mapping, [1])
    assert mask.sum() == 4


def test_bad_inputs_are_data_errors():
    with pytest.raises(DataError, match="shape"):
        U.to_undirected(np.zeros((3, 2), dtype=np.int64))
    with pytest.raises(DataError, match="one row per edge"):
        U.add_self_loops(np.array([[0], [1]]), np.ones(3))
    with pytest.raises(DataError, match="reduce"):
        U.coalesce(np.array([[0, 0], [1, 1]]), np.ones(2), reduce="median")
    with pytest.raises(DataError, match="num_hops"):
        U.k_hop_subgraph(0, 1.5, np.array([[0], [1]]))
    with pytest.raises(DataError, match="outside"):
        U.subgraph([7], np.array([[0], [1]]), num_nodes=2)


# -- against PyG -------------------------------------------------------------------------------------

@needs_pyg
@settings(max_examples=40, deadline=None)
@given(graphs(attr_dim=2), st.sampled_from(["add", "mean", "max", "min", "mul"]))
def test_to_undirected_and_coalesce_match_pyg(g, reduce):
    n, ei, attr = g
    _same(U.to_undirected(ei, num_nodes=n), PU.to_undirected(_t(ei), num_nodes=n))
    ours = U.to_undirected(ei, attr, n, reduce=reduce)
    theirs = PU.to_undirected(_t(ei), _t(attr), n, reduce=reduce)
    _same(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1].numpy(), rtol=1e-12)
    ours = U.coalesce(ei, attr, n, reduce=reduce)
    theirs = PU.coalesce(_t(ei), _t(attr), n, reduce=reduce)
    _same(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1].numpy(), rtol=1e-12)
    assert U.is_undirected(ei, n) == PU.is_undirected(_t(ei), num_nodes=n)


@needs_pyg
@settings(max_examples=40, deadline=None)
@given(graphs(), st.sampled_from([None, 2.0, "add", "mean", "max", "min"]))
def test_self_loops_and_degree_match_pyg(g, fill):
    n, ei, attr = g
    _same(U.degree(ei[1], n), PU.degree(_t(ei[1]), n))
    ours = U.add_self_loops(ei, attr, fill_value=fill, num_nodes=n)
    theirs = PU.add_self_loops(_t(ei), _t(attr), fill_value=fill, num_nodes=n)
    _same(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1].numpy(), rtol=1e-12)
    _same(U.add_self_loops(ei, num_nodes=n)[0], PU.add_self_loops(_t(ei), num_nodes=n)[0])
    ours = U.remove_self_loops(ei, attr)
    theirs = PU.remove_self_loops(_t(ei), _t(attr))
    _same(ours[0], theirs[0])
    _same(ours[1], theirs[1])


@needs_pyg
@settings(max_examples=40, deadline=None)
@given(graphs(), st.data())
def test_subgraphs_match_pyg(g, data):
    n, ei, attr = g
    subset = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    relabel = data.draw(st.booleans())
    ours = U.subgraph(subset, ei, attr, relabel_nodes=relabel, num_nodes=n, return_edge_mask=True)
    theirs = PU.subgraph(torch.tensor(subset, dtype=torch.long), _t(ei), _t(attr), relabel_nodes=relabel,
                         num_nodes=n, return_edge_mask=True)
    for a, b in zip(ours, theirs):
        _same(a, b)
    mask = np.zeros(n, dtype=bool)
    mask[subset] = True
    for a, b in zip(U.subgraph(mask, ei, relabel_nodes=relabel),
                    PU.subgraph(torch.as_tensor(mask), _t(ei), relabel_nodes=relabel)):
        if b is not None:
            _same(a, b)
    seeds = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True))
    hops = data.draw(st.integers(0, 3))
    flow = data.draw(st.sampled_from(["source_to_target", "target_to_source"]))
    directed = data.draw(st.booleans())
    ours = U.k_hop_subgraph(seeds, hops, ei, relabel_nodes=relabel, num_nodes=n, flow=flow, directed=directed)
    theirs = PU.k_hop_subgraph(torch.tensor(seeds), hops, _t(ei), relabel_nodes=relabel, num_nodes=n, flow=flow,
                               directed=directed)
    for a, b in zip(ours, theirs):
        _same(a, b)


@needs_pyg
@settings(max_examples=25, deadline=None)
@given(graphs(attr_dim=3))
def test_transforms_match_pyg(g):
    n, ei, attr = g
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 4))
    ours = T.ToUndirected()(Data(x=x, edge_index=ei, edge_attr=attr))
    theirs = PT.ToUndirected()(PData(x=_t(x), edge_index=_t(ei), edge_attr=_t(attr)))
    _same(ours.edge_index, theirs.edge_index)
    np.testing.assert_allclose(ours.edge_attr, theirs.edge_attr.numpy(), rtol=1e-12)
    ours = T.NormalizeFeatures()(Data(x=x, edge_index=ei))
    theirs = PT.NormalizeFeatures()(PData(x=_t(x), edge_index=_t(ei)))
    np.testing.assert_allclose(ours.x, theirs.x.numpy(), rtol=1e-12, atol=1e-15)


def test_normalize_features_csr_equals_dense():
    rng = np.random.default_rng(0)
    dense = (rng.random((6, 5)) < 0.4) * rng.random((6, 5))
    dense[2] = 0.0  # an empty row stays empty
    dense[3] = 0.1  # a row summing below 1 is divided by 1, as PyG
    out = T.NormalizeFeatures()(Data(x=CSRMatrix.from_dense(dense)))
    np.testing.assert_allclose(out.x.to_dense(), T.NormalizeFeatures()(Data(x=dense)).x, rtol=1e-12)


def test_transforms_leave_their_input_alone():
    x = np.array([[1.0, 3.0], [2.0, 2.0]])
    d = Data(x=x, edge_index=np.array([[0], [1]]))
    out = T.Compose([T.NormalizeFeatures(), T.ToUndirected()])(d)
    np.testing.assert_array_equal(d.x, [[1.0, 3.0], [2.0, 2.0]])
    assert d.edge_index.shape == (2, 1) and out.edge_index.shape == (2, 2)
    np.testing.assert_allclose(out.x, [[0.0, 1.0], [0.5, 0.5]])


def test_random_node_split_sizes_and_seed():
    y = np.repeat(np.arange(3), 40)
    d = Data(x=np.zeros((120, 2)), y=y)
    a = T.RandomNodeSplit(num_val=10, num_test=0.25, seed=3)(d)
    b = T.RandomNodeSplit(num_val=10, num_test=0.25, seed=3)(d)
    assert (a.val_mask.sum(), a.test_mask.sum(), a.train_mask.sum()) == (10, 30, 80)
    assert not (a.train_mask & a.val_mask).any() and not (a.val_mask & a.test_mask).any()
    np.testing.assert_array_equal(a.train_mask, b.train_mask)
    c = T.RandomNodeSplit(split="random", num_train_per_class=5, num_val=10, num_test=20, seed=0)(d)
    assert [int(c.train_mask[y == k].sum()) for k in range(3)] == [5, 5, 5]
    assert (c.val_mask.sum(), c.test_mask.sum()) == (10, 20)
    assert not (c.train_mask & (c.val_mask | c.test_mask)).any()


# -- Data / HeteroData --------------------------------------------------------------------------------

def test_data_attributes_like_pyg():
    d = Data(x=np.ones((4, 3)), edge_index=np.array([[0, 1], [1, 2]]), y=np.arange(4), foo="bar")
    assert d.num_nodes == 4 and d.num_edges == 2 and d.num_node_features == 3 and d.num_features == 3
    assert d.edge_attr is None and "foo" in d and d["foo"] == "bar"
    d.train_mask = np.array([True, False, False, True])
    assert set(d.keys()) == {"x", "edge_index", "y", "foo", "train_mask"}
    assert Data(edge_index=np.array([[0, 5], [1, 2]])).num_nodes == 6
    assert Data(edge_index=np.array([[0], [1]]), num_nodes=10).num_nodes == 10
    assert d.has_isolated_nodes() and not d.has_self_loops()
    e = copy.copy(d)
    e.x = np.zeros((4, 3))
    assert d.x.sum() == 12  # a shallow copy has its own attribute table
    assert repr(d).startswith("Data(x=[4, 3], edge_index=[2, 2]")
    with pytest.raises(DataError, match="edge_index"):
        Data(edge_index=np.array([0.5, 1.0]))
    with pytest.raises(DataError, match="outside"):
        Data(x=np.ones((2, 1)), edge_index=np.array([[0], [5]])).validate()


def test_data_copies_and_pickles():
    import pickle

    d = Data(x=np.ones((2, 2)), edge_index=np.array([[0], [1]]), num_nodes=3, note="a")
    for other in (d.clone(), pickle.loads(pickle.dumps(d))):
        assert other.num_nodes == 3 and other.note == "a"
        np.testing.assert_array_equal(other.x, d.x)
        assert other.x is not d.x


def test_data_to_backend():
    d = Data(x=np.ones((3, 2)), edge_index=np.array([[0], [1]]), y=np.arange(3),
             feat=CSRMatrix.from_dense(np.eye(3)))
    moved = d.to("numpy")
    assert isinstance(moved.x, pg.Tensor) and moved.x.backend == "numpy"
    assert isinstance(moved.edge_index, np.ndarray) and isinstance(moved.y, np.ndarray)
    np.testing.assert_array_equal(moved.feat.to_dense().numpy(), np.eye(3))
    assert isinstance(d.x, np.ndarray)  # the original is untouched


def test_hetero_data_dicts():
    h = HeteroData()
    h["paper"].x = np.ones((3, 4))
    h["author"].x = np.zeros((2, 4))
    h["author", "writes", "paper"].edge_index = np.array([[0, 1], [2, 0]])
    assert set(h.x_dict) == {"paper", "author"}
    assert list(h.edge_index_dict) == [("author", "writes", "paper")]
    assert h["author", "paper"] is h["author", "writes", "paper"]  # (src, dst) with one relation
    assert h.num_nodes == 5 and h.num_edges == 2 and h.validate()
    h["paper", "cites", "paper"].edge_index = np.array([[0], [9]])
    with pytest.raises(DataError, match="paper node 9"):
        h.validate()
    assert h.metadata() == (["paper", "author"], [("author", "writes", "paper"), ("paper", "cites", "paper")])
