"""Pinned row blocks with halos (issue 24): the block kernels against the plain product on
generated patterns (no cluster), then on a LocalCluster of two worker processes started by
``polygrad_dask.connect``: blocks and activations stay on their workers, only halo rows move, a
killed worker's blocks are rebuilt with the same numbers, and a worker whose memory_limit cannot
hold its block fails with an error naming the worker and the sizes."""
from __future__ import annotations

import os
import signal
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

import scipy.sparse as sp  # noqa: E402

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.apps.train import fit  # noqa: E402
from polygrad.errors import BackendError  # noqa: E402
from polygrad_dask import locality, sparse_kernels  # noqa: E402
from polygrad_dask.partition import build_block  # noqa: E402

TIMEOUT = 120


# -- the block kernels against the plain product (pure functions: no cluster) ---------------------

@st.composite
def blocked_products(draw):
    """A random sparse n x m matrix, row and column bounds, and the row block to check."""
    n, m = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    density = draw(st.sampled_from([0.0, 0.1, 0.4, 1.0]))
    seed = draw(st.integers(0, 2**16))
    a = sp.random(n, m, density=density, format="csr", random_state=seed, dtype=np.float64)
    a.sort_indices()
    cuts = sorted(draw(st.lists(st.integers(1, max(m - 1, 1)), max_size=3, unique=True))) if m > 1 else []
    col_bounds = tuple([0] + [c for c in cuts if 0 < c < m] + [m])
    square = n == m and draw(st.booleans())
    own = draw(st.integers(0, len(col_bounds) - 2)) if square else None
    f = draw(st.integers(1, 3))
    x = np.random.default_rng(seed).normal(size=(m, f))
    g = np.random.default_rng(seed + 1).normal(size=(n, f))
    return a, col_bounds, own, x, g


def _parts(block, x, col_bounds):
    out = []
    for j, need in enumerate(block.need):
        xj = x[col_bounds[j]:col_bounds[j + 1]]
        out.append(xj if need is None else sparse_kernels._take(xj, need))
    return out


@settings(max_examples=150, deadline=None)
@given(blocked_products())
def test_block_kernels_equal_the_plain_products(case):
    """One block over its extended columns (own block whole, halos gathered) gives A @ X, A.T @ G
    and the SDDMM of the whole matrix; halos hold exactly the columns the block touches."""
    a, col_bounds, own, x, g = case
    block = build_block(a.indptr, a.indices, col_bounds, 0, own)
    for j, need in enumerate(block.need):
        touched = np.unique(a.indices[(a.indices >= col_bounds[j]) & (a.indices < col_bounds[j + 1])])
        if need is not None:
            np.testing.assert_array_equal(need, touched - col_bounds[j])
        assert block.segments[j][1] == (col_bounds[j + 1] - col_bounds[j] if need is None else touched.size)
    parts = _parts(block, x, col_bounds)
    np.testing.assert_allclose(sparse_kernels._spmm_block(block, a.data, *parts), a @ x, rtol=1e-12, atol=1e-12)
    want = a.T @ g
    for j in range(len(block.segments)):
        shape = (col_bounds[j + 1] - col_bounds[j], g.shape[1])
        if j == own:  # the own tile goes straight into the result, on its worker
            got = sparse_kernels._assemble(shape, np.float64, ((sparse_kernels.OWN, j),), block, a.data, g)
        else:
            got = sparse_kernels._assemble(shape, np.float64, (block.need[j],),
                                           sparse_kernels._spmm_t_part(block, a.data, g, j))
        np.testing.assert_allclose(got, want[col_bounds[j]:col_bounds[j + 1]], rtol=1e-12, atol=1e-12)
    p = np.random.default_rng(0).normal(size=(a.shape[0], x.shape[1]))
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    np.testing.assert_allclose(sparse_kernels._sddmm_block(block, p, *parts),
                               np.einsum("ij,ij->i", p[rows], x[a.indices]), rtol=1e-12, atol=1e-12)


# -- orderings and the edge cut --------------------------------------------------------------------

def _two_interleaved_cliques(k: int) -> np.ndarray:
    """Two cliques of k nodes, numbered alternately (even ids one, odd the other)."""
    src, dst = np.meshgrid(np.arange(k), np.arange(k))
    pairs = np.stack([src.ravel(), dst.ravel()])
    return np.concatenate([2 * pairs, 2 * pairs + 1], axis=1)


def test_rcm_ordering_puts_each_clique_in_one_block():
    ei, n = _two_interleaved_cliques(8), 16
    before = locality.halo_stats(ei, n, 2)
    order = locality.locality_order(ei, n, "rcm")
    after = locality.halo_stats(locality.relabel(ei, order), n, 2)
    assert before["cut_fraction"] == pytest.approx(0.5, abs=0.1) and before["halo_rows"] == 16
    assert after["cut_edges"] == 0 and after["halo_rows"] == 0
    # relabelling renames nodes, keeping every edge: the same graph up to the permutation
    back = order[locality.relabel(ei, order)]
    np.testing.assert_array_equal(back, ei)


