"""Loaders as PyG's: NeighborSampler batches carry x / y, refuse float ids and fan-outs (issue 23);
DataLoader reshuffles every epoch; Batch concatenates per-node labels; the link demo's CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from polygrad import data as pdata
from polygrad.apps.cli import main
from polygrad.data import Batch, Data, DataLoader, Graph, NeighborSampler
from polygrad.data.csr import CSRMatrix
from polygrad.errors import DataError
from polygrad.apps.gnn_demos import link_splits

try:
    import torch
    from torch_geometric.data import Batch as PBatch, Data as PData
except ImportError:  # pragma: no cover - depends on the environment
    torch = None


def _ring(n: int) -> np.ndarray:
    src = np.arange(n)
    return np.concatenate([np.stack([src, (src + 1) % n]), np.stack([(src + 1) % n, src])], axis=1)


@pytest.mark.parametrize("bad", [np.array([0.0, 2.7]), [1.5], np.array([[0, 1]])])
def test_neighbor_sampler_refuses_float_or_shaped_input_nodes(bad):
    with pytest.raises(DataError, match="input_nodes"):
        NeighborSampler(_ring(6), 6, [2], input_nodes=bad)


@pytest.mark.parametrize("fanouts", [[2.5], [2, 1.0], [True], [], [0], [-2], 2.5, "25"])
def test_neighbor_sampler_refuses_non_integer_fanouts(fanouts):
    with pytest.raises(DataError, match="fanouts"):
        NeighborSampler(_ring(6), 6, fanouts)


@pytest.mark.parametrize("make", [
    lambda: NeighborSampler(_ring(6), 6, [2], batch_size="8"),
    lambda: NeighborSampler(_ring(6), 6, [2], batch_size=2.0),
    lambda: DataLoader([], batch_size="8"),
])
def test_loaders_refuse_non_integer_batch_sizes(make):
    with pytest.raises(DataError, match="batch_size"):
        make()


def test_neighbor_sampler_input_nodes_are_checked_up_front():
    with pytest.raises(DataError, match="outside"):
        NeighborSampler(_ring(6), 6, [2], input_nodes=[0, 9])
    with pytest.raises(DataError, match="repeated"):
        NeighborSampler(_ring(6), 6, [2], input_nodes=[1, 1])
    with pytest.raises(DataError, match="mask"):
        NeighborSampler(_ring(6), 6, [2], input_nodes=np.ones(4, dtype=bool))
    s = NeighborSampler(_ring(6), 6, [2], input_nodes=np.array([1, 4], dtype=np.uint8))
    assert s.input_nodes.tolist() == [1, 4]


def test_neighbor_sampler_batches_carry_x_and_y():
    n = 20
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3))
    y = rng.integers(0, 4, n)
    sampler = NeighborSampler.from_data(Data(x=x, edge_index=_ring(n), y=y), [3, 2], batch_size=6, seed=0)
    for b in sampler:
        np.testing.assert_array_equal(b.x, x[b.n_id])
        np.testing.assert_array_equal(b.y, y[b.n_id])
        d = b.to_data()
        assert d.batch_size == b.batch_size and d.num_nodes == b.n_id.shape[0]
        np.testing.assert_array_equal(d.n_id[:d.batch_size], b.n_id[:b.batch_size])
    csr = CSRMatrix.from_dense(x)
    b = next(iter(NeighborSampler(_ring(n), n, [2], batch_size=4, x=csr)))
    np.testing.assert_array_equal(b.x.to_dense(), x[b.n_id])
    with pytest.raises(DataError, match="rows"):
        NeighborSampler(_ring(n), n, [2], x=x[:5])


def test_neighbor_sampler_reshuffles_every_epoch_reproducibly():
    def orders(seed):
        s = NeighborSampler(_ring(30), 30, [1], batch_size=30, seed=seed)
        return [next(iter(s)).n_id[:30].tolist() for _ in range(3)]
    a, b = orders(0), orders(0)
    assert a == b and a[0] != a[1] != a[2]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 7))
def test_data_loader_reshuffles_each_epoch_and_repeats_by_seed(seed, batch_size):
    graphs = [Graph(x=np.full((2, 1), k, dtype=np.float64), edge_index=np.array([[0], [1]]), y=k)
              for k in range(12)]

    def epochs(s):
        loader = DataLoader(graphs, batch_size=batch_size, shuffle=True, seed=s)
        return [np.concatenate([b.y for b in loader]).tolist() for _ in range(3)]
    first = epochs(seed)
    assert first == epochs(seed)                            # reproducible per seed
    assert all(sorted(e) == list(range(12)) for e in first)  # each epoch sees every graph once
    assert len({tuple(e) for e in first}) > 1               # and the order changes between epochs


def test_iterate_batches_with_one_generator_reshuffles_each_epoch():
    graphs = [Graph(x=np.ones((1, 1)), edge_index=np.zeros((2, 0), dtype=np.int64), y=k) for k in range(20)]

    def epochs(seed):
        rng = np.random.default_rng(seed)
        return [np.concatenate([b.y for b in pdata.iterate_batches(graphs, 7, shuffle=True, seed=rng)]).tolist()
                for _ in range(3)]
    first = epochs(0)
    assert first == epochs(0) and len({tuple(e) for e in first}) == 3
    same = [np.concatenate([b.y for b in pdata.iterate_batches(graphs, 7, shuffle=True, seed=0)]).tolist()
            for _ in range(2)]
    assert same[0] == same[1]  # an int seed: one fixed order (documented)


def test_batch_concatenates_per_node_labels():
    g1 = Graph(x=np.ones((3, 2)), edge_index=np.array([[0, 1], [1, 2]]), y=np.array([0, 1, 1]))
    g2 = Graph(x=np.ones((2, 2)), edge_index=np.array([[0], [1]]), y=np.array([2, 0]))
    b = Batch.from_graphs([g1, g2])
    assert b.y.tolist() == [0, 1, 1, 2, 0]
    assert b.edge_index.tolist() == [[0, 1, 3], [1, 2, 4]]
    data_batch = Batch.from_graphs([Data(x=np.ones((3, 2)), edge_index=np.array([[0], [1]]), y=np.array([[1.0]])),
                                    Data(x=np.ones((1, 2)), edge_index=np.zeros((2, 0), dtype=np.int64),
                                         y=np.array([[0.0]]))])
    assert data_batch.y.tolist() == [[1.0], [0.0]]          # graph-level [1, C] labels stack as PyG's
    scalar = Graph(x=np.ones((2, 2)), edge_index=np.array([[0], [1]]), y=1)
    with pytest.raises(DataError, match="graph 1 has a scalar y but graph 0"):
        Batch.from_graphs([g1, scalar])
    wide = Graph(x=np.ones((2, 2)), edge_index=np.array([[0], [1]]), y=np.zeros((2, 3)))
    with pytest.raises(DataError, match="only the first axis"):
        Batch.from_graphs([g1, wide])
    unlabelled = Graph(x=np.ones((2, 2)), edge_index=np.array([[0], [1]]))
    with pytest.raises(DataError, match="graph 1 has no y"):
        Batch.from_graphs([g1, unlabelled])


@pytest.mark.skipif(torch is None, reason="torch_geometric not installed (optional baseline)")
def test_batch_matches_pyg_batch():
    rng = np.random.default_rng(0)
    graphs = []
    for k in range(4):
        n = int(rng.integers(1, 6))
        ei = rng.integers(0, n, size=(2, int(rng.integers(0, 8))))
        graphs.append((rng.normal(size=(n, 3)), ei, rng.integers(0, 3, n)))
    ours = Batch.from_graphs([Graph(x=x, edge_index=e, y=y) for x, e, y in graphs])
    theirs = PBatch.from_data_list([PData(x=torch.tensor(x), edge_index=torch.tensor(e), y=torch.tensor(y))
                                    for x, e, y in graphs])
    for key in ("x", "edge_index", "y", "batch", "ptr"):
        np.testing.assert_array_equal(getattr(ours, key), getattr(theirs, key).numpy())


def test_demo_link_cli_json(capsys):
    assert main(["demo", "link", "--epochs", "3", "--no-progress", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["demo"] == "link" and 0.0 <= out["test_auc"] <= 1.0 and out["epochs"] == 3


def test_link_demo_splits_follow_pyg_recipe():
    ds = pdata.stochastic_block_model(seed=0)
    train, val, test = link_splits(ds, seed=0)
    undirected = int((ds.edge_index[0] <= ds.edge_index[1]).sum())
    assert val.edge_label.shape[0] == 2 * int(0.05 * undirected)  # positives + as many negatives
    assert (train.edge_label == 1).all()                           # no train negatives: sampled per epoch
    np.testing.assert_allclose(train.x.row_sums()[train.x.row_sums() > 0], 1.0, rtol=1e-6)
