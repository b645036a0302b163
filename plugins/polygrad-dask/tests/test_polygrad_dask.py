"""polygrad-dask on a LocalCluster of two worker processes: kernels block by block against the
numpy backend, bounded graphs, edge shards, GCN training parity, a killed worker, an unreachable
scheduler."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path

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
from polygrad.data import find_planetoid_dir  # noqa: E402
from polygrad.errors import BackendError, BackendUnavailableError  # noqa: E402
from polygrad.tensor import sddmm, segment_sum  # noqa: E402
from polygrad.testing import check_grads  # noqa: E402
from polygrad.testing.conformance import run_conformance  # noqa: E402
from polygrad.apps.train import fit  # noqa: E402

pytestmark = pytest.mark.usefixtures("cluster_client")
#: seconds a connection to the test cluster may take before it is a failure
TIMEOUT = 120

# (the fixtures live here, not in a conftest.py: plugin test folders are collected in one session,
# and two modules named "conftest" would shadow each other)


@pytest.fixture(scope="session")
def dask_plugin():
    """The plugin module, registered (through its entry point, or for the session only)."""
    if installed():
        yield polygrad_dask
        return
    from polygrad.testing.temporary import temporary_plugin
    with temporary_plugin(polygrad_dask, "dask"):
        yield polygrad_dask


@pytest.fixture(scope="module")
def cluster_client(dask_plugin):
    """A LocalCluster of 2 worker processes (the default client while it lives), 2 row blocks.

    Module-scoped: closed when this module's tests are done.  As a session fixture it stayed the
    default client for whatever ran next in random order, and every other test that touched the
    dask backend (the conformance kit on every backend) ran on it, one cluster round trip per
    numerical-gradient probe (more than 10 minutes on a busy machine, instead of seconds)."""
    from distributed import Client, LocalCluster

    # HTTP endpoints on an OS-chosen loopback port: 8787 may be taken by another program
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                           scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
    client = Client(cluster, set_as_default=True, timeout=TIMEOUT)
    saved = dask_plugin.chunks.partitions, dask_plugin.chunks.min_block_rows
    dask_plugin.chunks.set_partitions(2)
    dask_plugin.chunks.min_block_rows = 1  # small test graphs still get two row blocks
    try:
        yield client
    finally:
        dask_plugin.chunks.set_partitions(saved[0])
        dask_plugin.chunks.min_block_rows = saved[1]
        client.close()
        cluster.close()
REPO = Path(__file__).resolve().parents[3]
PLANETOID = find_planetoid_dir(REPO.parent / "shared" / "data" / "planetoid", REPO / ".device_data" / "planetoid") \
    or REPO / "missing-planetoid"


def installed() -> bool:
    """Whether polygrad loads polygrad-dask through its entry point (not registered by hand).  The
    plugin is deferred (imported when the backend is first used), so its entry is realized here:
    asking before any test used the backend found no backend yet, and the test that asks skipped
    or ran depending on the order the tests ran in."""
    from polygrad.runtime.registry import registry
    registry.load()
    entry = registry.entries.get("dask")
    if entry is None or entry.origin != "polygrad-dask":
        return False
    registry.realize("dask")
    entry = registry.entries.get("dask")
    return entry is not None and entry.origin == "polygrad-dask" and entry.backend is not None


def random_graph(n: int, e: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, e))
    ei[:, ei[0] == 3] = 4  # row 3 stays empty: empty rows inside a block
    return ei


def both(ei: np.ndarray, n: int):
    return (pg.from_edge_index(ei, n, dtype=np.float64),
            pg.from_edge_index(ei, n, dtype=np.float64, backend="dask"))


def test_entry_point_declared_with_distribution_name():
    if not installed():
        pytest.skip("polygrad-dask is not installed (pip install plugins/polygrad-dask)")
    (ep,) = [ep for ep in entry_points(group="polygrad") if ep.name == "dask"]
    assert ep.value == "polygrad_dask" and ep.dist.name == "polygrad-dask"
    info = {b.name: b for b in pg.list_backends()}["dask"]
    assert info.available and info.origin == "polygrad-dask"


def test_arrays_are_row_chunked_and_lazy():
    x = pg.tensor(np.arange(21.0).reshape(7, 3), backend="dask")
    assert x._data.chunks == ((4, 3), (3,))
    y = (x * 2.0).relu()
    assert type(y._data).__name__ == "Array"          # a task graph, not yet a value
    np.testing.assert_array_equal(y.numpy(), np.arange(21.0).reshape(7, 3) * 2)


def test_from_numpy_copies_the_callers_array():
    host = np.ones((5, 2))
    x = pg.tensor(host, backend="dask")
    host[:] = 7.0
    np.testing.assert_array_equal(x.numpy(), np.ones((5, 2)))


@pytest.mark.parametrize("width", [None, 3])
def test_spmm_forward_and_fused_backward_match_numpy(width):
    n = 37
    ei = random_graph(n, 160, seed=1)
    a, ad = both(ei, n)
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(n,) if width is None else (n, width))
    outs = []
    for adj, be in ((a, "numpy"), (ad, "dask")):
        adj = adj.detach()
        adj.requires_grad_()
        x = pg.tensor(xs, backend=be, requires_grad=True)
        y = adj @ x
        (y.tanh().sum()).backward()
        outs.append((y.numpy(), x.grad.numpy(), adj.grad.values.numpy()))
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sddmm_and_segment_sum_match_numpy_and_gradcheck():
    n = 29
    ei = random_graph(n, 120, seed=3)
    a, ad = both(ei, n)
    rng = np.random.default_rng(4)
    p, q = rng.normal(size=(n, 4)), rng.normal(size=(n, 4))
    got = sddmm(pg.tensor(p, backend="dask"), pg.tensor(q, backend="dask"), ad.pattern).numpy()
    np.testing.assert_allclose(got, sddmm(pg.tensor(p), pg.tensor(q), a.pattern).numpy(), rtol=1e-12)
    seg = segment_sum(ad.values, ad.pattern).numpy()
    np.testing.assert_allclose(seg, segment_sum(a.values, a.pattern).numpy(), rtol=1e-12)
    # gradients: against central differences on a small graph (each difference is a cluster
    # round trip), and against the numpy backend on this one
    ei_small = random_graph(6, 14, seed=5)
    small = pg.from_edge_index(ei_small, 6, dtype=np.float64, backend="dask")
    check_grads(lambda p, q: sddmm(p, q, small.pattern).tanh(), [p[:6, :2], q[:6, :2]], backend="dask")
    grads = []
    for be, pat in (("numpy", a.pattern), ("dask", ad.pattern)):
        pt, qt = pg.tensor(p, backend=be, requires_grad=True), pg.tensor(q, backend=be, requires_grad=True)
        segment_sum(sddmm(pt, qt, pat).tanh(), pat).sum().backward()
        grads.append((pt.grad.numpy(), qt.grad.numpy()))
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conformance_of_the_sparse_and_indexing_ops():
    # the whole kit (`polygrad check dask`) takes minutes on a cluster; these are the ops the
    # backend implements itself rather than through dask.array
    report = run_conformance("dask", ops=["spmm", "sddmm", "segment_sum", "segment_max", "index_add",
                                          "getitem"], layouts=["dense", "csr"], checks=["forward", "fused-vjp"])
    assert report.ok, "\n".join(r.message for r in report.failures)
    assert report.cell(pg.Op.SPMM, "csr") == "pass"


def test_parameters_graph_stays_bounded_across_steps():
    n = 40
    _, ad = both(random_graph(n, 150, seed=5), n)
    x = pg.tensor(np.random.default_rng(6).normal(size=(n, 5)), backend="dask")
    w = pg.tensor(np.random.default_rng(7).normal(size=(5, 2)), backend="dask", requires_grad=True)
    opt = optim.Adam([w], lr=0.01)
    sizes = []
    for _ in range(4):
        opt.zero_grad()
        (ad @ (x @ w)).tanh().sum().backward()
        opt.step()
        sizes.append(len(w._data.__dask_graph__()) + len(opt.state[id(w)]["exp_avg"]._data.__dask_graph__()))
    assert sizes[-1] == sizes[1], sizes  # persisted once per step: no growth
    assert sizes[-1] <= 8


@pytest.mark.parametrize("make", [lambda ps: optim.Adam(ps, lr=0.05, weight_decay=0.1),
                                  lambda ps: optim.AdamW(ps, lr=0.05),
                                  lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_optimizer_rules_run_as_one_task_per_block_with_numpys_bits(make, dtype):
    """An elementwise rule on dask is one task per block of the parameter (Backend.apply_update),
    not a task per op, and gives the numpy backend's bits over several steps (parameters of one and
    of several row blocks)."""
    rng = np.random.default_rng(11)
    start = [rng.normal(size=(1, 3)).astype(dtype), rng.normal(size=(9, 2)).astype(dtype)]
    got = {}
    for backend in ("numpy", "dask"):
        ps = [pg.tensor(a, backend=backend, requires_grad=True) for a in start]
        opt = make(ps)
        for _ in range(3):
            opt.zero_grad()
            ((ps[0] * ps[0]).sum() + (ps[1].tanh() * ps[1]).sum()).backward()
            opt.step()
        got[backend] = [p.numpy() for p in ps]
    for a, b in zip(got["numpy"], got["dask"]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    # the last step's graph (before it was persisted) had one rule task per parameter block
    opt.zero_grad()
    ((ps[0] * ps[0]).sum() + (ps[1].tanh() * ps[1]).sum()).backward()
    pg.materialize(*(p.grad for p in ps))
    be = ps[0]._be
    saved, be.materialize = be.materialize, lambda arrays: list(arrays)
    try:
        opt.step()
    finally:
        be.materialize = saved
    keys = [k for p in ps for k in p.array.__dask_graph__() if str(k[0] if isinstance(k, tuple) else k)
            .startswith("optimizer-rule")]
    assert len(keys) == sum(len(p.array.chunks[0]) for p in ps) >= 3, keys


def test_numpy_of_a_computed_chunk_is_a_copy():
    """to_numpy fetches a computed single chunk without a graph; on an in-process cluster gather
    hands out the worker's own array, which snapshots and a step's undo share, so what the user
    gets must be a copy (a write into it changed a rollback's checkpoint, found by review)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=True):
        t = pg.tensor(np.arange(4.0).reshape(1, 4), backend="dask") * 1.0  # one row: one chunk
        pg.materialize(t)
        assert t.array.npartitions == 1
        got = t.numpy()
        got[0, 0] = 99.0
        np.testing.assert_array_equal(t.numpy(), np.arange(4.0).reshape(1, 4))


def test_a_zero_dim_parameter_steps_without_the_probes_warnings():
    """apply_update learns the rule's outputs from a run on empty blocks; a 0-d block cannot be
    empty, so the probe computes on one zero (float16 Adam: eps rounds to 0, 0/0): that must not
    warn where the numpy backend's step does not, nor raise under np.seterr(all="raise")."""
    import warnings

    got = {}
    for backend in ("numpy", "dask"):
        p = pg.tensor(np.float16(0.7), backend=backend, requires_grad=True)
        opt = optim.Adam([p], lr=0.01)
        with warnings.catch_warnings(record=True) as caught, np.errstate(all="raise"):
            warnings.simplefilter("always")
            for _ in range(2):
                opt.zero_grad()
                (p * p).sum().backward()
                opt.step()
        got[backend] = (p.numpy().tobytes(), [str(w.message) for w in caught])
    assert got["dask"] == got["numpy"]


def test_edge_shards_are_read_by_workers_and_match_gcn_norm(tmp_path, dask_plugin):
    n = 50
    ei = random_graph(n, 200, seed=8)
    ei = np.concatenate([ei, ei[:, :10]], axis=1)  # duplicates: summed, as from_edge_index does
    dask_plugin.write_edge_shards(ei, n, tmp_path / "g", partitions=2)
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["meta.json", "part-00000.npz", "part-00001.npz"]
    adj = dask_plugin.gcn_adjacency(tmp_path / "g", dtype=np.float64)
    ref = pg.gcn_norm(pg.from_edge_index(ei, n, dtype=np.float64))
    x = np.random.default_rng(9).normal(size=(n, 3))
    np.testing.assert_allclose((adj @ pg.tensor(x, backend="dask")).numpy(), (ref @ pg.tensor(x)).numpy(),
                               rtol=1e-12, atol=1e-12)
    assert adj.nnz == ref.nnz
    with pytest.raises(BackendError, match="lives on the workers"):
        adj.pattern.rows  # noqa: B018 - the client never holds the graph's index arrays


def test_shards_written_for_other_blocks_are_refused(tmp_path, dask_plugin):
    dask_plugin.write_edge_shards(random_graph(20, 40, seed=10), 20, tmp_path / "g", partitions=3)
    with pytest.raises(pg.errors.DataError, match="3 row blocks"):
        dask_plugin.load_edge_shards(tmp_path / "g")


def _cora_run(backend: str, epochs: int, dropout: float = 0.5, callback=None, model=None, opt=None):
    from polygrad import data as pdata

    ds = pdata.load_planetoid(PLANETOID, "cora")
    with pg.use_backend(backend):
        if model is None:
            pg.manual_seed(0)
            model = nn.GCN(ds.num_features, 16, 2, ds.num_classes, dropout=dropout, dtype=np.float64)
            opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                              {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=0.01)
        x = nn.csr_to_tensor(pdata.row_normalize(ds.x, dtype=np.float64))

        def loss_fn():
            return nn.cross_entropy(model(x, ds.edge_index), ds.y, mask=ds.train_mask)

        history = fit(model, opt, loss_fn, epochs, rollback_threshold=None, callback=callback)
    return np.array(history.losses), model, opt


def test_cora_gcn_losses_match_numpy():
    if not (PLANETOID / "ind.cora.x").exists():
        pytest.skip("Planetoid data not found")
    want, _, _ = _cora_run("numpy", 8)
    got, _, _ = _cora_run("dask", 8)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_killed_worker_mid_epoch_then_training_resumes(cluster_client):
    """SIGKILL a worker process while epochs run: each epoch completes (dask recomputes lost
    pieces) or fails with a polygrad BackendError; training then resumes from the last completed
    step with parameters intact (no dropout: the losses must equal an undisturbed run's)."""
    if not (PLANETOID / "ind.cora.x").exists():
        pytest.skip("Planetoid data not found")
    epochs = 10
    want, _, _ = _cora_run("numpy", epochs, dropout=0.0)
    pids = list(cluster_client.run(os.getpid).values())
    losses: list[float] = []
    params: list[list[np.ndarray]] = []
    state = {}

    def on_epoch(rec):
        losses.append(rec.loss)
        params.append([p.numpy() for p in state["model"].parameters()])
        if rec.epoch == 1:  # kill one worker while the next epoch's graph runs
            threading.Timer(0.05, os.kill, (pids[0], signal.SIGKILL)).start()

    from polygrad import data as pdata
    ds = pdata.load_planetoid(PLANETOID, "cora")
    with pg.use_backend("dask"):
        pg.manual_seed(0)
        model = nn.GCN(ds.num_features, 16, 2, ds.num_classes, dropout=0.0, dtype=np.float64)
        opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                          {"params": model.conv2.parameters(), "weight_decay": 0.0}], lr=0.01)
    state["model"] = model
    failures = 0
    while len(losses) < epochs:
        try:
            _cora_run("dask", epochs - len(losses), dropout=0.0, callback=on_epoch, model=model, opt=opt)
        except BackendError as exc:
            failures += 1
            assert failures <= 3, exc
            assert "dask" in str(exc)
            # the parameters are those of the last completed step
            for p, saved in zip(model.parameters(), params[-1]):
                np.testing.assert_array_equal(p.numpy(), saved)
    print(f"worker killed: {failures} failed step(s)")
    cluster_client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed process
    np.testing.assert_allclose(np.array(losses), want, rtol=1e-9)