def test_halo_rows_count_distinct_remote_columns_per_block():
    ei = np.array([[0, 0, 1, 3, 3, 2], [2, 3, 3, 0, 1, 2]])   # blocks {0, 1}, {2, 3}
    st_ = locality.halo_stats(ei, 4, 2)
    # block 0 fetches columns {2, 3}; block 1 fetches {0, 1}; (2, 2) is local
    assert st_["cut_edges"] == 5 and st_["halo_rows"] == 4


def test_unknown_ordering_is_refused():
    with pytest.raises(ValueError, match="rcm"):
        locality.locality_order(np.zeros((2, 0), dtype=np.int64), 3, "metis")


# -- on a cluster ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def client():
    """Two worker processes started by polygrad_dask.connect (no spilling, no pausing, no work
    stealing), 2 row blocks, small blocks allowed."""
    from polygrad.testing.temporary import temporary_plugin
    from polygrad.runtime.registry import registry

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


def _profiling(dask_worker=None) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_connect_starts_workers_without_the_statistical_profiler(client):
    """connect()'s workers (no dashboard) do not sample their stacks 100 times a second: CPU the
    kernels need on a machine whose cores the workers share."""
    assert set(client.run(_profiling).values()) == {False}


def _sent(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total).values())


def _block_diagonal(n: int, cross: int, seed: int, degree: int = 8) -> np.ndarray:
    """Edges inside each half of [0, n) (``degree`` per node), plus ``cross`` edges from the first
    half into the second."""
    rng = np.random.default_rng(seed)
    h = n // 2
    inside = np.concatenate([rng.integers(0, h, (2, degree * h)), rng.integers(h, n, (2, degree * h))], axis=1)
    over = np.stack([rng.integers(0, h, cross), rng.integers(h, n, cross)])
    return np.concatenate([inside, over], axis=1)


@pytest.mark.parametrize("cross", [0, 50])
def test_only_halo_rows_move_between_workers(client, cross):
    """A step's SpMM, its transpose and their operands stay on the workers holding the rows: with
    no edge between the halves nothing of N x F size moves; with a few, about their halo does.
    (The values are under 1 MiB, so they are embedded in each step's graph: their pieces may run
    anywhere, hence the slack of two copies of them.)"""
    n, f = 8192, 64
    ei = _block_diagonal(n, cross, seed=cross, degree=8)
    a = pg.from_edge_index(ei, n, dtype=np.float64, backend="dask")
    x = pg.tensor(np.random.default_rng(1).normal(size=(n, f)), backend="dask", requires_grad=True)
    pg.materialize(x)
    ((a @ x).tanh().sum()).backward()         # warm-up: the partition is built, halo ids placed
    pg.materialize(x.grad)
    part = polygrad_dask.partition.partition_of(a.pattern)
    halo = sum(part.halo_rows().values())
    homes = polygrad_dask.cluster.homes(client)
    assert client.who_has(list(part.blocks)) == {b.key: (homes[i],) for i, b in enumerate(part.blocks)}
    before = _sent(client)
    x.grad = None
    ((a @ x).tanh().sum()).backward()
    pg.materialize(x.grad)
    moved = _sent(client) - before
    whole = n // 2 * f * 8                     # one row block of X: what unpinned blocks moved
    assert halo <= cross
    slack = 2 * a.nnz * 8 + 64 * 1024           # the embedded values, scalars
    assert moved <= 2 * halo * f * 8 + slack < whole, (moved, halo)


def _model(n_features: int, classes: int):
    pg.manual_seed(0)
    return nn.GCN(n_features, 8, 2, classes, dropout=0.0, dtype=np.float64)


def _train(backend, ei, feats, labels, epochs, model=None, opt=None):
    with pg.use_backend(backend):
        if model is None:
            model = _model(feats.shape[1], int(labels.max()) + 1)
            opt = optim.Adam(model.parameters(), lr=0.02)
        x = pg.tensor(feats)
        history = fit(model, opt, lambda: nn.cross_entropy(model(x, ei), labels), epochs, rollback_threshold=None)
    return list(history.losses), model, opt


def test_pinned_blocks_survive_a_killed_worker_with_the_same_numbers(client):
    """SIGKILL the worker holding row block 0 between steps: its blocks, halo ids and pinned
    activations are rebuilt from their lineage on the worker that replaces it, and the losses
    equal an undisturbed numpy run's."""
    n = 3000
    ei = _block_diagonal(n, 400, seed=7)
    rng = np.random.default_rng(3)
    feats, labels = rng.normal(size=(n, 12)), rng.integers(0, 4, n)
    want, _, _ = _train("numpy", ei, feats, labels, 6)
    got, model, opt = _train("dask", ei, feats, labels, 3)
    homes = polygrad_dask.cluster.homes(client)
    pid = client.run(os.getpid, workers=[homes[0]])[homes[0]]
    os.kill(pid, signal.SIGKILL)
    client.wait_for_workers(2, timeout=TIMEOUT)     # the nanny starts a new process
    tries = 0
    while len(got) < 6:
        try:
            more, model, opt = _train("dask", ei, feats, labels, 6 - len(got), model, opt)
            got += more
        except BackendError as exc:   # the step that saw the worker die: parameters intact
            tries += 1
            assert tries <= 3, exc
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # the restarted worker runs without the statistical profiler too (its nanny had started it again)
    assert set(client.run(_profiling).values()) == {False}


