"""The PyG-named layers' gradients against central differences (float64), with no torch needed:
inputs, edge weights / features and every parameter, on numpy and on the scalar reference, on a
small directed graph with a self loop and an isolated node.  Also their bad-input errors."""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.testing import check_grads

BACKENDS = ["numpy", "scalar"]
# source row 0 -> destination row 1; node 2 has a self loop, node 6 is isolated
EDGES = np.array([[0, 1, 2, 2, 3, 0, 4, 5, 1], [1, 0, 1, 4, 2, 2, 1, 3, 2]])
EDGES = np.concatenate([EDGES, [[2], [2]]], axis=1)
N = 7


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def _weights(e: int = EDGES.shape[1], seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=e)


def check_layer(layer: nn.Module, call: Callable[..., Any], data: list[np.ndarray], backend: str) -> None:
    """check_grads over ``data`` and every parameter of ``layer`` (put in place on each call)."""
    params = dict(layer.named_parameters())
    assert params, "a layer with parameters is expected here"
    modules = dict(layer.named_modules())
    names = list(params)

    def put(tensors: Any) -> None:
        for name, t in zip(names, tensors):
            owner, _, attr = name.rpartition(".")
            setattr(modules[owner] if owner else layer, attr, t)

    def fn(*ts: pg.Tensor) -> pg.Tensor:
        put(ts[len(data):])
        return call(layer, *ts[:len(data)])

    try:
        check_grads(fn, data + [params[n].numpy() for n in names], backend=backend)
    finally:
        put(params[n] for n in names)  # the layer's own parameters back in place


