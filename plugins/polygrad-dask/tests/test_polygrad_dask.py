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
from polygrad.tensor import sddmm, segment_sum, spmm  # noqa: E402
from polygrad.testing import check_grads  # noqa: E402
from polygrad.testing.conformance import run_conformance  # noqa: E402
from polygrad.train import fit  # noqa: E402

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


@pytest.fixture(scope="session")
def cluster_client(dask_plugin):
    """A LocalCluster of 2 worker processes (the default client while it lives), 2 row blocks."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
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
    """Whether polygrad loaded polygrad-dask through its entry point (not registered by hand)."""
    from polygrad.registry import registry
    registry.load()
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
    from polygrad import cli

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
    from polygrad import cli

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