def test_worker_that_cannot_hold_its_block_names_the_worker_and_sizes(client):
    """A worker whose memory_limit leaves no room for its row block fails the partition with a
    BackendError naming the worker, its limit and the block; nothing waits for memory."""
    import psutil

    def cap(dask_worker, extra):
        old = dask_worker.memory_manager.memory_limit
        rss = psutil.Process().memory_info().rss
        dask_worker.memory_manager.memory_limit = None if extra is None else rss + extra
        return old

    n = 200_000
    ei = np.random.default_rng(0).integers(0, n, (2, 200_000))   # values under 1 MiB: embedded
    a = pg.from_edge_index(ei, n, dtype=np.float32, backend="dask")
    saved = client.run(cap, extra=256 * 1024)
    try:
        with pytest.raises(BackendError, match=r"worker tcp://\S+ cannot hold row block \d \(100000 rows, "
                                               r"\d+ nonzeros\).*memory_limit"):
            polygrad_dask.partition.partition_of(a.pattern)
    finally:
        for address, old in saved.items():
            client.run(lambda dask_worker, v=old: setattr(dask_worker.memory_manager, "memory_limit", v),
                       workers=[address])
    y = a @ pg.tensor(np.ones((n, 1), dtype=np.float32), backend="dask")   # room again: it runs
    np.testing.assert_allclose(y.numpy()[:, 0], np.bincount(ei[0], minlength=n), rtol=1e-6)


def test_values_sent_to_the_workers_once_train_like_numpy(client):
    """Values over 1 MiB are persisted by ``from_numpy``; coalescing them (a take, then
    index_add) used to hand the persisted array whole to a delayed call, whose futures were then
    released under it: every product failed with 'lost dependencies'."""
    n = 1024
    ei = np.random.default_rng(0).integers(0, n, (2, 200_000))   # 1.6 MB of float64 values
    xs = np.random.default_rng(1).normal(size=(n, 4))
    grads = []
    for backend in ("numpy", "dask"):
        a = pg.from_edge_index(ei, n, dtype=np.float64, backend=backend)
        x = pg.tensor(xs, backend=backend, requires_grad=True)
        (a @ x).tanh().sum().backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-12)


# -- locality orderings at load time --------------------------------------------------------------

