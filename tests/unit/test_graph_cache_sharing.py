"""The layers of one forward pass share the structure they derive from one graph.

The outermost ``Module`` call opens a memo (:func:`polygrad.nn.module.forward_memo`); each graph
layer that misses its own cache looks there (by content, as its own cache does) before building.
Promised: the same bits as layers that each build their own structure, one build per graph per
forward (GIN: one instead of one per layer), and the content check still sees an ``edge_index``
edited in place between two layers.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.nn import graph_cache
from polygrad.nn.module import forward_memo


class Stack(nn.Module):
    """Graph layers applied in turn, each to the previous output and its own graph."""

    def __init__(self, layers: list[nn.Module]):
        self.layers = layers

    def forward(self, x, graphs):
        for layer, graph in zip(self.layers, graphs):
            x = layer(x, graph)
        return x


def _layers(f: int = 3) -> list[nn.Module]:
    pg.manual_seed(0)

    def mlp():
        return nn.Sequential(nn.Linear(f, f, dtype=pg.float64), nn.ReLU())
    return [nn.GINConv(mlp(), train_eps=True, dtype=pg.float64), nn.SAGEConv(f, f, dtype=pg.float64),
            nn.GATConv(f, f, dtype=pg.float64), nn.GINConv(mlp(), dtype=pg.float64),
            nn.SAGEConv(f, f, aggr="max", dtype=pg.float64)]


@pytest.fixture
def builds(monkeypatch):
    """Counts GraphCache._build calls."""
    count = [0]
    real = graph_cache.GraphCache._build

    def counting(*args):
        count[0] += 1
        return real(*args)
    monkeypatch.setattr(graph_cache.GraphCache, "_build", staticmethod(counting))
    return count


def _graph(rng, n: int, e: int) -> np.ndarray:
    return rng.integers(0, n, (2, e))


def test_gin_builds_the_batch_graph_once_per_forward(builds):
    rng = np.random.default_rng(0)
    model = nn.GIN(2, 4, 3, 2, dtype=pg.float64)
    x, batch = pg.tensor(rng.normal(size=(12, 2))), np.repeat([0, 1, 2], 4)
    ei = _graph(rng, 12, 30)
    model(x, ei, batch, 3)
    assert builds[0] == 1
    model(x, ei.copy(), batch, 3)  # the same content again: every layer's own cache
    assert builds[0] == 1
    model(x, _graph(rng, 12, 31), batch, 3)  # another batch: built once more
    assert builds[0] == 2


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), e=st.integers(0, 40), seed=st.integers(0, 2**16), same=st.booleans())
def test_shared_structure_gives_the_bits_of_each_layer_building_its_own(n, e, seed, same):
    rng = np.random.default_rng(seed)
    graphs = [_graph(rng, n, e)] * 5 if same else [_graph(rng, n, e) for _ in range(5)]
    x = rng.normal(size=(n, 3))
    results = []
    for shared in (True, False):
        layers = _layers()
        xt = pg.tensor(x, requires_grad=True)
        if shared:   # one outer module call: one memo for all five layers
            out = Stack(layers)(xt, graphs)
        else:        # each layer its own outermost call: nothing shared
            out = xt
            for layer, graph in zip(layers, graphs):
                out = layer(out, graph)
        (out * out).sum().backward()
        grads = [xt.grad.numpy()] + [p.grad.numpy() for layer in layers for p in layer.parameters()]
        results.append((out.numpy().tobytes(), [g.tobytes() for g in grads]))
    assert results[0] == results[1]


def test_an_edge_index_edited_in_place_between_two_layers_of_one_forward_is_seen():
    rng = np.random.default_rng(1)
    ei = _graph(rng, 8, 20)
    before = ei.copy()
    x = rng.normal(size=(8, 3))

    class EditsBetween(nn.Module):
        def __init__(self):
            self.a, self.b = _layers()[:2]

        def forward(self, x, ei):
            h = self.a(x, ei)
            ei[1, :5] = 7  # in place, while the first layer's structure sits in the memo
            return self.b(h, ei)

    got = EditsBetween()(pg.tensor(x), ei).numpy()
    fresh_a, fresh_b = _layers()[:2]
    want = fresh_b(fresh_a(pg.tensor(x), before), ei).numpy()
    assert not np.array_equal(before, ei)
    np.testing.assert_array_equal(got, want)


def test_forward_memo_lives_for_the_outermost_call_only():
    seen = []

    class Inner(nn.Module):
        def forward(self, x):
            seen.append(forward_memo())
            return x

    class Outer(nn.Module):
        def __init__(self):
            self.inner = Inner()

        def forward(self, x, fail=False):
            seen.append(forward_memo())
            self.inner(x)
            if fail:
                raise RuntimeError("boom")
            return x

    assert forward_memo() is None
    Outer()(1)
    assert isinstance(seen[0], dict) and seen[1] is seen[0]
    Outer()(1)
    assert seen[2] is not seen[0]  # a new memo per outermost call
    with pytest.raises(RuntimeError):
        Outer()(1, fail=True)
    assert forward_memo() is None  # reset even when the forward raised


def test_more_graphs_in_one_forward_than_the_memo_keeps():
    rng = np.random.default_rng(2)
    k = graph_cache.SHARED_PER_FORWARD + 3
    graphs = [_graph(rng, 6, 12) for _ in range(k)] * 2  # each graph twice, in two rounds
    pg.manual_seed(0)
    layers = [nn.SAGEConv(3, 3, dtype=pg.float64) for _ in graphs]
    x = rng.normal(size=(6, 3))
    got = Stack(layers)(pg.tensor(x), graphs).numpy()
    want = pg.tensor(x)
    for layer, graph in zip(layers, graphs):
        layer._graphs.clear()
        want = layer(want, graph)
    np.testing.assert_array_equal(got, want.numpy())


def test_threads_running_models_on_different_graphs_keep_their_own_memo():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(10, 3))
    graphs = [_graph(rng, 10, 25) for _ in range(4)]
    want = {}
    for k, g in enumerate(graphs):
        want[k] = Stack(_layers())(pg.tensor(x), [g] * 5).numpy()
    failures = []
    models = [Stack(_layers()) for _ in graphs]  # built here: seeding is not per thread

    def run(k: int) -> None:
        model = models[k]
        for _ in range(5):
            got = model(pg.tensor(x), [graphs[k]] * 5).numpy()
            if not np.array_equal(got, want[k]):
                failures.append(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_tensor_graph_is_copied_without_exporting_its_storage():
    """A dense tensor ``edge_index`` handed to the build is compared with its storage directly:
    the built graph keeps its own copy, and the tensor is neither marked shared nor read on the
    host (``Tensor.__array__`` would do both)."""
    from polygrad.runtime import sharing

    ei = pg.tensor(np.array([[0, 1, 2], [1, 2, 0]]))
    built = graph_cache.GraphCache._build("test", ei, (3, 3), "source_to_target", self_loops=False)
    assert not sharing.is_shared(ei._data)
    ei._data[0, 0] = 2  # polygrad's own in-place write path
    assert not np.shares_memory(built.src, ei._data) and built.src.tolist() == [0, 1, 2]
