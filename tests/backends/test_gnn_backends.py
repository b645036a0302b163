"""Every available backend (scalar reference first) agrees on the graph primitives, activations and
layers: forward and gradients, float64 (cupy joins automatically where it is installed)."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.sparse import graph_ops as go
from polygrad import nn
from polygrad.testing import assert_backends_agree

EDGES = np.array([[0, 1, 2, 2, 3, 0, 4, 4], [1, 0, 1, 4, 2, 2, 1, 3]])
N = 5
PATTERN, _ = go.graph_pattern(EDGES, N)
INDEX = np.array([0, 2, 2, 1, 0, 2, 4, 1])


def _backends() -> list[str]:
    names = [b.name for b in pg.list_backends() if b.available]
    return ["scalar"] + [n for n in names if n != "scalar"]


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


CASES = {
    "leaky_relu": (lambda x: pg.leaky_relu(x, 0.1), [_x((4, 3))]),
    "elu": (pg.elu, [_x((4, 3))]),
    "gelu": (pg.gelu, [_x((4, 3))]),
    "softplus": (pg.softplus, [_x((4, 3))]),
    "sddmm": (lambda a, b: go.sddmm(PATTERN, a, b), [_x((N, 3)), _x((N, 3), 1)]),
    "edge_softmax": (lambda s: pg.edge_softmax(PATTERN, s), [_x((PATTERN.nnz,))]),
    "edge_softmax_heads": (lambda s: pg.edge_softmax(PATTERN, s), [_x((PATTERN.nnz, 3))]),
    "scatter_sum": (lambda s: pg.scatter(s, INDEX, 6, "sum"), [_x((8, 2))]),
    "scatter_mean": (lambda s: pg.scatter(s, INDEX, 6, "mean"), [_x((8, 2))]),
    "scatter_max": (lambda s: pg.scatter(s, INDEX, 6, "max"), [_x((8, 2))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_primitives_agree_across_backends(name):
    fn, inputs = CASES[name]
    assert_backends_agree(fn, inputs, backends=_backends(), rtol=1e-9, atol=1e-12)


def _layer(kind: str, backend: str):
    pg.manual_seed(0)
    kw = {"dtype": pg.float64, "backend": backend}
    if kind == "gat":
        return nn.GATConv(3, 2, heads=2, **kw)
    if kind == "sage_mean":
        return nn.SAGEConv(3, 2, **kw)
    if kind == "sage_max":
        return nn.SAGEConv(3, 2, aggr="max", **kw)
    mlp = nn.Sequential(nn.Linear(3, 4, **kw), nn.ReLU(), nn.Linear(4, 2, **kw))
    return nn.GINConv(mlp, eps=0.2, train_eps=True, **kw)


@pytest.mark.parametrize("kind", ["gat", "sage_mean", "sage_max", "gin"])
def test_graph_layers_agree_across_backends(kind):
    def fwd(x):
        return _layer(kind, x.backend)(x, EDGES).tanh()  # same seed: same parameters on every backend

    assert_backends_agree(fwd, [_x((N, 3), 2)], backends=_backends(), rtol=1e-9, atol=1e-12)