def _interleaved_communities(n: int, cross: int, seed: int) -> np.ndarray:
    """Two communities (8 edges per node inside, ``cross`` from one to the other; symmetric) whose ids
    alternate, so contiguous blocks cut about half the edges."""
    ei = _block_diagonal(n, cross, seed)
    ei = np.concatenate([ei, ei[::-1]], axis=1)
    spread = np.empty(n, dtype=np.int64)
    spread[:n // 2], spread[n // 2:] = np.arange(0, n, 2), np.arange(1, n, 2)
    return spread[ei]


def _train_normalised(adj, feats, labels, epochs):
    """Two GCN layers over an already normalised adjacency: the losses."""
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
    return list(fit(model, opt, lambda: nn.cross_entropy(model(), labels), epochs, rollback_threshold=None).losses)


@pytest.mark.parametrize("order", ["rcm", "degree"])
def test_shards_written_in_a_locality_order_train_like_numpy_with_a_smaller_halo(client, tmp_path, order):
    """``write_edge_shards(order=...)`` renumbers before writing and keeps the permutation
    (``node_order``): GCN on the renumbered shards with ``x[order]`` gives numpy's losses on the
    original ids (a mean over all nodes: the same up to summation order), and the loaded
    partition's halo is the one ``halo_stats`` predicts for the renumbered graph."""
    n = 2000
    ei = _interleaved_communities(n, 0, seed=2)
    rng = np.random.default_rng(4)
    feats, labels = rng.normal(size=(n, 5)), rng.integers(0, 3, n)
    with pg.use_backend("numpy"):
        want = _train_normalised(pg.gcn_norm(pg.from_edge_index(ei, n, dtype=np.float64)), feats, labels, 3)
    halos = {}
    for name in ("contiguous", order):
        where = polygrad_dask.write_edge_shards(ei, n, tmp_path / name, partitions=2, order=name)
        perm = polygrad_dask.node_order(where)
        assert (perm is None) == (name == "contiguous")
        perm = np.arange(n) if perm is None else perm
        np.testing.assert_array_equal(np.sort(perm), np.arange(n))
        adj = polygrad_dask.gcn_adjacency(where, dtype=np.float64)
        halos[name] = sum(polygrad_dask.partition.partition_of(adj.pattern).halo_rows().values())
        assert halos[name] == locality.halo_stats(locality.relabel(ei, perm), n, 2)["halo_rows"]
        with pg.use_backend("dask"):
            got = _train_normalised(adj, feats[perm], labels[perm], 3)
        np.testing.assert_allclose(got, want, rtol=1e-9)
    assert halos["contiguous"] > n // 2
    if order == "rcm":      # RCM numbers the two communities one after the other
        assert halos["rcm"] == 0, halos


def test_a_bad_order_is_a_data_error(client, tmp_path):
    ei, n = _two_interleaved_cliques(4), 8
    for bad in ("metis", np.zeros(n, dtype=np.int64), np.arange(n - 1), np.arange(n) + 0.5):
        with pytest.raises(pg.errors.DataError, match="order must be"):
            polygrad_dask.write_edge_shards(ei, n, tmp_path / "g", partitions=2, order=bad)
    where = polygrad_dask.write_edge_shards(ei, n, tmp_path / "g", partitions=2, order=np.arange(n)[::-1])
    np.testing.assert_array_equal(polygrad_dask.node_order(where), np.arange(n)[::-1])
    np.save(where / "order.npy", np.arange(n + 1))
    with pytest.raises(pg.errors.DataError, match="not a permutation"):
        polygrad_dask.node_order(where)
    (where / "order.npy").write_bytes(b"junk")
    with pytest.raises(pg.errors.DataError, match="unreadable"):
        polygrad_dask.node_order(where)
    polygrad_dask.write_edge_shards(ei, n, where, partitions=2)      # rewritten without: no stale order
    assert polygrad_dask.node_order(where) is None and not (where / "order.npy").exists()


# -- fit: one submission per epoch, the step taken before the loss is read ------------------------

def _counted_fit(backend, ei, feats, labels, epochs, scales=None, threshold=None, compile=False):
    """fit of the GCN on ``backend`` with the loss multiplied by ``scales[epoch]`` (a NaN, a rise):
    the history (or the NonFiniteError), the parameters and Adam's state at the end, the
    parameters after each epoch, and how many ``Client.persist`` / ``Client.compute`` calls each
    epoch made."""
    from distributed import Client

    calls = {"persist": 0, "compute": 0}
    per_epoch: list = []
    after: list = []
    saved = Client.persist, Client.compute

    def counting(name, real):
        def call(self, *args, **kwargs):
            calls[name] += 1
            return real(self, *args, **kwargs)
        return call

    with pg.use_backend(backend):
        model = _model(feats.shape[1], int(labels.max()) + 1)
        opt = optim.Adam(model.parameters(), lr=0.02)
        x = pg.tensor(feats)
        pg.materialize(x)
        after.append([p.numpy() for p in model.parameters()])
        seen = [0]

        def loss_fn():
            k = seen[0]
            seen[0] += 1
            return nn.cross_entropy(model(x, ei), labels) * (scales or {}).get(k, 1.0)

        def on_epoch(rec):
            per_epoch.append(dict(calls))
            after.append([p.numpy() for p in model.parameters()])   # fetched chunks: no persist/compute
            calls.update(persist=0, compute=0)

        Client.persist, Client.compute = counting("persist", saved[0]), counting("compute", saved[1])
        try:
            history = fit(model, opt, loss_fn, epochs, rollback_threshold=threshold, callback=on_epoch,
                          compile=compile)
        except pg.errors.NonFiniteError as exc:
            history = exc
        finally:
            Client.persist, Client.compute = saved
    params = [p.numpy() for p in model.parameters()]
    state = [v.numpy() for st in opt.state_dict()["state"].values() for v in st.values() if isinstance(v, pg.Tensor)]
    return history, params, state, after, per_epoch, opt.step_count


def _graph_problem():
    n = 400
    rng = np.random.default_rng(2)
    return _block_diagonal(n, 60, seed=5), rng.normal(size=(n, 6)), rng.integers(0, 3, n)


def test_fit_epoch_on_dask_is_one_submission_with_numpys_numbers(client):
    """The loss, the gradients and the optimizer's new parameters and state go to the cluster as
    one graph per epoch (one ``persist``, no ``compute``: the loss is fetched from its computed
    chunk), with numpy's losses and parameters."""
    ei, feats, labels = _graph_problem()
    want, want_params, _, _, _, _ = _counted_fit("numpy", ei, feats, labels, 4)
    got, got_params, _, _, per_epoch, _ = _counted_fit("dask", ei, feats, labels, 4)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9)
    for a, b in zip(got_params, want_params):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert per_epoch[1:] == [{"persist": 1, "compute": 0}] * 3, per_epoch


def test_fit_pure_on_dask_is_one_submission_with_the_eager_numbers(client):
    """fit(compile="pure") on Dask (the step inside the compiled call): one submission per epoch
    too -- the step joins the loss's graph, instead of materialising the new parameters (forward
    and backward computed) and then the loss and gradients (computed again) -- with the same
    losses, parameters and state as compile=False."""
    ei, feats, labels = _graph_problem()
    want, want_params, want_state, _, _, _ = _counted_fit("dask", ei, feats, labels, 4)
    got, got_params, got_state, _, per_epoch, _ = _counted_fit("dask", ei, feats, labels, 4, compile="pure")
    assert got.compile_mode == "pure"
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-13)
    for a, b in zip(got_params + got_state, want_params + want_state):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    assert per_epoch[1:] == [{"persist": 1, "compute": 0}] * 3, per_epoch


