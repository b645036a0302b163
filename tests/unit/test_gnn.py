"""Graph layers (MessagePassing, GATConv, SAGEConv, GINConv), pools, batching and the sampler.

Each layer: the forward against a dense numpy reference, gradients (inputs and parameters)
against central differences in float64 on numpy and on the scalar reference, numpy == scalar.
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import data as pdata
from polygrad import nn
from polygrad.errors import DataError, ShapeError, SparseIndexError
from polygrad.testing import assert_backends_agree, check_grads

BACKENDS = ["numpy", "scalar"]
# source row 0 -> destination row 1; node 3 receives nothing but its self loop (for GAT)
EDGES = np.array([[0, 1, 2, 2, 3, 0, 4], [1, 0, 1, 4, 2, 2, 1]])
N = 5


def _x(f=3, seed=0):
    return np.random.default_rng(seed).normal(size=(N, f))


def _in_adjacency(edges=EDGES, n=N):
    a = np.zeros((n, n))
    a[edges[1], edges[0]] = 1.0  # a[i, j] = 1 for an edge j -> i
    return a


# -- MessagePassing ---------------------------------------------------------------------------

class MeanConv(nn.MessagePassing):
    def __init__(self):
        super().__init__(aggr="mean")

    def forward(self, x, graph):
        return self.propagate(graph, x=x)


class GatedConv(nn.MessagePassing):
    """A message that needs both ends of each edge and the per-edge weight."""

    def __init__(self, aggr="sum"):
        super().__init__(aggr=aggr)

    def message(self, x_i, x_j, edge_weight):
        return x_j * (x_i * x_j).sum(-1, keepdims=True).sigmoid() * edge_weight.reshape(-1, 1)

    def forward(self, x, graph, edge_weight):
        return self.propagate(graph, x=x, edge_weight=edge_weight)


def test_message_passing_default_is_one_spmm_with_the_right_aggregation():
    x = _x()
    a = _in_adjacency()
    deg = np.maximum(a.sum(1, keepdims=True), 1)
    out = MeanConv()(pg.tensor(x, requires_grad=True), EDGES)
    np.testing.assert_allclose(out.numpy(), a @ x / deg, rtol=1e-12)
    assert out.op == "spmm"                                   # no per-edge tensor: one SpMM
    out = MeanConv()(pg.tensor(x), pg.from_edge_index(EDGES[::-1].copy(), N))  # rows = destinations
    np.testing.assert_allclose(out.numpy(), a @ x / deg, rtol=1e-12)


@pytest.mark.parametrize("aggr", ["sum", "mean", "max"])
def test_custom_message_matches_a_loop_reference(aggr):
    x, w = _x(), np.linspace(0.5, 2.0, EDGES.shape[1])
    out = GatedConv(aggr)(pg.tensor(x), EDGES, pg.tensor(w)).numpy()
    want = np.zeros_like(x)
    groups: dict[int, list] = {}
    for (j, i), we in zip(EDGES.T, w):
        gate = 1 / (1 + np.exp(-(x[i] * x[j]).sum()))
        groups.setdefault(i, []).append(x[j] * gate * we)
    for i, msgs in groups.items():
        want[i] = {"sum": np.sum, "mean": np.mean, "max": np.max}[aggr](msgs, axis=0)
    np.testing.assert_allclose(out, want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_message_gradients(backend):
    check_grads(lambda x, w: GatedConv("mean")(x, EDGES, w), [_x(2), np.linspace(0.5, 2.0, 7)], backend=backend)


def test_message_passing_reports_misuse():
    with pytest.raises(ValueError, match="aggr"):
        MeanConv.__mro__[1](aggr="median")
    with pytest.raises(SparseIndexError, match=r"\[2, E\]"):
        MeanConv()(pg.tensor(_x()), np.zeros((3, 4), dtype=np.int64))

    class NeedsFoo(nn.MessagePassing):
        def message(self, foo_j):
            return foo_j
    with pytest.raises(TypeError, match="foo_j"):
        NeedsFoo().propagate(EDGES, x=pg.tensor(_x()))
    with pytest.raises(ShapeError, match="edge_weight"):
        GatedConv()(pg.tensor(_x()), pg.from_edge_index(EDGES, N), pg.tensor(np.ones(3)))
    with pytest.raises(ShapeError, match="edge_index order"):
        GatedConv()(pg.tensor(_x()), EDGES, pg.tensor(np.ones(EDGES.shape[1] + 1)))


# -- GATConv ------------------------------------------------------------------------------------

def _gat_reference(x, w, att_src, att_dst, bias, heads, concat, slope=0.2):
    loops = np.arange(N)
    keep = EDGES[0] != EDGES[1]
    src = np.concatenate([EDGES[0][keep], loops])
    dst = np.concatenate([EDGES[1][keep], loops])
    h = (x @ w).reshape(N, heads, -1)
    out = np.zeros_like(h)
    for k in range(heads):
        e = (h[dst, k] * att_dst[k]).sum(1) + (h[src, k] * att_src[k]).sum(1)
        e = np.where(e > 0, e, slope * e)
        for i in range(N):
            m = dst == i
            a = np.exp(e[m] - e[m].max())
            a /= a.sum()
            out[i, k] = (a[:, None] * h[src[m], k]).sum(0)
    out = out.reshape(N, -1) if concat else out.mean(1)
    return out + bias


@pytest.mark.parametrize("concat", [True, False])
def test_gatconv_matches_a_dense_per_head_reference(concat):
    pg.manual_seed(0)
    conv = nn.GATConv(3, 2, heads=3, concat=concat, dtype=pg.float64)
    conv.bias.data = pg.tensor(np.linspace(-0.2, 0.3, conv.bias.shape[0]))
    x = _x()
    out = conv(pg.tensor(x), EDGES).numpy()
    want = _gat_reference(x, conv.weight.numpy(), conv.att_src.numpy(), conv.att_dst.numpy(),
                          conv.bias.numpy(), 3, concat)
    np.testing.assert_allclose(out, want, rtol=1e-10)
    _, (edge_index, alpha) = conv(pg.tensor(x), EDGES, return_attention_weights=True)
    assert edge_index.shape == (2, EDGES.shape[1] + N) and alpha.shape == (edge_index.shape[1], 3)
    np.testing.assert_allclose(pg.scatter(alpha, edge_index[1], N).numpy(), 1.0, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gatconv_gradients(backend):
    pg.manual_seed(1)
    conv = nn.GATConv(3, 2, heads=2, dtype=pg.float64, backend=backend)

    def fwd(x, w, a_s, a_d):
        conv.weight, conv.att_src, conv.att_dst = w, a_s, a_d
        return conv(x, EDGES)

    check_grads(fwd, [_x(), conv.weight.numpy(), conv.att_src.numpy(), conv.att_dst.numpy()], backend=backend)


def test_gatconv_agrees_across_backends_and_its_dropout_is_training_only():
    pg.manual_seed(2)
    conv = nn.GATConv(3, 2, heads=2, dtype=pg.float64)
    w = conv.weight.numpy()

    def fwd(x, w_t):
        layer = nn.GATConv(3, 2, heads=2, dtype=pg.float64, backend=x.backend)
        layer.weight, layer.att_src, layer.att_dst = w_t, *(pg.tensor(a.numpy(), backend=x.backend)
                                                              for a in (conv.att_src, conv.att_dst))
        return layer(x, EDGES)

    assert_backends_agree(fwd, [_x(), w], backends=BACKENDS, rtol=1e-9, atol=1e-12)
    drop = nn.GATConv(3, 2, heads=2, dropout=0.5, dtype=pg.float64)
    x = pg.tensor(_x())
    drop.eval()
    first = drop(x, EDGES).numpy()
    np.testing.assert_array_equal(first, drop(x, EDGES).numpy())
    drop.train()
    assert not np.allclose(first, drop(x, EDGES).numpy())


def test_gatconv_rejects_bad_input():
    with pytest.raises(ValueError, match="heads"):
        nn.GATConv(3, 2, heads=0)
    with pytest.raises(ShapeError, match=r"\[N, 3\]"):
        nn.GATConv(3, 2)(pg.tensor(_x(4)), EDGES)
    with pytest.raises(SparseIndexError, match="outside"):
        nn.GATConv(3, 2)(pg.tensor(_x()[:3]), EDGES)


# -- SAGEConv / GINConv -------------------------------------------------------------------------

@pytest.mark.parametrize("aggr", ["mean", "max", "sum"])
def test_sageconv_matches_the_reference(aggr):
    pg.manual_seed(3)
    conv = nn.SAGEConv(3, 2, aggr=aggr, dtype=pg.float64)
    x = _x()
    a = _in_adjacency()
    if aggr == "max":
        agg = np.stack([np.max(x[a[i] > 0], 0) if a[i].any() else np.zeros(3) for i in range(N)])
    else:
        agg = a @ x / (np.maximum(a.sum(1, keepdims=True), 1) if aggr == "mean" else 1)
    want = agg @ conv.lin_l.weight.numpy() + conv.lin_l.bias.numpy() + x @ conv.lin_r.weight.numpy()
    np.testing.assert_allclose(conv(pg.tensor(x), EDGES).numpy(), want, rtol=1e-10)
    no_root = nn.SAGEConv(3, 2, root_weight=False, normalize=True, dtype=pg.float64)
    out = no_root(pg.tensor(x), EDGES).numpy()
    has_input = a.any(1)  # node 3 receives nothing: without the root term its row is 0, kept 0
    np.testing.assert_allclose(np.linalg.norm(out, axis=1)[has_input], 1.0, rtol=1e-9)
    assert (out[~has_input] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_sageconv_gradients(backend, aggr):
    pg.manual_seed(4)
    conv = nn.SAGEConv(3, 2, aggr=aggr, dtype=pg.float64, backend=backend)

    def fwd(x, wl, wr):
        conv.lin_l.weight, conv.lin_r.weight = wl, wr
        return conv(x, EDGES)

    check_grads(fwd, [_x(), conv.lin_l.weight.numpy(), conv.lin_r.weight.numpy()], backend=backend)


def test_sageconv_takes_sparse_features_in_either_order():
    pg.manual_seed(5)
    x = np.where(_x(6) > 0.8, _x(6), 0.0)
    for fin, fout in ((6, 2), (6, 8)):
        conv = nn.SAGEConv(fin, fout, dtype=pg.float64)
        dense = conv(pg.tensor(x), EDGES).numpy()
        sparse = conv(pg.tensor(x).to_sparse(), EDGES).numpy()
        np.testing.assert_allclose(sparse, dense, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ginconv_values_and_gradients_including_eps(backend):
    pg.manual_seed(6)
    mlp = nn.Sequential(nn.Linear(3, 4, dtype=pg.float64, backend=backend), nn.ReLU(),
                        nn.Linear(4, 2, dtype=pg.float64, backend=backend))
    conv = nn.GINConv(mlp, eps=0.3, train_eps=True, dtype=pg.float64, backend=backend)
    assert any(p is conv.eps for p in conv.parameters())
    x = _x()
    want_in = (1.3) * x + _in_adjacency() @ x
    np.testing.assert_allclose(conv(pg.tensor(x, backend=backend), EDGES).numpy(),
                               mlp(pg.tensor(want_in, backend=backend)).numpy(), rtol=1e-10)

    def fwd(x_t, eps):
        conv.eps = eps
        return conv(x_t, EDGES)

    check_grads(fwd, [x + 0.01, np.array([0.3])], backend=backend)
    fixed = nn.GINConv(mlp, eps=0.3)
    assert not any(p is fixed.eps for p in fixed.parameters())


# -- pools and batching -------------------------------------------------------------------------

def _graphs():
    return [pdata.Graph(x=np.full((n, 2), float(n)), edge_index=np.array([[0, 1], [1, 0]]), y=n % 2)
            for n in (2, 3, 4)]


def test_collate_builds_a_block_diagonal_graph_with_a_batch_vector():
    b = pdata.collate(_graphs())
    assert b.num_graphs == 3 and b.num_nodes == 9
    np.testing.assert_array_equal(b.batch, [0, 0, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(b.ptr, [0, 2, 5, 9])
    np.testing.assert_array_equal(b.edge_index, [[0, 1, 2, 3, 5, 6], [1, 0, 3, 2, 6, 5]])
    np.testing.assert_array_equal(b.y, [0, 1, 0])
    with pytest.raises(DataError, match="features"):
        pdata.collate([_graphs()[0], pdata.Graph(x=np.ones((2, 3)), edge_index=np.zeros((2, 0), dtype=np.int64))])
    with pytest.raises(DataError, match="outside"):
        pdata.Graph(x=np.ones((2, 1)), edge_index=np.array([[0], [2]]))
    sizes = [bt.num_graphs for bt in pdata.iterate_batches(_graphs() * 3, 4, shuffle=True, seed=1)]
    assert sizes == [4, 4, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_pools(backend):
    b = pdata.collate(_graphs())
    x = np.random.default_rng(7).normal(size=(9, 2))
    for pool, red in ((nn.global_add_pool, np.sum), (nn.global_mean_pool, np.mean), (nn.global_max_pool, np.max)):
        got = pool(pg.tensor(x, backend=backend), b.batch, b.num_graphs).numpy()
        want = np.stack([red(x[b.batch == g], 0) for g in range(3)])
        np.testing.assert_allclose(got, want, rtol=1e-12)
        check_grads(lambda t, pool=pool: pool(t, b.batch, 4), [x], backend=backend)  # graph 3: empty -> 0
    np.testing.assert_allclose(nn.global_mean_pool(pg.tensor(x)).numpy(), x.mean(0, keepdims=True))


# -- sampler -------------------------------------------------------------------------------------

def _ring(n=50, k=6):
    src = np.repeat(np.arange(n), k)
    dst = (src + np.tile(np.arange(1, k + 1), n)) % n
    return np.stack([src, dst])


def test_sampler_respects_fanouts_real_edges_and_seeds_first():
    ei = _ring()
    real = set(zip(ei[0].tolist(), ei[1].tolist()))
    sampler = pdata.NeighborSampler(ei, 50, [3, 2], batch_size=8, seed=0)
    assert len(sampler) == 7
    seen_seeds = []
    for sub in sampler:
        seeds = sub.n_id[:sub.batch_size]
        seen_seeds.extend(seeds.tolist())
        assert len(set(sub.n_id.tolist())) == sub.num_nodes                    # no node twice
        glob = sub.n_id[sub.edge_index]
        assert all(e in real for e in zip(glob[0].tolist(), glob[1].tolist()))  # only real edges
        assert len(set(zip(*sub.edge_index.tolist()))) == sub.edge_index.shape[1]  # no edge twice
        into_seeds = np.bincount(sub.edge_index[1], minlength=sub.num_nodes)[:sub.batch_size]
        assert (into_seeds == 3).all()                                         # fan-out 3 (in-degree 6)
    assert sorted(seen_seeds) == list(range(50))                               # an epoch covers every seed


def test_sampler_is_reproducible_by_seed_and_takes_everything_with_minus_one():
    ei = _ring()
    a = [s.n_id.tolist() for s in pdata.NeighborSampler(ei, 50, [2, 2], batch_size=16, seed=3)]
    b = [s.n_id.tolist() for s in pdata.NeighborSampler(ei, 50, [2, 2], batch_size=16, seed=3)]
    c = [s.n_id.tolist() for s in pdata.NeighborSampler(ei, 50, [2, 2], batch_size=16, seed=4)]
    assert a == b and a != c
    full = pdata.NeighborSampler(ei, 50, [-1], batch_size=5, shuffle=False).sample(np.array([0, 10]))
    assert full.edge_index.shape[1] == 12
    with pytest.raises(DataError, match="fanouts"):
        pdata.NeighborSampler(ei, 50, [0])
    with pytest.raises(DataError, match="outside"):
        pdata.NeighborSampler(ei, 10, [2])
    sampler = pdata.NeighborSampler(ei, 50, [2])
    for bad, msg in (([1, 1], "distinct"), ([50], "outside"), ([0.5], "integer")):
        with pytest.raises(DataError, match=msg):
            sampler.sample(np.array(bad))
    assert (sampler._seen == -1).all()  # a refused or finished batch leaves the scratch clean


def test_sampled_sage_on_a_subgraph_matches_the_full_graph_at_full_fanout():
    """With every neighbour sampled for as many hops as layers, the seeds' outputs are exact."""
    pg.manual_seed(8)
    ei = _ring(30, 4)
    x = np.random.default_rng(9).normal(size=(30, 3))
    model = nn.GraphSAGE(3, 4, 2, 2, dropout=0.0, dtype=pg.float64)
    full = model(pg.tensor(x), ei).numpy()
    sub = pdata.NeighborSampler(ei, 30, [-1, -1], batch_size=5, seed=0).sample(np.array([3, 17]))
    part = model(pg.tensor(x[sub.n_id]), sub.edge_index).numpy()[:2]
    np.testing.assert_allclose(part, full[[3, 17]], rtol=1e-10)