def test_unreachable_scheduler_raises_naming_the_address(dask_plugin):
    with pytest.raises(BackendUnavailableError, match=r"tcp://127\.0\.0\.1:9.*within 1 s"):
        dask_plugin.connect(scheduler="tcp://127.0.0.1:9", timeout=1)


def _lost() -> np.ndarray:
    raise RuntimeError("worker lost its data")


def test_failed_step_is_a_polygrad_error_and_leaves_parameters_intact():
    import dask
    import dask.array as da

    w = pg.tensor(np.ones((4, 2)), backend="dask", requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    broken = pg.Tensor.from_backend(da.from_delayed(dask.delayed(_lost, pure=False)(), (4, 2),
                                                    dtype=np.float64), "dask")
    (w * broken).sum().backward()
    with pytest.raises(BackendError, match="dask.*resume"):
        opt.step()
    np.testing.assert_array_equal(w.numpy(), np.ones((4, 2)))  # the step did not half-happen


def test_cli_demo_joins_a_running_cluster_and_reports_the_backend(cluster_client, capsys):
    from polygrad.apps import cli

    address = cluster_client.scheduler.address
    assert cli.main(["demo", "gcn", "--backend", "dask", "--scheduler", address, "--epochs", "2",
                     "--json", "--no-progress"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["backend"] == "dask" and record["epochs"] == 2
    from distributed import default_client
    assert default_client() is cluster_client or cluster_client.status == "running"


def test_compiled_step_runs_eagerly_on_dask_and_the_demo_says_so(cluster_client, capsys):
    """The backend opts out of replay (supports_replay = False): a pg.compile'd step warns once
    and keeps giving the eager numbers, and the gcn demo's record says it was not compiled."""
    from polygrad.apps import cli

    w = pg.tensor(np.linspace(-1.0, 1.0, 8).reshape(4, 2), requires_grad=True, backend="dask")
    x = pg.tensor(np.arange(12.0).reshape(3, 4), backend="dask")
    f = pg.compile(lambda: (x @ w).sum(), warmup=0, pure=True)  # the replaying mode
    with pytest.warns(RuntimeWarning, match="does not support replay"):
        values = [float(f().item()) for _ in range(4)]
    assert values == [float((x @ w).sum().item())] * 4  # what the step gives eagerly
    assert f.stats["replays"] == 0
    address = cluster_client.scheduler.address
    with pytest.warns(RuntimeWarning, match="does not support replay"):
        assert cli.main(["demo", "gcn", "--backend", "dask", "--scheduler", address, "--epochs", "5",
                         "--json", "--no-progress", "--compile"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["backend"] == "dask" and record["compiled"] is False


# -- the edges: hostile shards, wrong ports, nothing started behind the user's back (issue 23) ------
# Every server these tests start listens on 127.0.0.1 only, every loop is bounded, every connect
# has a timeout.

def _shards(tmp_path, dask_plugin, n=20, e=40, seed=11):
    """Valid 2-block shards of a random graph (the ones the tests then damage)."""
    return dask_plugin.write_edge_shards(random_graph(n, e, seed), n, tmp_path / "g", partitions=2)


def _rewrite(where: Path, i: int, **arrays) -> None:
    np.savez(where / f"part-{i:05d}.npz", **arrays)


@pytest.mark.parametrize("bad_col", [20, 25, -1])
def test_shard_column_ids_outside_the_graph_are_refused(tmp_path, dask_plugin, bad_col):
    """A column id >= N or < 0 used to load silently and spill into other rows (key = row * N + col)."""
    where = _shards(tmp_path, dask_plugin)
    with np.load(where / "part-00000.npz") as f:
        rows, cols = f["rows"], f["cols"].copy()
    cols[0] = bad_col
    _rewrite(where, 0, rows=rows, cols=cols)
    with pytest.raises(pg.errors.DataError, match=r"part-00000.*column ids outside \[0, 20\)"):
        dask_plugin.load_edge_shards(where)


def _damaged(kind: str, where: Path) -> None:
    part = where / "part-00001.npz"
    with np.load(part) as f:
        rows, cols = f["rows"], f["cols"]
    if kind == "missing":
        part.unlink()
    elif kind == "truncated":
        part.write_bytes(part.read_bytes()[:40])
    elif kind == "not-a-zip":
        part.write_text("hello")
    elif kind == "float-ids":
        _rewrite(where, 1, rows=rows.astype(np.float64), cols=cols.astype(np.float64))
    elif kind == "lengths-differ":
        _rewrite(where, 1, rows=rows, cols=cols[:-1])
    elif kind == "no-cols":
        _rewrite(where, 1, rows=rows)
    elif kind == "2-d":
        _rewrite(where, 1, rows=rows, cols=np.stack([cols, cols]))
    elif kind == "values-length":
        _rewrite(where, 1, rows=rows, cols=cols, values=np.ones(rows.shape[0] + 1))


@pytest.mark.parametrize("kind", ["missing", "truncated", "not-a-zip", "float-ids", "lengths-differ", "no-cols",
                                  "2-d", "values-length"])
def test_damaged_shards_are_a_data_error_naming_the_file(tmp_path, dask_plugin, kind):
    where = _shards(tmp_path, dask_plugin)
    _damaged(kind, where)
    with pytest.raises(pg.errors.DataError, match="part-00001"):
        dask_plugin.load_edge_shards(where)


def test_meta_json_with_ten_trillion_nodes_is_refused_before_any_worker_allocates(tmp_path, dask_plugin):
    """A worker allocates row pointers per row of its block: 5e12 rows used to be a raw MemoryError
    (or a 40 TB allocation attempt) on the workers."""
    ei = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])       # every edge in the first block, either way
    where = dask_plugin.write_edge_shards(ei, 20, tmp_path / "g", partitions=2)
    meta = json.loads((where / "meta.json").read_text())
    meta.update(num_nodes=10**13, bounds=[0, 5 * 10**12, 10**13])
    (where / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(pg.errors.DataError, match="meta.json declares num_nodes=10000000000000"):
        dask_plugin.load_edge_shards(where)


@pytest.mark.parametrize("edit", [
    {"num_nodes": 20.0}, {"num_nodes": True}, {"num_nodes": -1}, {"num_nodes": "20"},
    {"bounds": [0, 15, 10]}, {"bounds": [0, 10.5, 20]}, {"bounds": None}, {"bounds": [0, 10, 19]},
])
def test_hostile_meta_json_is_a_data_error(tmp_path, dask_plugin, edit):
    where = _shards(tmp_path, dask_plugin)
    meta = json.loads((where / "meta.json").read_text())
    meta.update(edit)
    (where / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(pg.errors.DataError, match="meta.json"):
        dask_plugin.load_edge_shards(where)


@pytest.mark.parametrize("text", ["[1, 2]", "{}", "not json", '"polygrad-edge-shards"'])
def test_meta_json_that_is_not_an_object_is_a_data_error(tmp_path, dask_plugin, text):
    where = _shards(tmp_path, dask_plugin)
    (where / "meta.json").write_text(text)
    with pytest.raises(pg.errors.DataError):
        dask_plugin.load_edge_shards(where)


def test_missing_shard_directory_is_a_data_error(tmp_path, dask_plugin):
    with pytest.raises(pg.errors.DataError, match="not an edge-shard directory"):
        dask_plugin.load_edge_shards(tmp_path / "nowhere")


class _Server:
    """A TCP server on 127.0.0.1 (an OS-chosen port) that is not a dask scheduler: ``greeting``
    is sent on accept (an HTTP reply read as a dask frame length is ~3 EiB), or nothing (an HTTP
    server waits for a request; dask waited for its handshake)."""

    def __init__(self, greeting: bytes = b"") -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.greeting, self.stop, self.conns = greeting, threading.Event(), []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for c in self.conns:
            c.close()
        self.sock.close()


def _http_server():
    """A real HTTP server (the dashboard's kind) on 127.0.0.1, in a thread."""
    import http.server

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return srv


def _connect_fails_quickly(dask_plugin, address: str, timeout: float = 2.0) -> str:
    """connect() raises BackendUnavailableError naming ``address`` well within a bound (a thread
    with a join timeout: a hang fails the test instead of hanging the suite)."""
    outcome: dict = {}

    def attempt():
        try:
            dask_plugin.connect(scheduler=address, timeout=timeout)
            outcome["result"] = "connected"
        except BaseException as exc:  # noqa: BLE001 - recorded and checked below
            outcome["result"] = exc

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout + 30)   # generous: a loaded machine, never a hang
    assert not t.is_alive(), f"connect({address!r}, timeout={timeout}) hung"
    exc = outcome["result"]
    assert isinstance(exc, BackendUnavailableError), repr(exc)
    assert address in str(exc) and "dask" in str(exc)
    return str(exc)


def test_connect_to_an_http_server_fails_within_the_timeout(dask_plugin):
    srv = _http_server()
    try:
        message = _connect_fails_quickly(dask_plugin, f"tcp://127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
        srv.server_close()
    assert "HTTP" in message or "handshake" in message


@pytest.mark.parametrize("greeting", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\xff" * 64, b""])
def test_connect_to_a_server_that_speaks_something_else(dask_plugin, greeting):
    """An HTTP reply's first 8 bytes used to become a ~3 EiB frame length (raw MemoryError)."""
    with _Server(greeting) as srv:
        _connect_fails_quickly(dask_plugin, srv.address)


@pytest.mark.parametrize("address", ["nonsense", "tcp://127.0.0.1", "tcp://127.0.0.1:notaport",
                                     "tcp://127.0.0.1:99999", "", 8786, b"tcp://127.0.0.1:8786"])
def test_connect_to_a_non_address_is_a_polygrad_error(dask_plugin, address):
    with pytest.raises(BackendUnavailableError, match="dask scheduler"):
        dask_plugin.connect(scheduler=address, timeout=1)


def test_retry_after_a_mistyped_address_never_hangs(cluster_client, dask_plugin):
    """Six rounds of: a wrong port (an HTTP server), then the right address; each bounded."""
    from distributed import Client

    srv = _http_server()
    right = cluster_client.scheduler.address
    try:
        for _ in range(6):
            _connect_fails_quickly(dask_plugin, f"tcp://127.0.0.1:{srv.server_address[1]}", timeout=1.0)
            joined = dask_plugin.connect(scheduler=right, timeout=TIMEOUT)
            assert isinstance(joined, Client) and joined.status == "running"
            assert joined.submit(int, "7").result(timeout=TIMEOUT) == 7
            joined.close()
    finally:
        srv.shutdown()
        srv.server_close()
    from distributed import default_client
    assert default_client().scheduler.address == right  # the default is again a client of the cluster


def test_listing_backends_starts_nothing():
    """pg.list_backends() probes the backend (from_numpy/to_numpy): it used to start an in-process
    cluster whose HTTP endpoints listened on 0.0.0.0:8787."""
    code = ("import json, os, psutil, polygrad as pg, polygrad_dask.cluster as c\n"
            "info = {b.name: b for b in pg.list_backends()}\n"
            "x = pg.tensor([[1.0, 2.0]], backend='dask')\n"
            "assert (x * 2).numpy().tolist() == [[2.0, 4.0]]\n"
            "conns = [c_.laddr for c_ in psutil.Process().net_connections('inet') if c_.status == 'LISTEN']\n"
            "print(json.dumps({'available': info['dask'].available, 'listening': conns,\n"
            "                  'started': c.running()}))\n")
    proc = _run_python(code)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"available": True, "listening": [], "started": False}, out


def _run_python(code: str):
    import subprocess

    env = dict(os.environ)
    # the polygrad_dask this process imported (installed, or the source tree's)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(polygrad_dask.__file__)),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_clusters_started_here_listen_on_loopback_only():
    """The in-process cluster (first use without a client) and connect(workers=N)."""
    code = ("import json, os, psutil, polygrad_dask.cluster as c\n"
            "def listening():\n"
            "    ps = [psutil.Process()] + psutil.Process().children(recursive=True)\n"
            "    return sorted({a.laddr.ip for p in ps for a in p.net_connections('inet') if a.status == 'LISTEN'})\n"
            "own = c.client()\n"
            "inproc = listening()\n"
            "c.close(own)\n"
            "local = c.connect(workers=1, timeout=120)\n"
            "local.wait_for_workers(1, timeout=120)\n"
            "multi = listening()\n"
            "c.close(local)\n"
            "print(json.dumps({'inproc': inproc, 'processes': multi}))\n")
    out = json.loads(_run_python(code).stdout.strip().splitlines()[-1])
    assert out["inproc"] and out["processes"], out        # something listens, and only on loopback
    assert set(out["inproc"]) | set(out["processes"]) == {"127.0.0.1"}, out