@pytest.mark.parametrize("scales", [{2: float("nan")}, {1: 5.0, 3: float("inf")}])
def test_nonfinite_loss_on_dask_rolls_back_exactly(client, monkeypatch, scales):
    """A NaN/Inf loss or a rise, on Dask: the step submitted with the loss is undone and the
    checkpoint (the parameters before the previous good epoch's step) restored bit for bit; the
    run takes numpy's decisions with numpy's numbers, and those of the path it replaces (stepping
    after reading the loss: several submissions per epoch) to the last bits."""
    from polygrad.apps import train

    ei, feats, labels = _graph_problem()
    want, want_params, want_state, _, _, _ = _counted_fit("numpy", ei, feats, labels, 6, scales, 0.05)
    got, got_params, got_state, after, per_epoch, _ = _counted_fit("dask", ei, feats, labels, 6, scales, 0.05)
    with monkeypatch.context() as m:
        m.setattr(train, "_steps_ahead", lambda optimizer: False)
        slow, slow_params, slow_state, _, slow_epochs, _ = _counted_fit("dask", ei, feats, labels, 6, scales, 0.05)
    assert got.rollbacks == want.rollbacks == slow.rollbacks >= 1
    assert [r.rolled_back for r in got.records] == [r.rolled_back for r in want.records] \
        == [r.rolled_back for r in slow.records]
    assert [r.lr for r in got.records] == [r.lr for r in want.records] == [r.lr for r in slow.records]
    for k, rec in enumerate(got.records):
        if rec.rolled_back:  # the good checkpoint of epoch k-1 holds the parameters after epoch k-2
            for a, b in zip(after[k + 1], after[k - 1]):
                np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-9)
    # against the replaced path to the last bits, not bit for bit: one parameter element differed
    # by one ulp between the two cluster runs in 2 of 8 runs of this test (which side varies is
    # not yet known: noted in the round's closing note)
    np.testing.assert_allclose(got.losses, slow.losses, rtol=1e-13, atol=0)
    for a, b, c in zip(got_params + got_state, slow_params + slow_state, want_params + want_state):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-12)
    assert all(e["persist"] == 1 for e in per_epoch[1:]), per_epoch
    # the replaced path: the loss and gradients, then the step (a rolled-back epoch skips the step)
    assert all(e["persist"] >= 2 for e, r in zip(slow_epochs[1:], slow.records[1:]) if not r.rolled_back), slow_epochs


def test_nonfinite_first_loss_on_dask_raises_with_nothing_stepped(client):
    """A NaN loss before any good checkpoint raises; the step submitted with it is undone: the
    initial parameters bit for bit, no optimizer state, no step counted."""
    ei, feats, labels = _graph_problem()
    got, params, state, after, _, steps = _counted_fit("dask", ei, feats, labels, 3, {0: float("nan")}, 0.05)
    assert isinstance(got, pg.errors.NonFiniteError)
    for a, b in zip(params, after[0]):
        np.testing.assert_array_equal(a, b)
    assert state == [] and steps == 0


def _pipelined_fit(ei, feats, labels, epochs, pipeline, scales=None):
    """fit of the GCN on Dask with no callback (the next step built while this one runs, unless
    ``pipeline=False``), the loss scaled by ``scales[(steps taken, rollbacks so far)]`` -- a
    function of the training state, so both runs see the same loss at the same state."""
    with pg.use_backend("dask"):
        model = _model(feats.shape[1], int(labels.max()) + 1)
        opt = optim.Adam(model.parameters(), lr=0.02)
        x = pg.tensor(feats)
        pg.materialize(x)

        def loss_fn():
            decays = round(np.log2(0.02 / opt.param_groups[0]["lr"]))
            return nn.cross_entropy(model(x, ei), labels) * (scales or {}).get((opt.step_count, decays), 1.0)

        history = fit(model, opt, loss_fn, epochs, rollback_threshold=0.05, pipeline=pipeline)
    arrays = [p.numpy() for p in model.parameters()]
    arrays += [v.numpy() for st in opt.state_dict()["state"].values() for v in st.values() if isinstance(v, pg.Tensor)]
    return history, arrays


@pytest.mark.parametrize("scales", [None, {(2, 0): float("nan")}, {(1, 0): 5.0, (3, 1): float("inf")}])
def test_fit_on_dask_builds_the_next_step_ahead_with_the_same_bits(client, scales):
    """With no callback, fit submits the next epoch's step before it reads this epoch's loss: the
    same losses, decisions, parameters and Adam state as the loop that waits for each step; a
    rolled-back epoch discards the step built ahead; every submitted step that was kept was waited
    for (its failure would have been reported)."""
    from polygrad.runtime.registry import registry

    ei, feats, labels = _graph_problem()
    unconfirmed = set(registry.get("dask")._unconfirmed)  # what other tests' discarded steps left
    got, got_arrays = _pipelined_fit(ei, feats, labels, 6, True, scales)
    want, want_arrays = _pipelined_fit(ei, feats, labels, 6, False, scales)
    # to the last bits, not bit for bit: two cluster runs of this GCN with the same code and seed
    # differ by one ulp now and then, pipelined or not (2 of 6 runs in one process, one of them
    # waiting for each step): a weight gradient's block product may see a C- or an F-ordered copy
    # of a transposed block depending on where an unpinned task ran (the plugin README's "run-to-run
    # reproducibility"); the core tests (tests/unit/test_fit_pipeline.py) hold the pipelined loop to
    # the waiting one bit for bit
    np.testing.assert_allclose(got.losses, want.losses, rtol=1e-13, atol=0)
    assert [(r.rolled_back, r.lr) for r in got.records] == [(r.rolled_back, r.lr) for r in want.records]
    assert (got.rollbacks >= 1) == (scales is not None)
    for a, b in zip(got_arrays, want_arrays):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    assert got.steps_ahead == sum(not r.rolled_back for r in got.records[:-1]) and want.steps_ahead == 0
    if scales is None:  # nothing discarded: no submission left unconfirmed
        assert set(registry.get("dask")._unconfirmed) <= unconfirmed


