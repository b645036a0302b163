"""Fewer tasks per step, the same numbers: ``backend.fused`` (block-wise chains fused before a
graph is sent) against the unfused graph, and ``expand`` chunked by rows against numpy's
broadcast -- bitwise, on generated inputs (no cluster); then GCN training on a LocalCluster of two
worker processes with fusion on and off: the same losses and parameters up to rounding."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

try:
    import polygrad_dask  # noqa: E402
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import polygrad_dask  # noqa: E402

import dask.array as da  # noqa: E402

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.apps.train import fit  # noqa: E402
from polygrad_dask import backend, chunks, dense_kernels  # noqa: E402

TIMEOUT = 120


@pytest.fixture(autouse=True)
def two_small_blocks():
    """2 row blocks, small blocks allowed (restored afterwards)."""
    saved = chunks.partitions, chunks.min_block_rows
    chunks.set_partitions(2)
    chunks.min_block_rows = 1
    yield
    chunks.set_partitions(saved[0])
    chunks.min_block_rows = saved[1]


def _tasks(arrays: list) -> int:
    return len(dict(arrays[0].__dask_graph__())) if len(arrays) == 1 else \
        len({k for a in arrays for k in dict(a.__dask_graph__())})


def _sync(arrays: list) -> list:
    import dask
    return list(dask.compute(*arrays, scheduler="sync", optimize_graph=False))


@st.composite
def step_graphs(draw):
    """A step-like graph on row-chunked arrays: a matmul with a weight, a bias expanded to N rows,
    a chain of elementwise ops and row / column reductions, with float32 or float64 inputs."""
    n = draw(st.integers(1, 40))
    f, h = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**16))
    ops = draw(st.lists(st.sampled_from(["relu", "exp", "mul", "add", "sub", "square", "where"]), max_size=6))
    rng = np.random.default_rng(seed)
    x = da.from_array(rng.normal(size=(n, f)).astype(dtype), chunks=chunks.chunks_for((n, f)))
    w = da.from_array(rng.normal(size=(f, h)).astype(dtype), chunks=chunks.chunks_for((f, h)))
    b = da.from_array(rng.normal(size=(h,)).astype(dtype), chunks=chunks.chunks_for((h,)))
    y = da.matmul(x, w) + dense_kernels.expand(dense_kernels.reshape(b, shape=(1, h)), shape=(n, h))
    for op in ops:
        if op == "relu":
            y = dense_kernels.relu(y)
        elif op == "exp":
            y = da.exp(da.clip(y, -5, 5))
        elif op == "mul":
            y = y * dtype(0.5)
        elif op == "add":
            y = y + y
        elif op == "sub":
            y = y - y.max(axis=1, keepdims=True)
        elif op == "square":
            y = y * y
        else:
            y = da.where(y > 0, y, dtype(0.1) * y)
    # a weight's gradient: the row blocks' X_i.T @ Y_i, summed over blocks
    return [y, da.matmul(x.T, y), y.sum(axis=0), y.sum()]


@settings(max_examples=60, deadline=None)
@given(step_graphs())
def test_fused_graphs_compute_bitwise_the_unfused_values_with_fewer_tasks(arrays):
    fused = backend.fused(arrays)
    assert [a.name for a in fused] == [a.name for a in arrays]       # the same keys: persisted as before
    assert _tasks(fused) <= _tasks(arrays)
    for got, want in zip(_sync(fused), _sync(arrays)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_expand_is_numpys_broadcast_chunked_by_rows(data):
    out_shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    # an input broadcastable to out_shape: a suffix of its axes, each kept or set to 1
    rank = data.draw(st.integers(0, len(out_shape)))
    in_shape = tuple(n if data.draw(st.booleans()) else 1 for n in out_shape[len(out_shape) - rank:])
    host = np.random.default_rng(0).normal(size=in_shape)
    x = da.from_array(host, chunks=chunks.chunks_for(in_shape))
    got = dense_kernels.expand(x, shape=out_shape)
    assert got.chunks[0] == chunks.row_chunks(out_shape[0]) or (rank == len(out_shape) and in_shape[0] == out_shape[0]
                                                                 and got.chunks[0] == x.chunks[0])
    assert got.compute(scheduler="sync").tobytes() == np.ascontiguousarray(np.broadcast_to(host, out_shape)).tobytes()


def test_a_bias_expanded_to_rows_adds_without_rechunking():
    """A bias broadcast to N rows used to be one N-row block, split again by every op with a
    row-blocked array (a rechunk on one worker, half of it sent to the other)."""
    n, h = 10, 3
    x = da.ones((n, h), chunks=chunks.chunks_for((n, h)))
    b = dense_kernels.expand(da.from_array(np.arange(float(h)).reshape(1, h), chunks=((1,), (h,))), shape=(n, h))
    assert b.chunks == x.chunks
    assert not [k for k in dict((x + b).__dask_graph__()) if "rechunk" in str(k)]


# -- on a cluster: GCN training, fused and not ---------------------------------------------------

@pytest.fixture(scope="module")
def client():
    """Two worker processes started by polygrad_dask.connect."""
    from polygrad.runtime.registry import registry
    from polygrad.testing.temporary import temporary_plugin

    registry.load()
    entry = registry.entries.get("dask")
    ctx = None
    if entry is None or entry.backend is None:
        ctx = temporary_plugin(polygrad_dask, "dask")
        ctx.__enter__()
    c = polygrad_dask.connect(workers=2, timeout=TIMEOUT)
    try:
        yield c
    finally:
        polygrad_dask.cluster.close(c)
        if ctx is not None:
            ctx.__exit__(None, None, None)


def _gcn_run(backend_name: str, ei: np.ndarray, feats: np.ndarray, labels: np.ndarray, epochs: int):
    """Two GCN layers (bias, ReLU, cross-entropy, Adam): the losses and the final parameters."""
    with pg.use_backend(backend_name):
        adj = pg.gcn_norm(pg.from_edge_index(ei, feats.shape[0], dtype=np.float64))
        pg.manual_seed(0)
        c1 = nn.GCNConv(feats.shape[1], 8, normalize=False, dtype=np.float64)
        c2 = nn.GCNConv(8, int(labels.max()) + 1, normalize=False, dtype=np.float64)

        class Two(nn.Module):
            def __init__(self):
                self.c1, self.c2 = c1, c2

            def forward(self):
                return c2(c1(x, adj).relu(), adj)

        x = pg.tensor(feats)
        model = Two()
        opt = optim.Adam(model.parameters(), lr=0.02)
        losses = fit(model, opt, lambda: nn.cross_entropy(model(), labels), epochs, rollback_threshold=None).losses
        return np.array(losses), [p.numpy() for p in model.parameters()]


def test_gcn_trains_the_same_fused_and_unfused(client, monkeypatch):
    """Fused, a GCN trains to the unfused graph's losses and parameters up to rounding, and to
    numpy's losses.  Not bitwise on a cluster: which worker runs an unpinned task (a transposed
    block, a weight's transpose) and whether its result travels decides the memory layout BLAS
    sees, and fusing changes those tasks (on one process, without travel, fused values are bitwise
    the unfused ones: the property test above)."""
    n = 300
    rng = np.random.default_rng(3)
    ei = rng.integers(0, n, (2, 1500))
    feats, labels = rng.normal(size=(n, 6)), rng.integers(0, 4, n)
    runs = []
    for fuse in (False, True):
        monkeypatch.setattr(backend, "FUSE", fuse)
        runs.append(_gcn_run("dask", ei, feats, labels, 4))
    (loss0, params0), (loss1, params1) = runs
    np.testing.assert_allclose(loss1, loss0, rtol=1e-12)
    for a, b in zip(params1, params0):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    want, _ = _gcn_run("numpy", ei, feats, labels, 4)
    np.testing.assert_allclose(loss1, want, rtol=1e-9)
