"""Full-graph GCN on a Dask cluster (polygrad-dask) vs the numpy backend in one process.

The graph is a uniform random graph (default 1M nodes / 10M edge_index columns, F=64 float32
features, GCN 64 -> 16 -> 8).  Three processes, so each peak RSS is its own:

* **numpy anchor**: builds the graph, features and labels in memory and trains on the numpy
  backend; its epoch time and peak RSS are the anchors;
* a third process writes the graph as **edge shards** (one file per row block);
* **dask client**: starts a LocalCluster of 2 worker processes, loads the normalised adjacency
  from the shards *on the workers* (``polygrad_dask.gcn_adjacency``), draws the features there,
  and trains the same model with ``fit``.  It reports the epoch time, the peak RSS of each worker
  and of the client (which hosts the scheduler), and the bytes the workers fetched from each
  other per epoch (the sum of the workers' ``transfer_outgoing_bytes_total``, gathered through the
  scheduler with ``client.run``).

Targets (issue 13): worker peak <= 0.6x numpy peak, client peak <= 0.25x, epoch <= 1.5x numpy.
A projection scales the measured worker memory and traffic to 100M nodes / 1B edges (the same
nodes:edges ratio, so everything scales by the same factor).  Sizes: POLYGRAD_DASK_BENCH_NODES,
_EDGES, _FEATURES, _EPOCHS override the defaults; ``--quick`` uses 100k / 1M.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import optional_import, register, skipped_row

HIDDEN, CLASSES, SEED = 16, 8, 0
#: memory one worker machine offers the projection (GB), and the share usable by data
PROJECTION_WORKER_GB, PROJECTION_USABLE = 64, 0.8


def _sizes(quick: bool) -> dict:
    env = os.environ.get
    return {"nodes": int(env("POLYGRAD_DASK_BENCH_NODES", 100_000 if quick else 1_000_000)),
            "edges": int(env("POLYGRAD_DASK_BENCH_EDGES", 1_000_000 if quick else 10_000_000)),
            "features": int(env("POLYGRAD_DASK_BENCH_FEATURES", 64)),
            "epochs": int(env("POLYGRAD_DASK_BENCH_EPOCHS", 2 if quick else 3))}


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _graph(s: dict):
    from polygrad import data as pdata
    return pdata.random_graph(s["nodes"], s["edges"], seed=SEED)


def _labels(n: int):
    import numpy as np
    return np.random.default_rng(SEED + 1).integers(0, CLASSES, size=n)


def _one_hot(labels):
    """Class-probability targets: the cross-entropy is then elementwise over row blocks (integer
    targets need a per-row gather, whose index arrays the client would build every epoch)."""
    import numpy as np
    return np.eye(CLASSES, dtype=np.float32)[labels]


def _train(model_x, adj, labels, epochs: int) -> list[float]:
    """``epochs + 1`` epochs of ``fit`` (the first is warm-up); the timed epochs' seconds."""
    import polygrad as pg
    from polygrad import nn, optim
    from polygrad.apps.train import fit

    x = model_x
    pg.manual_seed(SEED)
    conv1 = nn.GCNConv(x.shape[1], HIDDEN, normalize=False, backend=x.backend)
    conv2 = nn.GCNConv(HIDDEN, CLASSES, normalize=False, backend=x.backend)

    class Two(nn.Module):
        def __init__(self):
            self.conv1, self.conv2 = conv1, conv2

        def forward(self):
            return conv2.propagate(conv1.propagate(x, adj).relu(), adj)

    model = Two()
    opt = optim.Adam(model.parameters(), lr=0.01)
    history = fit(model, opt, lambda: nn.cross_entropy(model(), labels), epochs + 1, rollback_threshold=None)
    return history.epoch_seconds[1:]


def child_numpy(s: dict) -> dict:
    import numpy as np
    import polygrad as pg

    with pg.use_backend("numpy"):
        ei = _graph(s)
        adj = pg.gcn_norm(pg.from_edge_index(ei, s["nodes"]))
        del ei
        x = pg.tensor(np.random.default_rng(SEED).standard_normal((s["nodes"], s["features"]), dtype=np.float32))
        seconds = _train(x, adj, pg.tensor(_one_hot(_labels(s["nodes"]))), s["epochs"])
    return {"epoch_s": float(np.median(seconds)), "peak_rss_mb": _peak_rss_mb()}