def _fails(block):
    raise ZeroDivisionError("a task failed on purpose")


def test_a_submitted_array_is_waited_for_replicated_and_its_failure_reported(client):
    """``submit`` returns before the work is done; ``materialize`` of what it returned waits,
    copies the small results onto a second worker (as for arrays it persists itself) and turns a
    task's failure into a BackendError."""
    import dask.array as da
    from polygrad.runtime.registry import registry

    be = registry.get("dask")
    small = da.ones((4, 3), chunks=(4, 3)) * 2.0
    [submitted] = be.submit([small])
    assert submitted.name in be._unconfirmed
    [done] = be.materialize([submitted])
    assert done is submitted and submitted.name not in be._unconfirmed
    holders = client.who_has(polygrad_dask.backend._futures_of(done))
    assert all(len(workers) == 2 for workers in holders.values()), holders
    np.testing.assert_array_equal(be.to_numpy(done), np.full((4, 3), 2.0))

    broken = small.map_blocks(_fails, dtype=small.dtype)
    [submitted] = be.submit([broken])
    with pytest.raises(BackendError, match="ZeroDivisionError: a task failed on purpose"):
        be.materialize([submitted])
    assert submitted.name not in be._unconfirmed


def test_the_kits_lazy_backend_contract_holds_on_the_cluster(client):
    """materialize and submit return one array per input, in order, with the bits the arrays
    read as directly (polygrad.testing.lazy, which ``polygrad check dask`` runs)."""
    from polygrad.testing.lazy import check_lazy_contract, is_lazy

    assert is_lazy("dask")
    assert check_lazy_contract("dask") == []


def test_a_discarded_submission_is_forgotten_at_the_next_submit(client):
    """fit discards the step it built ahead when an epoch rolls back: that submission is never
    materialized, and once nothing holds its futures the next submit forgets it (its name used to
    stay for the life of the process)."""
    import gc

    import dask.array as da
    from polygrad.runtime.registry import registry

    be = registry.get("dask")
    [kept] = be.submit([da.ones((4, 3), chunks=(4, 3)) * 3.0])
    [dropped] = be.submit([da.ones((4, 3), chunks=(4, 3)) * 4.0])
    name = dropped.name
    assert {kept.name, name} <= set(be._unconfirmed)
    del dropped
    gc.collect()
    [other] = be.submit([da.ones((4, 3), chunks=(4, 3)) * 5.0])
    assert name not in be._unconfirmed
    assert kept.name in be._unconfirmed and other.name in be._unconfirmed  # still held: still confirmed
    [done, done_other] = be.materialize([kept, other])
    np.testing.assert_array_equal(be.to_numpy(done) + be.to_numpy(done_other), np.full((4, 3), 8.0))
    assert kept.name not in be._unconfirmed and other.name not in be._unconfirmed


def test_memory_checks_on_dask_ask_the_cluster_not_this_process(client, monkeypatch):
    """A dask array lives on the workers: polygrad's memory check of an op's output compares it
    with the workers' headroom (asked once per second at most), so a client with little memory
    still builds a step for a graph the cluster holds, and a cluster without room refuses it."""
    from polygrad.runtime import memory
    from polygrad.runtime.registry import registry

    be = registry.get("dask")
    be._memory_figure = None
    figure = be.memory_available()
    workers = client.scheduler_info()["workers"].values()
    assert 0 < figure <= sum(w["memory_limit"] for w in workers)

    x = pg.tensor(np.ones((1 << 21, 1)), backend="dask")          # 16 MiB on the workers
    asked = []

    def headroom(client_, room):
        asked.append(room)
        return room

    monkeypatch.setattr(memory, "available_memory_bytes", lambda *a: 1 << 20)   # a small client
    monkeypatch.setattr(polygrad_dask.cluster, "memory_headroom", lambda c: headroom(c, 64 << 30))
    be._memory_figure = None
    y = (x + 1.0) * 2.0                                              # two checks, one question
    assert y.shape == x.shape and asked == [64 << 30]

    monkeypatch.setattr(polygrad_dask.cluster, "memory_headroom", lambda c: headroom(c, 8 << 20))
    be._memory_figure = None
    with pytest.raises(pg.errors.MemoryBudgetError, match="'dask'"):
        x + 1.0
    monkeypatch.setattr(polygrad_dask.cluster, "running", lambda: False)   # no cluster: this process's memory
    assert be.memory_available() is None


class _FakeClient:
    def __init__(self, workers: dict):
        self.workers = workers

    def scheduler_info(self):
        return {"workers": self.workers}


@pytest.mark.parametrize("address, capped", [
    ("tcp://127.0.0.1:40000", True),          # a cluster connect started: this machine
    ("inproc://192.0.2.2/6040/4", True),      # the in-process cluster client() starts: this process
    ("tcp://10.9.8.7:40000", False),          # another machine: its own memory
])
def test_memory_headroom_sums_the_workers_and_caps_this_machines(address, capped):
    """The headroom is each worker's limit less its use, summed; workers on this machine (or in
    this process) share its memory, so their sum is capped by what it has available."""
    import psutil

    huge = 1 << 50
    workers = {address: {"memory_limit": huge, "metrics": {"memory": 1 << 30}},
               address + "1": {"memory_limit": huge, "metrics": {"memory": 0}}}
    got = polygrad_dask.cluster.memory_headroom(_FakeClient(workers))
    if capped:
        assert got <= psutil.virtual_memory().total
    else:
        assert got == 2 * huge - (1 << 30)
    workers[address]["memory_limit"] = 0                      # a worker without a limit
    assert polygrad_dask.cluster.memory_headroom(_FakeClient(workers)) is None
    assert polygrad_dask.cluster.memory_headroom(_FakeClient({})) is None