# -- demos ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["gat", "--epochs", "2"], ["sage", "--epochs", "2"],
                                  ["sage", "--sampled", "--epochs", "2"], ["gin", "--epochs", "1"]])
def test_demos_run_and_print_the_gcn_json_fields(argv, capsys):
    import json

    from polygrad.apps.cli import main
    assert main(["demo", *argv, "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("demo", "test_accuracy", "epochs", "epoch_time_ms", "peak_rss_mb", "backend", "runs", "seeds"):
        assert key in result
    assert result["demo"] == argv[0] and 0.0 <= result["test_accuracy"] <= 1.0


def test_mean_aggregation_weights_are_made_once_per_graph_and_are_right():
    from polygrad.nn import message_passing as mp
    from polygrad.nn.graph_cache import EdgeGraph

    # destinations 0, 0, 1, 2, 2, 2, 2 (the edge 1 -> 2 twice: a multigraph, as PyG reads it)
    g = EdgeGraph(np.array([0, 0, 1, 2, 2, 2, 2]), np.array([0, 1, 2, 0, 1, 2, 1]), 3, 3, 7)
    first = mp._constant(g, "weights", True, np.dtype(np.float64), "numpy")
    assert mp._constant(g, "weights", True, np.dtype(np.float64), "numpy") is first  # made once per graph
    np.testing.assert_allclose(first.numpy(), [0.5, 0.5, 1.0, 0.25, 0.5, 0.25])
    ones = mp._constant(g, "weights", False, np.dtype(np.float32), "numpy")
    assert ones is not first and ones.dtype == np.float32
    np.testing.assert_array_equal(ones.numpy(), [1, 1, 1, 1, 2, 1])