def _worker_stats(dask_worker=None) -> dict:
    import psutil
    return {"peak_rss_mb": _peak_rss_mb(), "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "sent": dask_worker.transfer_outgoing_bytes_total}


def child_dask(s: dict, shards: str) -> dict:
    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster

    import polygrad as pg
    import polygrad_dask

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                           memory_limit=0)
    client = Client(cluster, set_as_default=True)
    polygrad_dask.chunks.set_partitions(2)
    try:
        idle = client.run(_worker_stats)  # a worker's own footprint before any graph data
        adj = polygrad_dask.gcn_adjacency(shards, dtype=np.float32)
        chunks = polygrad_dask.chunks.chunks_for((s["nodes"], s["features"]))
        feats = da.random.RandomState(SEED).standard_normal((s["nodes"], s["features"]), chunks=chunks)
        x = pg.Tensor.from_backend(feats.astype(np.float32), "dask")  # drawn by the workers
        pg.materialize(x)
        labels = da.from_array(_labels(s["nodes"]), chunks=chunks[:1])
        target = pg.Tensor.from_backend((labels[:, None] == np.arange(CLASSES)).astype(np.float32), "dask")
        pg.materialize(target)
        del labels
        before = client.run(_worker_stats)
        seconds = _train(x, adj, target, s["epochs"])
        after = client.run(_worker_stats)
        moved = sum(after[w]["sent"] - before[w]["sent"] for w in after) / (s["epochs"] + 1)
        return {"epoch_s": float(np.median(seconds)), "client_peak_rss_mb": _peak_rss_mb(),
                "worker_peak_rss_mb": sorted(round(v["peak_rss_mb"], 1) for v in after.values()),
                "bytes_moved_per_epoch": moved,
                "worker_idle_rss_mb": max(v["rss_mb"] for v in idle.values())}
    finally:
        client.close()
        cluster.close()


def _spawn(kind: str, s: dict, shards: str = "") -> dict:
    cmd = [sys.executable, "-m", "benchmarks.dask_bench", kind, json.dumps(s), shards]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                         cwd=Path(__file__).resolve().parent.parent)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@register("dask", "GCN on a 2-worker Dask LocalCluster (polygrad-dask) vs numpy in one process")
def run(quick: bool) -> dict:
    if optional_import("polygrad_dask") is None or optional_import("distributed") is None:
        return {"rows": [skipped_row("polygrad_dask", section="dask")], "summary": {}}
    s = _sizes(quick)
    anchor = _spawn("numpy", s)
    with tempfile.TemporaryDirectory(prefix="polygrad-shards-") as tmp:
        # the shards are written by a child too: Linux keeps a process's peak RSS across exec, so
        # a client spawned by a parent that had held the graph would report the parent's peak
        _spawn("shards", s, str(Path(tmp) / "g"))
        got = _spawn("dask", s, str(Path(tmp) / "g"))
    np_peak = anchor["peak_rss_mb"]
    worker_ratio = max(got["worker_peak_rss_mb"]) / np_peak
    client_ratio = got["client_peak_rss_mb"] / np_peak
    epoch_ratio = got["epoch_s"] / anchor["epoch_s"]
    # projection: 100M nodes / 1B edges keeps the nodes:edges ratio of the default graph
    # a worker's idle footprint (Python, dask, polygrad) does not grow with the graph
    scale = 1e9 / s["edges"]
    idle = got["worker_idle_rss_mb"]
    data_mb = sum(p - idle for p in got["worker_peak_rss_mb"])
    worker_total_gb = data_mb / 1024 * scale
    workers_needed = math.ceil(worker_total_gb / (PROJECTION_WORKER_GB * PROJECTION_USABLE - idle / 1024))
    rows = [
        {"section": "numpy (1 process)", "epoch_s": round(anchor["epoch_s"], 3), "peak_rss_mb": round(np_peak, 1)},
        {"section": "dask (2 workers)", "epoch_s": round(got["epoch_s"], 3),
         "peak_rss_mb": f"workers {got['worker_peak_rss_mb']}, client {round(got['client_peak_rss_mb'], 1)}",
         "moved_mb_per_epoch": round(got["bytes_moved_per_epoch"] / 2**20, 1)},
    ]
    summary = {"nodes": s["nodes"], "edges": s["edges"], "features": s["features"],
               "numpy_epoch_s": anchor["epoch_s"], "dask_epoch_s": got["epoch_s"],
               "epoch_ratio": epoch_ratio, "numpy_peak_rss_mb": np_peak,
               "worker_peak_rss_mb": got["worker_peak_rss_mb"], "client_peak_rss_mb": got["client_peak_rss_mb"],
               "worker_peak_ratio": worker_ratio, "client_peak_ratio": client_ratio,
               "bytes_moved_per_epoch": got["bytes_moved_per_epoch"],
               "bytes_moved_per_edge_per_epoch": got["bytes_moved_per_epoch"] / s["edges"],
               "worker_idle_rss_mb": idle,
               "worker_data_bytes_per_edge": data_mb * 2**20 / s["edges"],
               "projection_1b_edges_bytes_moved_per_epoch": got["bytes_moved_per_epoch"] * scale,
               "projection_1b_edges_worker_memory_gb": worker_total_gb,
               "projection_1b_edges_workers": workers_needed,
               "projection_worker_gb": PROJECTION_WORKER_GB,
               "meets_worker_target": worker_ratio <= 0.6, "meets_client_target": client_ratio <= 0.25,
               "meets_epoch_target": epoch_ratio <= 1.5}
    return {"rows": rows, "summary": summary}


def child_shards(s: dict, path: str) -> dict:
    import polygrad_dask
    polygrad_dask.write_edge_shards(_graph(s), s["nodes"], path, partitions=2)
    return {"peak_rss_mb": _peak_rss_mb()}


if __name__ == "__main__":
    kind, sizes = sys.argv[1], json.loads(sys.argv[2])
    children = {"numpy": lambda: child_numpy(sizes), "shards": lambda: child_shards(sizes, sys.argv[3]),
                "dask": lambda: child_dask(sizes, sys.argv[3])}
    print(json.dumps(children[kind]()))