def test_block_products_are_their_tasks_with_no_alias_in_between(client):
    """Each output block of an SpMM, its transpose, an SDDMM and a segment sum is the result of
    the kernel task itself, keyed as the array's chunk: no ``from_delayed`` alias per block,
    ``concatenate`` alias per chunk or task splitting a tuple of partials (round trips to the
    scheduler that compute nothing); the products still equal scipy's."""
    import dask.array as da
    from dask.core import flatten

    n, f = 512, 3
    ei = _block_diagonal(n, 40, seed=5, degree=4)
    a = pg.from_edge_index(ei, n, dtype=np.float64, backend="dask")
    x = np.random.default_rng(2).normal(size=(n, f))
    (a @ pg.tensor(x, backend="dask")).numpy()  # builds the partition on the workers
    part = polygrad_dask.partition.partition_of(a.pattern)
    m = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n))
    m.sum_duplicates()
    values = da.from_array(np.linspace(0.5, 1.5, m.nnz), chunks=(part.nnz_chunks,))
    csr = sp.csr_matrix((values.compute(), m.indices, m.indptr), shape=(n, n))
    xd = da.from_array(x, chunks=(part.row_chunks, (f,)))
    sk = polygrad_dask.sparse_kernels
    results = {"_spmm": (sk.spmm_partition(part, values, xd), csr @ x),
               "_assemble": (sk.spmm_t_partition(part, values, xd), csr.T @ x),
               "_sddmm_block": (sk.sddmm_partition(part, xd, xd), None),
               "_segment": (sk.segment_partition(part, values, True), np.asarray(csr.sum(axis=1)).ravel())}
    for kind, (got, want) in results.items():
        graph = dict(got.__dask_graph__())
        assert not [k for k in graph if str(k[0] if isinstance(k, tuple) else k).startswith(
            ("from-value", "concatenate", "_rows_of", "getitem"))], kind
        assert all(str(k[0]).startswith(kind) or k[0].startswith("_add_partials")
                   for k in flatten(got.__dask_keys__())), (kind, got.__dask_keys__())
        if want is not None:
            np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12)


