"""Sampled mini-batch training on Dask (issue 24, item 4): ``DaskNeighborSampler`` draws, on the
workers holding the rows, exactly the batches of ``polygrad.data.NeighborSampler`` for the same
seed -- however many blocks split the rows -- so GraphSAGE trained on them reaches bitwise the
same losses and parameters; a worker killed mid-epoch is rebuilt from lineage with the same
numbers; shards are sampled by the workers that read them."""
from __future__ import annotations

import os
import signal
import sys

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

try:
    import polygrad_dask  # noqa: E402
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import polygrad_dask  # noqa: E402

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.data import NeighborSampler  # noqa: E402
from polygrad.errors import DataError  # noqa: E402
from polygrad_dask import DaskNeighborSampler  # noqa: E402

TIMEOUT = 120
N, F, CLASSES = 3000, 6, 4
FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def client():
    """Two worker processes started by polygrad_dask.connect, 2 row blocks, small blocks allowed."""
    from polygrad.runtime.registry import registry
    from polygrad.testing.temporary import temporary_plugin

    registry.load()
    entry = registry.entries.get("dask")
    ctx = None
    if entry is None or entry.backend is None:
        ctx = temporary_plugin(polygrad_dask, "dask")
        ctx.__enter__()
    c = polygrad_dask.connect(workers=2, timeout=TIMEOUT)
    saved = polygrad_dask.chunks.partitions, polygrad_dask.chunks.min_block_rows
    polygrad_dask.chunks.set_partitions(2)
    polygrad_dask.chunks.min_block_rows = 1
    try:
        yield c
    finally:
        polygrad_dask.chunks.set_partitions(saved[0])
        polygrad_dask.chunks.min_block_rows = saved[1]
        polygrad_dask.cluster.close(c)
        if ctx is not None:
            ctx.__exit__(None, None, None)


@pytest.fixture(scope="module")
def graph():
    """A directed graph with repeated edges, isolated nodes and degrees above and below the fan-outs."""
    rng = np.random.default_rng(5)
    ei = rng.integers(0, N - 50, (2, 9 * N))                  # the last 50 nodes have no edges
    ei = np.concatenate([ei, ei[:, :200]], axis=1)             # repeated edges
    return ei, rng.normal(size=(N, F)), rng.integers(0, CLASSES, N), rng.random(N) < 0.5


def _same_batches(a, b) -> int:
    count = 0
    for x, y in zip(a, b, strict=True):
        assert x.batch_size == y.batch_size
        np.testing.assert_array_equal(x.n_id, y.n_id)
        np.testing.assert_array_equal(x.edge_index, y.edge_index)
        for u, v in ((x.x, y.x), (x.y, y.y)):
            if u is not None or v is not None:
                np.testing.assert_array_equal(u, v)
        count += 1
    return count


@pytest.mark.parametrize("partitions, prefetch", [(1, 0), (2, 1), (3, 3), (7, 1)])
def test_batches_equal_numpy_samplers_however_the_rows_are_split(client, graph, partitions, prefetch):
    ei, feats, labels, train = graph
    want = NeighborSampler(ei, N, FANOUTS, batch_size=256, input_nodes=train, seed=11, x=feats, y=labels)
    got = DaskNeighborSampler(ei, N, FANOUTS, batch_size=256, input_nodes=train, seed=11,
                              x=pg.tensor(feats, backend="dask"), y=labels, partitions=partitions,
                              prefetch=prefetch)
    assert len(got.blocks) == partitions
    for _ in range(2):                                     # two epochs: the reshuffle agrees too
        assert _same_batches(want, got) == len(want)


def test_full_fanout_and_explicit_seeds_equal_numpy(client, graph):
    ei, feats, labels, _ = graph
    seeds = np.array([N - 1, 7, 2999 - 60, 0, 1500])     # an isolated node among them
    want = NeighborSampler(ei, N, [-1, 2]).sample(seeds)
    got = DaskNeighborSampler(ei, N, [-1, 2], partitions=3).sample(seeds)
    _same_batches([want], [got])
    assert want.edge_index.shape[1] > 0


def _on_workers(values):
    """A dask-backend tensor persisted on the workers (its rows are read from their futures)."""
    t = pg.tensor(values, backend="dask")
    pg.materialize(t)
    assert polygrad_dask.backend._persisted(t.array)
    return t