def _seeded_nonzero(layer: nn.Module) -> nn.Module:
    """Biases and affine parameters away from their zero / one initial values."""
    rng = np.random.default_rng(11)
    for _, p in layer.named_parameters():
        p.update_(p.numpy() + rng.normal(scale=0.3, size=p.shape))
    return layer


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
def test_graphconv_gradients(backend, aggr):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.GraphConv(3, 2, aggr=aggr, dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x, w: m(x, EDGES, w), [_data(N, 3), _weights()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graphconv_bipartite_gradients(backend):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.GraphConv((3, 2), 2, dtype=pg.float64, backend=backend))
    edges = np.array([[0, 6, 3, 3, 5], [0, 1, 1, 2, 0]])  # 7 sources -> 4 destinations (3 isolated)
    check_layer(layer, lambda m, xs, xd: m((xs, xd), edges), [_data(N, 3), _data(4, 2, seed=1)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gineconv_gradients(backend):
    pg.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 4, dtype=pg.float64, backend=backend), nn.Tanh(),
                        nn.Linear(4, 2, dtype=pg.float64, backend=backend))
    layer = _seeded_nonzero(nn.GINEConv(mlp, eps=0.2, train_eps=True, edge_dim=2, dtype=pg.float64,
                                        backend=backend))
    check_layer(layer, lambda m, x, ea: m(x, EDGES, ea), [_data(N, 3), _data(EDGES.shape[1], 2, seed=2)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["add", "mean"])
def test_nnconv_gradients(backend, aggr):
    pg.manual_seed(0)
    edge_nn = nn.Sequential(nn.Linear(2, 3, dtype=pg.float64, backend=backend), nn.Tanh(),
                            nn.Linear(3, 3 * 2, dtype=pg.float64, backend=backend))
    layer = _seeded_nonzero(nn.NNConv(3, 2, edge_nn, aggr=aggr, dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x, ea: m(x, EDGES, ea), [_data(N, 3), _data(EDGES.shape[1], 2, seed=2)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_sgconv_gradients(backend, add_self_loops):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.SGConv(3, 2, K=2, add_self_loops=add_self_loops, dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x, w: m(x, EDGES, w), [_data(N, 3), _weights()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_appnp_gradients(backend):
    layer = nn.APPNP(K=3, alpha=0.2)
    check_grads(lambda x, w: layer(x, EDGES, w), [_data(N, 3), _weights()], backend=backend)
    plain = nn.APPNP(K=2, alpha=0.2, normalize=False)
    check_grads(lambda x, w: plain(x, EDGES, w), [_data(N, 3), _weights()], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("normalization", ["sym", "rw", None])
def test_chebconv_gradients(backend, normalization):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.ChebConv(3, 2, K=3, normalization=normalization, dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x, w: m(x, EDGES, w), [_data(N, 3), _weights()], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_gradients_in_training_and_eval(backend):
    layer = _seeded_nonzero(nn.BatchNorm(3, dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x: m(x), [_data(6, 3)], backend)
    layer.module.running_mean.update_(np.array([0.1, -0.2, 0.3]))
    layer.module.running_var.update_(np.array([0.5, 2.0, 1.5]))
    layer.eval()
    check_layer(layer, lambda m, x: m(x), [_data(6, 3)], backend)


def test_batchnorm_running_statistics_follow_pytorchs_rule():
    layer = nn.BatchNorm1d(2, momentum=0.25, dtype=pg.float64)
    xs = [_data(5, 2, seed=s) for s in range(3)]
    mean, var = np.zeros(2), np.ones(2)
    for x in xs:
        layer(pg.tensor(x))
        mean = 0.75 * mean + 0.25 * x.mean(0)
        var = 0.75 * var + 0.25 * x.var(0, ddof=1)
    np.testing.assert_allclose(layer.running_mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(layer.running_var.numpy(), var, rtol=1e-12)
    cumulative = nn.BatchNorm1d(2, momentum=None, dtype=pg.float64)
    for x in xs:
        cumulative(pg.tensor(x))
    np.testing.assert_allclose(cumulative.running_mean.numpy(), np.mean([x.mean(0) for x in xs], 0), rtol=1e-12)
    assert "module.num_batches_tracked" in nn.BatchNorm(2).state_dict()
    assert not any("running" in name for name, _ in layer.named_parameters())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode,batched", [("graph", False), ("graph", True), ("node", False)])
def test_layernorm_gradients(backend, mode, batched):
    layer = _seeded_nonzero(nn.LayerNorm(3, mode=mode, dtype=pg.float64, backend=backend))
    batch = np.array([0, 0, 1, 1, 1, 3]) if batched else None  # graph 2 is empty
    check_layer(layer, lambda m, x: m(x, batch), [_data(6, 3)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_gradients(backend):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.MLP([3, 4, 2], act="tanh", dtype=pg.float64, backend=backend))
    check_layer(layer, lambda m, x: m(x), [_data(6, 3)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_heteroconv_gradients(backend):
    pg.manual_seed(0)
    layer = _seeded_nonzero(nn.HeteroConv({
        ("a", "r", "b"): nn.GraphConv((3, 2), 2, dtype=pg.float64, backend=backend),
        ("b", "s", "b"): nn.GraphConv(2, 2, aggr="mean", dtype=pg.float64, backend=backend),
        ("b", "t", "a"): nn.GraphConv((2, 3), 2, dtype=pg.float64, backend=backend)}, aggr="sum"))
    edges = {("a", "r", "b"): np.array([[0, 6, 3, 3], [0, 1, 1, 2]]), ("b", "s", "b"): np.array([[0, 1, 2], [1, 2, 2]]),
             ("b", "t", "a"): np.array([[3, 1], [5, 0]])}

    def call(m, xa, xb):
        out = m({"a": xa, "b": xb}, edges)
        return pg.concat([out["a"], out["b"]])

    check_layer(layer, call, [_data(N, 3), _data(4, 2, seed=1)], backend)


# -- bad input ------------------------------------------------------------------------------------------

def test_layers_name_what_is_wrong():
    x = pg.tensor(_data(N, 3))
    with pytest.raises(pg.errors.ShapeError, match="edge_index must be an integer array"):
        nn.SGConv(3, 2)(x, np.zeros((3, 4), dtype=np.int64))
    with pytest.raises(pg.errors.ShapeError, match="outside"):
        nn.ChebConv(3, 2, K=2)(x, np.array([[0], [N]]))
    with pytest.raises(pg.errors.ShapeError, match="edge_weight of shape"):
        nn.APPNP(K=1, alpha=0.1)(x, EDGES, np.ones(3))
    with pytest.raises(pg.errors.ShapeError, match="needs edge_attr"):
        nn.GINEConv(nn.Linear(3, 2))(x, EDGES)
    with pytest.raises(pg.errors.ShapeError, match="set edge_dim"):
        nn.GINEConv(nn.Linear(3, 2))(x, EDGES, np.ones((EDGES.shape[1], 5)))
    with pytest.raises(pg.errors.ShapeError, match=r"\[E, 3 \* 2\]"):
        nn.NNConv(3, 2, nn.Linear(2, 5))(x, EDGES, np.ones((EDGES.shape[1], 2)))
    with pytest.raises(pg.errors.ShapeError, match=r"must be \[N, 4\]"):
        nn.BatchNorm(4)(x)
    with pytest.raises(ValueError, match="normalization"):
        nn.ChebConv(3, 2, K=2, normalization="bad")
    with pytest.raises(ValueError, match="mode"):
        nn.LayerNorm(3, mode="bad")
    with pytest.raises(ValueError, match="num_layers"):
        nn.MLP(in_channels=3, out_channels=2)
    with pytest.raises(ValueError, match="unknown norm"):
        nn.MLP([3, 2, 1], norm="group")
    with pytest.raises(ValueError, match="allow_single_element"):
        nn.BatchNorm(3, track_running_stats=False, allow_single_element=True)
    with pytest.raises(TypeError, match="edge types"):
        nn.HeteroConv({"a": nn.GraphConv(3, 2)})


def test_micrograd_mlp_form_is_unchanged():
    pg.manual_seed(0)
    old = nn.layers.MLP(2, [4, 1])
    pg.manual_seed(0)
    new = nn.MLP(2, [4, 1])
    assert isinstance(new, nn.layers.MLP) and list(new.state_dict()) == list(old.state_dict())
    x = pg.tensor(_data(5, 2))
    np.testing.assert_array_equal(new(x).numpy(), old(x).numpy())
    pyg_form = nn.MLP([2, 4, 1])
    assert [n for n, _ in pyg_form.named_parameters()][:2] == ["lins.0.weight", "lins.0.bias"]


# -- the fast paths against the slow ones ------------------------------------------------------------

@st.composite
def graphs(draw):
    """A random directed graph without repeated edges (self loops and isolated nodes allowed)."""
    n = draw(st.integers(1, 9))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=25, unique=True))
    ei = np.array(pairs, dtype=np.int64).T.reshape(2, -1)
    return ei, n, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=40, deadline=None)
@given(graphs(), st.sampled_from(["add", "mean", "max"]))
def test_one_node_set_spmm_path_equals_the_edge_by_edge_path(g, aggr):
    """GraphConv / NNConv on one node set (MessagePassing's SpMM or segment path) against the same
    layer fed a pair (x, copy of x): the edge-by-edge gather/scatter path, bit for bit close."""
    ei, n, seed = g
    pg.manual_seed(seed % 1000)
    rng = np.random.default_rng(seed)
    x_host, w_host = rng.normal(size=(n, 3)), rng.uniform(0.5, 1.5, size=ei.shape[1])
    ea_host = rng.normal(size=(ei.shape[1], 2))
    layers = [(nn.GraphConv(3, 2, aggr=aggr, dtype=pg.float64), w_host),
              (nn.NNConv(3, 2, nn.Linear(2, 6, dtype=pg.float64), aggr=aggr, dtype=pg.float64), ea_host)]
    for layer, edge_host in layers:
        results = []
        for pair in (False, True):
            x, x_dst = pg.tensor(x_host, requires_grad=True), pg.tensor(x_host, requires_grad=True)
            edge = pg.tensor(edge_host, requires_grad=True)
            out = layer((x, x_dst) if pair else x, ei, edge)
            out.sum().backward()
            # x's gradient: through the sources and the root term (the copy's, on the pair path)
            gx = sum(t.grad.numpy() for t in ((x, x_dst) if pair else (x,)) if t.grad is not None)
            ge = edge.grad.numpy() if edge.grad is not None else np.zeros(edge.shape)
            results.append((out.numpy(), gx, ge))
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(graphs())
def test_structure_cache_follows_edge_index_content(g):
    """A layer reused across graphs (and across in-place edits of one edge_index) gives what a
    fresh layer gives: the cached index work is keyed by content, never by identity."""
    ei, n, seed = g
    rng = np.random.default_rng(seed)
    x = pg.tensor(rng.normal(size=(n, 2)))
    reused = [nn.APPNP(K=2, alpha=0.3), nn.ChebConv(2, 2, K=3, dtype=pg.float64)]
    fresh_cheb = nn.ChebConv(2, 2, K=3, dtype=pg.float64)
    fresh_cheb.load_state_dict(reused[1].state_dict())
    ei = ei.copy()
    for _ in range(3):
        for layer, fresh in zip(reused, (nn.APPNP(K=2, alpha=0.3), fresh_cheb)):
            fresh._structure = type(fresh._structure)()  # a new cache: computed from scratch
            np.testing.assert_array_equal(layer(x, ei).numpy(), fresh(x, ei).numpy())
        if ei.size:
            ei[0] = rng.integers(0, n, size=ei.shape[1])  # edited in place: same object, new content


def test_layers_pickle_and_deepcopy_with_their_state():
    pg.manual_seed(0)
    x = pg.tensor(_data(N, 3))
    cases = [
        (nn.GraphConv(3, 2, dtype=pg.float64), lambda m: m(x, EDGES)),
        (nn.GINEConv(nn.MLP([3, 4, 2], act="leaky_relu", dtype=pg.float64), edge_dim=2, dtype=pg.float64),
         lambda m: m(x, EDGES, _data(EDGES.shape[1], 2))),
        (nn.ChebConv(3, 2, K=2, dtype=pg.float64), lambda m: m(x, EDGES)),
        (nn.BatchNorm(3, dtype=pg.float64), lambda m: m(x)),
        (nn.HeteroConv({("a", "r", "a"): nn.GraphConv(3, 2, dtype=pg.float64)}),
         lambda m: m({"a": x}, {("a", "r", "a"): EDGES})["a"]),
    ]
    for layer, run in cases:
        layer.eval()
        want = run(layer).numpy()  # caches built before the copies are taken
        for clone in (pickle.loads(pickle.dumps(layer)), copy.deepcopy(layer)):
            np.testing.assert_array_equal(run(clone).numpy(), want)
            assert list(clone.state_dict()) == list(layer.state_dict())