def test_tasks_whose_results_travel_run_first_on_their_worker(client):
    """A halo gather and a transposed product's partial go to another worker, which waits for
    them: they carry dask's priority (``cluster.TRAVELS_FIRST``), so their worker runs them before
    its own tile's product (ready at the same moment, 10x longer) and the transfer overlaps that
    product.  Local tasks keep the default priority.  The numbers do not depend on it."""
    import dask.array as da

    n, f = 512, 3
    ei = _block_diagonal(n, 40, seed=6, degree=4)
    cross = np.concatenate([np.arange(20), np.arange(n // 2, n // 2 + 20)])  # a few rows of each block
    ei = np.concatenate([ei, np.stack([cross, (cross + n // 2) % n])], axis=1)
    a = pg.from_edge_index(ei, n, dtype=np.float64, backend="dask")
    x = np.random.default_rng(3).normal(size=(n, f))
    (a @ pg.tensor(x, backend="dask")).numpy()  # builds the partition on the workers
    part = polygrad_dask.partition.partition_of(a.pattern)
    assert part.needs, "the pattern must have halos for this test"
    values = da.from_array(np.linspace(0.5, 1.5, int(a.pattern.nnz)), chunks=(part.nnz_chunks,))
    xd = da.from_array(x, chunks=(part.row_chunks, (f,)))
    sk = polygrad_dask.sparse_kernels
    for got, travelling in ((sk.spmm_partition(part, values, xd), "_take"),
                            (sk.spmm_t_partition(part, values, xd), "_spmm_t_part")):
        priorities: dict = {}
        for name, layer in got.__dask_graph__().layers.items():
            for key in layer:
                kind = str(key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0]
                priorities.setdefault(kind, set()).add((layer.annotations or {}).get("priority"))
        assert priorities[travelling] == {polygrad_dask.cluster.TRAVELS_FIRST}, priorities
        local = {k: v for k, v in priorities.items() if k.startswith(("_spmm_tiles", "_assemble", "_add_partials"))}
        assert local and all(v == {None} for v in local.values()), priorities


def _task_kinds(arr) -> set:
    return {str(key[0] if isinstance(key, tuple) else key).rsplit("-", 1)[0]
            for layer in arr.__dask_graph__().layers.values() for key in layer}


def test_a_nearly_whole_halo_is_taken_whole_with_the_same_bits(client, monkeypatch):
    """A uniform random graph's halo is nearly all of the other block (~98% here): the block is
    taken whole -- no halo ids, no ``_take`` task per product, the transposed partials added
    whole -- with the bits of gathering it (the threshold at 1.0, patched on the client, which
    passes it to the workers building the blocks); a small halo is still gathered."""
    import dask.array as da

    n, f = 2000, 3
    ei = np.random.default_rng(8).integers(0, n, (2, 8 * n))
    sk = polygrad_dask.sparse_kernels
    x = np.random.default_rng(4).normal(size=(n, f))
    results, parts = [], []
    for fraction in (1.0, polygrad_dask.partition.WHOLE_HALO_FRACTION):
        monkeypatch.setattr(polygrad_dask.partition, "WHOLE_HALO_FRACTION", fraction)
        a = pg.from_edge_index(ei, n, dtype=np.float64, backend="dask")   # a new pattern: a new partition
        part = polygrad_dask.partition.partition_of(a.pattern)
        values = da.from_array(np.linspace(0.5, 1.5, int(a.pattern.nnz)), chunks=(part.nnz_chunks,))
        xd = da.from_array(x, chunks=(part.row_chunks, (f,)))
        dvalues, dx = sk.spmm_vjp(xd, values, xd, needs=(True, True), pattern=a.pattern)   # SDDMM, A.T @ G
        products = (sk.spmm(values, xd, pattern=a.pattern), dx, dvalues)
        parts.append((part, _task_kinds(products[0]), _task_kinds(dvalues)))
        results.append([r.compute() for r in products])
    (gathered, gathered_kinds, _), (whole, whole_kinds, sddmm_kinds) = parts
    rows = n // 2
    assert set(gathered.needs) == {(0, 1), (1, 0)} and "_take" in gathered_kinds
    assert all(0.9 * rows <= count < rows for count in gathered.halo_rows().values()), gathered.halo_rows()
    assert not whole.needs and "_take" not in whole_kinds | sddmm_kinds
    assert whole.halo_rows() == {(0, 1): rows, (1, 0): rows}
    for got, want in zip(results[1], results[0]):
        assert got.tobytes() == want.tobytes()
    small = pg.from_edge_index(_block_diagonal(n, 40, seed=9, degree=4), n, dtype=np.float64, backend="dask")
    part = polygrad_dask.partition.partition_of(small.pattern)
    values = da.from_array(np.ones(int(small.pattern.nnz)), chunks=(part.nnz_chunks,))
    assert (0, 1) in part.needs and "_take" in _task_kinds(
        sk.spmm_partition(part, values, da.from_array(x, chunks=(part.row_chunks, (f,)))))


def test_shards_loaded_take_a_nearly_whole_halo_whole_at_the_clients_threshold(client, tmp_path, monkeypatch):
    """``load_edge_shards`` builds the blocks on the workers with the client's threshold; the
    partition's halo is the one ``halo_stats`` predicts either way."""
    n = 2000
    ei = np.random.default_rng(10).integers(0, n, (2, 8 * n))
    where = polygrad_dask.write_edge_shards(ei, n, tmp_path / "g", partitions=2)
    for fraction, gathered in ((1.0, True), (polygrad_dask.partition.WHOLE_HALO_FRACTION, False)):
        monkeypatch.setattr(polygrad_dask.partition, "WHOLE_HALO_FRACTION", fraction)
        part = polygrad_dask.partition.partition_of(polygrad_dask.load_edge_shards(where).pattern)
        assert bool(part.needs) == gathered
        assert sum(part.halo_rows().values()) == locality.halo_stats(ei, n, 2)["halo_rows"]


def test_each_product_adds_into_an_own_term_no_other_task_reads(client):
    """The own tile's term is added into in place, so it must have one reader: the same SpMM and
    transposed SpMM built twice and computed in one graph each get an own-term task of their own
    (keys that are not tokens of the arguments) and the right numbers, bit for bit the same."""
    import dask
    import dask.array as da
    from dask.core import flatten

    n, f = 400, 3
    ei = np.random.default_rng(13).integers(0, n, (2, 6 * n))
    a = pg.from_edge_index(ei, n, dtype=np.float64, backend="dask")
    part = polygrad_dask.partition.partition_of(a.pattern)
    xs = np.random.default_rng(14).normal(size=(n, f))
    x = da.from_array(xs, chunks=(part.row_chunks, (f,)))
    vals = np.linspace(0.5, 1.5, int(a.pattern.nnz))
    values = da.from_array(vals, chunks=(part.nnz_chunks,))
    sk = polygrad_dask.sparse_kernels
    products = [sk.spmm(values, x, pattern=a.pattern) for _ in range(2)] + \
        [sk.spmm_vjp(x, values, x, needs=(False, True), pattern=a.pattern)[1] for _ in range(2)]
    terms = [k for y in products for k in y.__dask_graph__()
             if str(k[0] if isinstance(k, tuple) else k).startswith(("_spmm_tiles", "_assemble"))
             and k not in set(flatten(y.__dask_keys__()))]
    assert len(terms) == len(set(terms)) == 4 * len(part.blocks), terms
    got = dask.compute(*products)
    host = sp.csr_matrix((vals, a.pattern.cols, a.pattern.indptr), shape=(n, n))
    np.testing.assert_allclose(got[0], host @ xs, rtol=1e-12)
    np.testing.assert_allclose(got[2], host.T @ xs, rtol=1e-12)
    assert got[0].tobytes() == got[1].tobytes() and got[2].tobytes() == got[3].tobytes()