def _train(batches, epochs: int = 2):
    """GraphSAGE on the numpy backend over the sampler's batches: losses and final parameters."""
    pg.manual_seed(0)
    model = nn.GraphSAGE(F, 8, 2, CLASSES, dropout=0.0, dtype=np.float64)
    opt = optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(epochs):
        for sub in batches:
            logits = model(pg.tensor(sub.x), sub.edge_index)
            loss = nn.cross_entropy(logits[np.arange(sub.batch_size)], sub.y[:sub.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
    return losses, [p.numpy().copy() for p in model.parameters()]


def test_sampled_training_on_dask_equals_numpy_bitwise(client, graph):
    ei, feats, labels, train = graph
    args = dict(batch_size=300, input_nodes=train, seed=3)
    want_losses, want_params = _train(NeighborSampler(ei, N, FANOUTS, x=feats, y=labels, **args))
    x, y = _on_workers(feats), _on_workers(labels)
    got_losses, got_params = _train(DaskNeighborSampler(ei, N, FANOUTS, x=x, y=y, **args))
    assert got_losses == want_losses and len(got_losses) == 2 * len(NeighborSampler(ei, N, FANOUTS, **args))
    for a, b in zip(got_params, want_params, strict=True):
        np.testing.assert_array_equal(a, b)


def test_killed_worker_mid_epoch_is_rebuilt_with_the_same_numbers(client, graph):
    """SIGKILL the worker holding block 0 after two batches: its sampler block and feature rows
    are rebuilt from lineage on the new worker, and training gives numpy's numbers bitwise."""
    ei, feats, labels, train = graph
    args = dict(batch_size=300, input_nodes=train, seed=4)
    want_losses, want_params = _train(NeighborSampler(ei, N, FANOUTS, x=feats, y=labels, **args), epochs=1)
    sampler = DaskNeighborSampler(ei, N, FANOUTS, x=_on_workers(feats), y=labels, **args)
    killed = []

    def killing():
        for k, sub in enumerate(sampler):
            yield sub
            if k == 1:
                home = polygrad_dask.cluster.homes(client)[0]
                killed.append(home)
                pid = client.run(os.getpid, workers=[home])[home]
                os.kill(pid, signal.SIGKILL)
    got_losses, got_params = _train(killing(), epochs=1)
    client.wait_for_workers(2, timeout=TIMEOUT)
    held = client.who_has([sampler.blocks[0]])[sampler.blocks[0].key]
    assert held and killed[0] not in held                 # block 0 was rebuilt elsewhere
    assert got_losses == want_losses
    for a, b in zip(got_params, want_params, strict=True):
        np.testing.assert_array_equal(a, b)


def test_shards_are_sampled_by_the_workers_that_read_them(client, graph, tmp_path):
    """Sampling shards: a row's neighbours are its columns (what A @ X aggregates from), i.e.
    NeighborSampler over the reversed edge_index; the client never holds the edges."""
    ei, feats, labels, _ = graph
    polygrad_dask.write_edge_shards(ei, N, tmp_path / "g", partitions=3)
    want = NeighborSampler(ei[[1, 0]], N, FANOUTS, batch_size=500, seed=9, x=feats)
    got = DaskNeighborSampler.from_shards(tmp_path / "g", FANOUTS, batch_size=500, seed=9,
                                          x=pg.tensor(feats, backend="dask"))
    assert len(got.blocks) == 3 and sum(got.nbytes_per_block) > 0
    assert _same_batches(want, got) == len(want)


def test_bad_input_is_a_data_error(client, graph, tmp_path):
    ei, feats, _, _ = graph
    with pytest.raises(DataError, match="partitions"):
        DaskNeighborSampler(ei, N, FANOUTS, partitions=0)
    with pytest.raises(DataError, match="prefetch"):
        DaskNeighborSampler(ei, N, FANOUTS, prefetch=-1)
    with pytest.raises(DataError, match="x has 10 rows"):
        DaskNeighborSampler(ei, N, FANOUTS, x=feats[:10])
    with pytest.raises(DataError, match="outside"):
        DaskNeighborSampler(ei, 10, FANOUTS)
    with pytest.raises(DataError, match="fanouts"):
        DaskNeighborSampler(ei, N, [0])
    polygrad_dask.write_edge_shards(ei, N, tmp_path / "g", partitions=2)
    (tmp_path / "g" / "part-00001.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="part-00001"):
        DaskNeighborSampler.from_shards(tmp_path / "g", FANOUTS)
