"""Full-graph GCN on a Dask cluster (polygrad-dask) vs the numpy backend in one process.

The graph is a uniform random graph (default 1M nodes / 10M edge_index columns, F=64 float32
features, GCN 64 -> 16 -> 8).  Features and labels are drawn in fixed 65,536-row pieces, each from
its own seed, so the numpy run and any row-block split of the Dask runs see the same numbers and
their losses can be compared.  Each part runs in its own process, so each peak RSS is its own:

* **numpy anchor**: builds the graph, features and targets in memory and trains on the numpy
  backend (polygrad's kernels on every core); its epoch time, peak RSS and losses are the
  anchors.  It runs once before and once right after the 2-worker Dask run, and the epoch ratio
  is taken against the geometric mean of the two epochs (this machine's speed drifts within
  minutes; ``epoch_ratio_anchor_before`` is the ratio against the first alone).  The same run
  on one thread (``POLYGRAD_NUM_THREADS=1``) is reported for context;
* **shards**: a process writes the graph as edge shards (one file per row block) for 2 and for 3
  row blocks;
* **dask, 2 workers**: a LocalCluster of 2 worker processes loads GCN's normalised adjacency from
  the shards *on the workers* (``polygrad_dask.gcn_adjacency``), draws the features there, each
  row block on the worker holding the graph's rows, and trains the same model with ``fit``.  It
  reports the epoch time, each worker's and the client's peak RSS, and the bytes the workers sent
  each other per epoch (``transfer_outgoing_bytes_total``), against the halo the partition
  predicts (the remote rows the row blocks fetch: ``Partition.halo_rows``), and where the workers'
  time went (dask's task stream: compute seconds per task kind, time receiving data, and the
  share of 2 x wall the workers computed at all), and CPU seconds per epoch, which the machine's
  load does not inflate: the workers' (their task threads' by kind, and dask's own threads'), the
  client's and scheduler's, and the task threads' time off a CPU -- against the numpy process's
  CPU seconds per epoch and its parallel kernels' share;
* **dask, capped workers**: the same training on 4 workers whose ``memory_limit`` is 45% of the
  numpy run's peak (each holds less than the single-process run needs): the largest loss
  difference from numpy's.  (With 3 such workers a worker holding a third of the 1M-node graph
  reached ~350 MB of its 384 MB cap mid-step and the step failed with the memory-cap error naming
  it: a worker process starts at ~68 MB, and each holds its share of every activation);
* **sampled mini-batches**: GraphSAGE (2 layers, fan-outs 10, 5, 1,024 seeds per batch) trained
  on ``POLYGRAD_DASK_BENCH_BATCHES`` batches (default 30) drawn by ``polygrad.data.NeighborSampler``
  in one process holding the graph, and by ``polygrad_dask.DaskNeighborSampler`` over the same
  shards on 2 workers (sampling and feature rows on the workers holding the rows; the step on the
  client's numpy backend): time per batch (drawing it, and the whole step), the client's peak RSS,
  and the largest loss difference (0: the batches are the same).  POLYGRAD_DASK_BENCH_PREFETCH
  sets the sampler's ``prefetch`` (default 0);
* POLYGRAD_DASK_BENCH_TARGETS=classes trains the full-batch runs on the integer labels instead of
  their one-hot probabilities (the fused cross-entropy op, on numpy and on Dask);
* **ordered loading**: GCN on 2 workers from shards written with ``write_edge_shards(order=...)``
  (contiguous ids, reverse Cuthill-McKee, degree), on the uniform and the R-MAT graph at a fifth
  of the size (``POLYGRAD_DASK_BENCH_ORDER_SHARE``): the bytes the workers actually sent each
  other per epoch and the epoch time, next to the cut and halo ``halo_stats`` predicts, and the
  loss difference from the contiguous run (features permuted with the nodes: the same problem);
* **partitioning**: the edge cut and halo of contiguous row blocks against reverse Cuthill-McKee
  and degree orderings (``polygrad_dask.locality``) on the uniform graph and on the scale
  benchmark's R-MAT graph, for 2 and 4 row blocks, with the traffic a GCN epoch would move.

Targets (issue 24): epoch <= 1.3x numpy, worker peak <= 0.55x numpy peak, client <= 0.25x, <= 20
bytes moved per edge per epoch, capped losses equal to numpy's within 1e-5 (float32).  A projection
scales the measured worker memory and traffic to 100M nodes / 1B edges.  Sizes:
POLYGRAD_DASK_BENCH_NODES, _EDGES, _FEATURES, _EPOCHS override the defaults; ``--quick`` uses
100k / 1M.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import optional_import, register, skipped_row

HIDDEN, CLASSES, SEED = 16, 8, 0
#: rows per independently seeded piece of the features and labels (any row-block split agrees)
PIECE_ROWS = 1 << 16
#: memory one worker machine offers the projection (GB), and the share usable by data
PROJECTION_WORKER_GB, PROJECTION_USABLE = 64, 0.8
#: the capped run: workers, and each one's memory_limit as a share of the numpy run's peak
CAPPED_WORKERS, CAP_SHARE = 4, 0.45
#: smallest cap the capped run tries: a worker process starts near 70 MB (Python, numpy, scipy,
#: dask, polygrad) before it holds any data
MIN_CAP_MB = 200
#: the sampled runs: fan-outs, seeds per batch, batches timed (the first is warm-up)
FANOUTS, BATCH = (10, 5), 1024
#: columns every GCN epoch multiplies by A: forward 16 + 8, their transposes in the backward
SPMM_COLUMNS_PER_EPOCH = 2 * (HIDDEN + CLASSES)
ITEMSIZE = 4  # float32


def _sizes(quick: bool) -> dict:
    env = os.environ.get
    return {"nodes": int(env("POLYGRAD_DASK_BENCH_NODES", 100_000 if quick else 1_000_000)),
            "edges": int(env("POLYGRAD_DASK_BENCH_EDGES", 1_000_000 if quick else 10_000_000)),
            "features": int(env("POLYGRAD_DASK_BENCH_FEATURES", 64)),
            "epochs": int(env("POLYGRAD_DASK_BENCH_EPOCHS", 2 if quick else 3)),
            "batches": int(env("POLYGRAD_DASK_BENCH_BATCHES", 10 if quick else 30))}


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _graph(s: dict, kind: str = "uniform"):
    import numpy as np

    if kind == "rmat":
        from benchmarks.scale_bench import rmat_edge_index
        return rmat_edge_index(np.random.default_rng(SEED), s["nodes"], s["edges"])
    from polygrad import data as pdata
    return pdata.random_graph(s["nodes"], s["edges"], seed=SEED)


def _pieces(lo: int, hi: int, draw) -> list:
    """``draw(rng, rows)`` for the rows [lo, hi), from the fixed seeded pieces that overlap them."""
    import numpy as np

    out = []
    for piece in range(lo // PIECE_ROWS, (hi + PIECE_ROWS - 1) // PIECE_ROWS):
        start = piece * PIECE_ROWS
        block = draw(np.random.default_rng([SEED, piece]), PIECE_ROWS)
        out.append(block[max(lo - start, 0):hi - start])
    return out


def features_rows(lo: int, hi: int, features: int):
    """Rows [lo, hi) of the float32 features (the same numbers however the rows are split)."""
    import numpy as np

    parts = _pieces(lo, hi, lambda rng, n: rng.standard_normal((n, features), dtype=np.float32))
    return np.concatenate(parts) if parts else np.zeros((0, features), dtype=np.float32)


def targets_rows(lo: int, hi: int):
    """Rows [lo, hi) of the one-hot float32 targets.  Class-probability targets keep the
    cross-entropy elementwise over row blocks (integer targets need a per-row gather, whose index
    arrays the client would build every epoch)."""
    import numpy as np

    parts = _pieces(lo, hi, lambda rng, n: rng.integers(0, CLASSES, size=n))
    labels = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return np.eye(CLASSES, dtype=np.float32)[labels]


def full_batch_targets():
    """The rows function of the full-batch runs' targets: one-hot probabilities (the default) or,
    with ``POLYGRAD_DASK_BENCH_TARGETS=classes``, the integer labels -- the same classes, whose
    loss is one ``Op.CROSS_ENTROPY`` (on dask one task per row block; the client reads the labels
    every epoch and sends each block its own)."""
    kind = os.environ.get("POLYGRAD_DASK_BENCH_TARGETS", "probabilities")
    if kind not in ("probabilities", "classes"):
        raise SystemExit(f"POLYGRAD_DASK_BENCH_TARGETS must be 'probabilities' or 'classes', got {kind!r}")
    return labels_rows if kind == "classes" else targets_rows


def labels_rows(lo: int, hi: int):
    """Rows [lo, hi) of the integer labels (the classes of :func:`targets_rows`)."""
    import numpy as np

    parts = _pieces(lo, hi, lambda rng, n: rng.integers(0, CLASSES, size=n))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _train_sampled(sampler, features: int, batches: int) -> dict:
    """GraphSAGE on the client's numpy backend over ``batches`` of ``sampler``'s batches: the
    median seconds to draw a batch and to run a whole step (draw included), and the losses."""
    import time

    import numpy as np
    import polygrad as pg
    from polygrad import nn, optim

    pg.manual_seed(SEED)
    with pg.use_backend("numpy"):
        model = nn.GraphSAGE(features, HIDDEN, len(FANOUTS), CLASSES, dropout=0.0)
        opt = optim.Adam(model.parameters(), lr=0.01)
        it = iter(sampler)
        draw_s, step_s, losses, nodes = [], [], [], []
        for _ in range(batches + 1):
            start = time.perf_counter()
            sub = next(it)
            drawn = time.perf_counter()
            logits = model(pg.tensor(sub.x), sub.edge_index)
            loss = nn.cross_entropy(logits[np.arange(sub.batch_size)], sub.y[:sub.batch_size])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
            draw_s.append(drawn - start)
            step_s.append(time.perf_counter() - start)
            nodes.append(sub.num_nodes)
    return {"draw_s": float(np.median(draw_s[1:])), "step_s": float(np.median(step_s[1:])), "losses": losses,
            "batch_nodes": int(np.median(nodes)), "peak_rss_mb": _peak_rss_mb()}


def child_sampled_numpy(s: dict) -> dict:
    """The graph, features and labels in this process; the shards' orientation (a row samples
    among its columns: ``edge_index[[1, 0]]``), so the batches equal the Dask sampler's."""
    from polygrad.data import NeighborSampler

    ei = _graph(s)
    sampler = NeighborSampler(ei[[1, 0]], s["nodes"], list(FANOUTS), batch_size=BATCH, seed=SEED,
                              x=features_rows(0, s["nodes"], s["features"]), y=labels_rows(0, s["nodes"]))
    del ei
    return _train_sampled(sampler, s["features"], s["batches"])


def child_sampled_dask(s: dict, shards: str, workers: int) -> dict:
    """The graph read from the shards by the workers, features and labels drawn there; the client
    holds the seed pool and one batch."""
    import polygrad as pg
    import polygrad_dask

    client = polygrad_dask.connect(workers=workers)
    polygrad_dask.chunks.set_partitions(workers)
    try:
        rows = polygrad_dask.chunks.row_chunks(s["nodes"])
        make_x = functools.partial(_features_of, s["features"])
        x = pg.Tensor.from_backend(_on_workers(rows, make_x, make_x(0, 0)), "dask")
        y = pg.Tensor.from_backend(_on_workers(rows, labels_rows, labels_rows(0, 0)), "dask")
        pg.materialize(x)
        pg.materialize(y)
        sampler = polygrad_dask.DaskNeighborSampler.from_shards(
            shards, list(FANOUTS), batch_size=BATCH, seed=SEED, x=x, y=y,
            prefetch=int(os.environ.get("POLYGRAD_DASK_BENCH_PREFETCH", "0")))
        out = _train_sampled(sampler, s["features"], s["batches"])
        out["worker_peak_rss_mb"] = sorted(round(v["peak_rss_mb"], 1) for v in client.run(_worker_stats).values())
        out["block_mb"] = [round(b / 2**20, 1) for b in sampler.nbytes_per_block]
        return out
    finally:
        polygrad_dask.cluster.close(client)


def _train(model_x, adj, target, epochs: int) -> tuple[list[float], list[float], str]:
    """``epochs + 1`` epochs of ``fit`` (the first is warm-up): the timed epochs' seconds, every
    epoch's loss, and a SHA-256 of the trained parameters' bytes (runs that must agree bit for bit
    compare it)."""
    import hashlib

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
    history = fit(model, opt, lambda: nn.cross_entropy(model(), target), epochs + 1, rollback_threshold=None)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.numpy().tobytes())
    return history.epoch_seconds[1:], [float(v) for v in history.losses], digest.hexdigest()


def child_numpy(s: dict) -> dict:
    import numpy as np
    import polygrad as pg

    with pg.use_backend("numpy"):
        ei = _graph(s)
        adj = pg.gcn_norm(pg.from_edge_index(ei, s["nodes"]))
        del ei
        x = pg.tensor(features_rows(0, s["nodes"], s["features"]))
        target = pg.tensor(full_batch_targets()(0, s["nodes"]))
        cpu = _cpu_s()
        with _metered_numpy_kernels() as kernels:
            seconds, losses, _ = _train(x, adj, target, s["epochs"])
        cpu = (_cpu_s() - cpu) / (s["epochs"] + 1)
    return {"epoch_s": float(np.median(seconds)), "peak_rss_mb": _peak_rss_mb(), "losses": losses,
            "threads": pg.get_num_threads(), "cpu_s_per_epoch": cpu,
            "kernel_cpu_s_per_epoch": {k: round(v / (s["epochs"] + 1), 3) for k, v in kernels.items()}}


#: the numpy backend's multi-threaded kernels (``polygrad.backends.parallel``) metered by
#: :func:`_metered_numpy_kernels`: its SpMMs and the large dense products and elementwise ops
METERED_NUMPY_KERNELS = ("csr_spmm", "transposed_spmm", "matmul", "elementwise", "column_sums", "reduce_trailing")


@contextlib.contextmanager
def _metered_numpy_kernels():
    """Process CPU seconds (every thread) spent in each of the numpy backend's parallel kernels
    while the block runs: the numpy side of the CPU comparison with the Dask workers' task kinds.
    The kernels are looked up on their module at each call, so wrapping the module's functions
    meters them; the wrappers cost a few microseconds per call (tens of calls per epoch)."""
    from polygrad.backends import parallel

    spent: dict = {}
    originals = {name: getattr(parallel, name) for name in METERED_NUMPY_KERNELS}

    def metered(name: str, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            start = _cpu_s()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + _cpu_s() - start
        return run

    for name, fn in originals.items():
        setattr(parallel, name, metered(name, fn))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(parallel, name, fn)


def _cpu_s() -> float:
    """This process's CPU seconds (all threads: the client, and a LocalCluster's scheduler)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _worker_stats(dask_worker=None) -> dict:
    import dask
    import psutil
    times = psutil.Process().cpu_times()
    return {"peak_rss_mb": _peak_rss_mb(), "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "cpu_s": times.user + times.system,
            "sent": dask_worker.transfer_outgoing_bytes_total,
            "spill": dask.config.get("distributed.worker.memory.spill")}


def _on_workers(rows: tuple, make, probe) -> object:
    """A dask array whose row block ``i`` is ``make(lo, hi)``, computed on row block ``i``'s worker
    (``probe`` is ``make(0, 0)``: the dtype and trailing shape)."""
    import dask
    import dask.array as da
    from polygrad_dask import cluster

    bounds = [0]
    for r in rows:
        bounds.append(bounds[-1] + r)
    parts = []
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        with cluster.pinned(i):
            block = dask.delayed(make, pure=True)(lo, hi)
        parts.append(da.from_delayed(block, (hi - lo,) + probe.shape[1:], dtype=probe.dtype))
    return da.concatenate(parts) if len(parts) > 1 else parts[0]


def _features_of(features: int, lo: int, hi: int):
    return features_rows(lo, hi, features)


def child_dask(s: dict, shards: str, workers: int, memory_limit_mb: float) -> dict:
    import numpy as np

    import polygrad as pg
    import polygrad_dask

    limit = f"{int(memory_limit_mb)}MiB" if memory_limit_mb else 0
    client = polygrad_dask.connect(workers=workers, memory_limit=limit)
    polygrad_dask.chunks.set_partitions(workers)
    try:
        idle = client.run(_worker_stats)  # a worker's own footprint before any graph data
        adj = polygrad_dask.gcn_adjacency(shards, dtype=np.float32)
        rows = polygrad_dask.chunks.row_chunks(s["nodes"])
        make_x = functools.partial(_features_of, s["features"])
        x = pg.Tensor.from_backend(_on_workers(rows, make_x, make_x(0, 0)), "dask")
        pg.materialize(x)
        targets = full_batch_targets()
        target = pg.Tensor.from_backend(_on_workers(rows, targets, targets(0, 0)), "dask")
        pg.materialize(target)
        before = client.run(_worker_stats)
        metrics = _cluster_metrics(client)
        from distributed import get_task_stream

        import time

        start, client_cpu = time.perf_counter(), _cpu_s()
        with get_task_stream(client) as stream:
            seconds, losses, params = _train(x, adj, target, s["epochs"])
        wall = time.perf_counter() - start
        client_cpu = _cpu_s() - client_cpu
        after = client.run(_worker_stats)
        metrics = _metrics_delta(_cluster_metrics(client), metrics, s["epochs"] + 1)
        moved = sum(after[w]["sent"] - before[w]["sent"] for w in after) / (s["epochs"] + 1)
        halo = sum(getattr(adj.pattern, "partition").halo_rows().values())
        return {"epoch_s": float(np.median(seconds)), "client_peak_rss_mb": _peak_rss_mb(),
                "profile": {**_profile(stream.data, wall, s["epochs"] + 1, workers),
                            "worker_cpu_s_per_epoch": sum(after[w]["cpu_s"] - before[w]["cpu_s"] for w in after)
                            / (s["epochs"] + 1),
                            "client_cpu_s_per_epoch": client_cpu / (s["epochs"] + 1), **metrics},
                "worker_peak_rss_mb": sorted(round(v["peak_rss_mb"], 1) for v in after.values()),
                "bytes_moved_per_epoch": moved, "halo_rows": halo, "losses": losses, "params_sha256": params,
                "spill": sorted({str(v["spill"]) for v in after.values()}),
                "worker_idle_rss_mb": max(v["rss_mb"] for v in idle.values())}
    finally:
        polygrad_dask.cluster.close(client)


def _execute_metrics(dask_worker=None) -> dict:
    """A worker's cumulative per-task-kind execution metrics: ``{(kind, "thread-cpu" |
    "thread-noncpu"): seconds}`` -- the CPU time of the threads running tasks of that kind, and the
    rest of their wall time (waiting for a core held by another process, page faults served by the
    host, the GIL).  Read on the worker, not from the scheduler's copy, which lags a heartbeat."""
    out: dict = {}
    for key, value in dict(dask_worker.digests_total).items():
        # ("execute", span, kind, activity, unit)
        if isinstance(key, tuple) and len(key) >= 4 and key[0] == "execute" and key[-1] == "seconds" \
                and key[-2] in ("thread-cpu", "thread-noncpu"):
            out[(str(key[-3]), key[-2])] = out.get((str(key[-3]), key[-2]), 0.0) + float(value)
    return out


def _cluster_metrics(client) -> dict:
    """:func:`_execute_metrics` summed over the workers."""
    out: dict = {}
    for per_worker in client.run(_execute_metrics).values():
        for key, value in per_worker.items():
            out[key] = out.get(key, 0.0) + value
    return out


def _metrics_delta(after: dict, before: dict, epochs: int) -> dict:
    """Per epoch, from two :func:`_execute_metrics` snapshots: the workers' task CPU seconds and
    the seconds their task threads were not on a CPU, in all and for the ten costliest kinds."""
    cpu: dict = {}
    stalled = 0.0
    for (kind, what), value in after.items():
        delta = (value - before.get((kind, what), 0.0)) / epochs
        if what == "thread-cpu":
            cpu[kind] = cpu.get(kind, 0.0) + delta
        else:
            stalled += delta
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:10]
    return {"task_cpu_s_per_epoch": sum(cpu.values()), "task_noncpu_s_per_epoch": stalled,
            "task_cpu_s_per_epoch_by_kind": {k: round(v, 3) for k, v in top}}


def _profile(records: list, wall_s: float, epochs: int, workers: int) -> dict:
    """Where the workers' time went, per epoch (the warm-up one included), from dask's task
    stream, over ``wall_s`` seconds of ``epochs`` epochs: compute seconds by task
    kind (the key's prefix: ``_spmm_block``, ``matmul``, ...), seconds spent receiving data, and
    the busy share (compute over workers x wall: the rest is waiting for halos and the scheduler)."""
    import collections

    compute: collections.Counter = collections.Counter()
    tasks: collections.Counter = collections.Counter()
    transfer = 0.0
    for rec in records:
        key = rec["key"][0] if isinstance(rec["key"], tuple) else rec["key"]
        kind = str(key).rsplit("-", 1)[0]
        tasks[kind] += 1
        for span in rec["startstops"]:
            took = span["stop"] - span["start"]
            if span["action"] == "compute":
                compute[kind] += took
            elif span["action"] == "transfer":
                transfer += took
    busy = sum(compute.values())
    return {"tasks_per_epoch": len(records) / epochs, "busy_share": busy / max(workers * wall_s, 1e-9),
            "transfer_s_per_epoch": transfer / epochs,
            "compute_s_per_epoch": {k: round(v / epochs, 3) for k, v in compute.most_common(10)},
            "tasks_per_epoch_by_kind": {k: round(v / epochs, 1) for k, v in tasks.most_common()}}


def child_shards(s: dict, path: str, partitions: int, kind: str = "uniform", order: str = "contiguous") -> dict:
    import time

    import polygrad_dask

    ei = _graph(s, kind)
    start = time.perf_counter()
    polygrad_dask.write_edge_shards(ei, s["nodes"], path, partitions=partitions, order=order)
    seconds = time.perf_counter() - start
    perm = polygrad_dask.node_order(path)
    st = polygrad_dask.halo_stats(ei if perm is None else polygrad_dask.relabel(ei, perm), s["nodes"], partitions)
    return {"peak_rss_mb": _peak_rss_mb(), "write_s": seconds, "cut_fraction": st["cut_fraction"],
            "halo_rows": st["halo_rows"], "edge_imbalance": st["edge_imbalance"]}


def child_ordered(s: dict, shards: str) -> dict:
    """GCN on 2 workers from (possibly renumbered) shards, features and targets permuted with the
    nodes: the bytes the workers send each other per epoch, the epoch time, the losses."""
    import numpy as np

    import polygrad as pg
    import polygrad_dask

    client = polygrad_dask.connect(workers=2)
    polygrad_dask.chunks.set_partitions(2)
    try:
        perm = polygrad_dask.node_order(shards)
        perm = np.arange(s["nodes"]) if perm is None else perm
        adj = polygrad_dask.gcn_adjacency(shards, dtype=np.float32)
        x = pg.tensor(features_rows(0, s["nodes"], s["features"])[perm], backend="dask")
        target = pg.tensor(full_batch_targets()(0, s["nodes"])[perm], backend="dask")
        pg.materialize(x)
        pg.materialize(target)
        before = client.run(_worker_stats)
        seconds, losses, _ = _train(x, adj, target, s["epochs"])
        after = client.run(_worker_stats)
        moved = sum(after[w]["sent"] - before[w]["sent"] for w in after) / (s["epochs"] + 1)
        return {"epoch_s": float(np.median(seconds)), "bytes_moved_per_epoch": moved, "losses": losses,
                "halo_rows": sum(getattr(adj.pattern, "partition").halo_rows().values())}
    finally:
        polygrad_dask.cluster.close(client)


def ordered_loading(s: dict, tmp: str) -> list[dict]:
    """The ordered-loading rows: per graph and ordering, the prediction and the measured run."""
    share = float(os.environ.get("POLYGRAD_DASK_BENCH_ORDER_SHARE", "0.2"))
    small = dict(s, nodes=int(s["nodes"] * share), edges=2 * int(s["edges"] * share / 2))
    rows = []
    for kind in ("uniform", "rmat"):
        base = None
        for order in ("contiguous", "rcm", "degree"):
            where = str(Path(tmp) / f"{kind}-{order}")
            shard = _spawn("shards", small, where, "2", kind, order)
            got = _spawn("ordered", small, where)
            base = base or got
            rows.append({"graph": kind, "order": order, "nodes": small["nodes"], "edges": small["edges"],
                         "cut_fraction": round(shard["cut_fraction"], 4), "halo_rows": got["halo_rows"],
                         "edge_imbalance": round(shard["edge_imbalance"], 2),
                         "predicted_bytes_per_edge_epoch": round(got["halo_rows"] * SPMM_COLUMNS_PER_EPOCH * ITEMSIZE
                                                                 / small["edges"], 2),
                         "moved_bytes_per_edge_epoch": round(got["bytes_moved_per_epoch"] / small["edges"], 2),
                         "epoch_s": round(got["epoch_s"], 3), "write_s": round(shard["write_s"], 2),
                         "loss_gap_vs_contiguous": _loss_gap(got["losses"], base["losses"])})
    return rows


def child_partitioning(s: dict) -> dict:
    """Edge cut, halo rows and GCN traffic per edge per epoch of each ordering, per graph and
    row-block count (no cluster: the partition's arithmetic)."""
    import time

    from polygrad_dask import locality

    rows = []
    for kind in ("uniform", "rmat"):
        ei = _graph(s, kind)
        for method in locality.METHODS:
            start = time.perf_counter()
            order = locality.locality_order(ei, s["nodes"], method)
            seconds = time.perf_counter() - start
            relabelled = locality.relabel(ei, order)
            for parts in (2, 4):
                st = locality.halo_stats(relabelled, s["nodes"], parts)
                rows.append({"graph": kind, "order": method, "blocks": parts, "order_s": round(seconds, 2),
                             "cut_fraction": round(st["cut_fraction"], 4), "halo_rows": st["halo_rows"],
                             "edge_imbalance": round(st["edge_imbalance"], 2),
                             "bytes_per_edge_epoch": round(st["halo_rows"] * SPMM_COLUMNS_PER_EPOCH * ITEMSIZE
                                                           / s["edges"], 2)})
            del relabelled, order
        del ei
    return {"rows": rows}


def _spawn(kind: str, s: dict, *args: str, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.dask_bench", kind, json.dumps(s), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                         cwd=Path(__file__).resolve().parent.parent, env=None if env is None else {**os.environ, **env})
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loss_gap(got: list[float], want: list[float]) -> float:
    """Largest relative difference between two runs' losses, epoch by epoch."""
    return max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(got, want))


def _projection(s: dict, got: dict) -> dict:
    """100M nodes / 1B edges (the default graph's nodes:edges ratio) from the measured per-edge
    worker memory and traffic; a worker's idle footprint (Python, dask, polygrad) does not grow
    with the graph."""
    scale = 1e9 / s["edges"]
    idle = got["worker_idle_rss_mb"]
    data_mb = sum(p - idle for p in got["worker_peak_rss_mb"])
    worker_total_gb = data_mb / 1024 * scale
    workers = math.ceil(worker_total_gb / (PROJECTION_WORKER_GB * PROJECTION_USABLE - idle / 1024))
    # with P row blocks of a uniform graph each block fetches nearly every remote row it has an
    # edge to: at most the cut edges, (1 - 1/P) of all edges
    cut_bound = (1 - 1 / max(workers, 2)) * SPMM_COLUMNS_PER_EPOCH * ITEMSIZE
    return {"worker_data_bytes_per_edge": data_mb * 2**20 / s["edges"],
            "projection_1b_edges_bytes_moved_per_epoch": got["bytes_moved_per_epoch"] * scale,
            "projection_1b_edges_bytes_moved_per_epoch_cut_bound": cut_bound * 1e9,
            "projection_1b_edges_worker_memory_gb": worker_total_gb,
            "projection_1b_edges_workers": workers, "projection_worker_gb": PROJECTION_WORKER_GB}


@register("dask", "GCN on Dask LocalClusters (polygrad-dask: 2 workers, 4 capped workers) vs numpy in one process")
def run(quick: bool) -> dict:
    if optional_import("polygrad_dask") is None or optional_import("distributed") is None:
        return {"rows": [skipped_row("polygrad_dask", section="dask")], "summary": {}}
    s = _sizes(quick)
    anchor = _spawn("numpy", s)
    # context, not the anchor: numpy on one thread (the anchor runs polygrad's kernels on every core)
    one_thread = _spawn("numpy", s, env={"POLYGRAD_NUM_THREADS": "1"})
    np_peak = anchor["peak_rss_mb"]
    cap_mb = CAP_SHARE * np_peak
    with tempfile.TemporaryDirectory(prefix="polygrad-shards-") as tmp:
        # the shards are written by a child too: Linux keeps a process's peak RSS across exec, so
        # a client spawned by a parent that had held the graph would report the parent's peak
        _spawn("shards", s, str(Path(tmp) / "g2"), "2")
        got = _spawn("dask", s, str(Path(tmp) / "g2"), "2", "0")
        # the anchor again, right after: this machine's speed drifts within minutes (the same
        # kernel 77 ms, then 142 ms ten minutes later), and the Dask run starts a minute or more
        # after the first anchor; the ratio is taken against both (geometric mean), which cancels
        # a drift that is linear in time, and each side is reported
        after = _spawn("numpy", s)
        sampled_np = _spawn("sampled_numpy", s)
        sampled = _spawn("sampled_dask", s, str(Path(tmp) / "g2"), "2")
        ordered = ordered_loading(s, tmp)
        capped: dict
        if cap_mb < MIN_CAP_MB:
            capped = {"error": f"skipped: a cap of {cap_mb:.0f} MB is under {MIN_CAP_MB} MB (a worker process "
                               "starts near 70 MB, before any data): run at full size"}
        else:
            _spawn("shards", s, str(Path(tmp) / "g3"), str(CAPPED_WORKERS))
            try:
                capped = _spawn("dask", s, str(Path(tmp) / "g3"), str(CAPPED_WORKERS), str(cap_mb))
            except RuntimeError as exc:  # reported, not hidden: the error names the worker and sizes
                capped = {"error": str(exc)[-600:]}
    parts = _spawn("partitioning", s)["rows"]
    worker_ratio = max(got["worker_peak_rss_mb"]) / np_peak
    client_ratio = got["client_peak_rss_mb"] / np_peak
    numpy_epoch = math.sqrt(anchor["epoch_s"] * after["epoch_s"])
    epoch_ratio = got["epoch_s"] / numpy_epoch
    prof, np_kernels = got["profile"], anchor["kernel_cpu_s_per_epoch"]
    dask_cpu = prof["worker_cpu_s_per_epoch"] + prof["client_cpu_s_per_epoch"]
    per_edge = got["bytes_moved_per_epoch"] / s["edges"]
    rows = [
        {"section": f"numpy (1 process, {anchor['threads']} threads)", "epoch_s": round(numpy_epoch, 3),
         "status": f"before the Dask run {anchor['epoch_s']:.3f} s, after it {after['epoch_s']:.3f} s (geometric mean)",
         "peak_rss_mb": round(np_peak, 1), "cpu_s_per_epoch": round(anchor["cpu_s_per_epoch"], 2)},
        {"section": "numpy: where its CPU went",
         "status": "CPU s/epoch (all threads) " + ", ".join(f"{k} {v}" for k, v in np_kernels.items())
                   + f", rest {anchor['cpu_s_per_epoch'] - sum(np_kernels.values()):.3f}"},
        {"section": f"numpy (1 process, {one_thread['threads']} thread: context)",
         "epoch_s": round(one_thread["epoch_s"], 3)},
        {"section": "dask (2 workers)", "epoch_s": round(got["epoch_s"], 3),
         "peak_rss_mb": f"workers {got['worker_peak_rss_mb']}, client {round(got['client_peak_rss_mb'], 1)}",
         "moved_mb_per_epoch": round(got["bytes_moved_per_epoch"] / 2**20, 1),
         "loss_gap": f"{_loss_gap(got['losses'], anchor['losses']):.1e}"},
        {"section": "dask (2 workers): where the workers' time went",
         "status": f"busy {got['profile']['busy_share']:.0%} of 2 x wall, "
                   f"{got['profile']['tasks_per_epoch']:.0f} tasks/epoch, receiving "
                   f"{got['profile']['transfer_s_per_epoch']:.2f} s/epoch; compute s/epoch "
                   + ", ".join(f"{k} {v}" for k, v in list(got["profile"]["compute_s_per_epoch"].items())[:6])},
        {"section": "dask (2 workers): CPU",
         "cpu_s_per_epoch": round(dask_cpu, 2),
         "status": f"workers {prof['worker_cpu_s_per_epoch']:.2f} s/epoch (tasks {prof['task_cpu_s_per_epoch']:.2f}, "
                   f"the rest dask's own threads), client and scheduler {prof['client_cpu_s_per_epoch']:.2f}; "
                   f"task threads off a CPU {prof['task_noncpu_s_per_epoch']:.2f} s/epoch; task CPU s/epoch "
                   + ", ".join(f"{k} {v}" for k, v in list(prof["task_cpu_s_per_epoch_by_kind"].items())[:6])},
    ]
    summary = {"nodes": s["nodes"], "edges": s["edges"], "features": s["features"],
               "numpy_epoch_s": numpy_epoch, "numpy_epoch_s_before": anchor["epoch_s"],
               "numpy_epoch_s_after": after["epoch_s"], "dask_epoch_s": got["epoch_s"],
               "epoch_ratio_anchor_before": got["epoch_s"] / anchor["epoch_s"],
               "numpy_1_thread_epoch_s": one_thread["epoch_s"],
               "numpy_cpu_s_per_epoch": anchor["cpu_s_per_epoch"],
               "numpy_kernel_cpu_s_per_epoch": np_kernels, "dask_cpu_s_per_epoch": dask_cpu,
               "epoch_ratio_vs_1_thread_numpy": got["epoch_s"] / one_thread["epoch_s"],
               "epoch_ratio": epoch_ratio, "numpy_peak_rss_mb": np_peak,
               "worker_peak_rss_mb": got["worker_peak_rss_mb"], "client_peak_rss_mb": got["client_peak_rss_mb"],
               "worker_peak_ratio": worker_ratio, "client_peak_ratio": client_ratio,
               "bytes_moved_per_epoch": got["bytes_moved_per_epoch"],
               "bytes_moved_per_edge_per_epoch": per_edge,
               "halo_bytes_per_edge_per_epoch": got["halo_rows"] * SPMM_COLUMNS_PER_EPOCH * ITEMSIZE / s["edges"],
               "loss_gap_2_workers": _loss_gap(got["losses"], anchor["losses"]),
               "dask_profile": got["profile"],
               "worker_idle_rss_mb": got["worker_idle_rss_mb"], **_projection(s, got),
               "meets_worker_target": worker_ratio <= 0.55, "meets_client_target": client_ratio <= 0.25,
               "meets_epoch_target": epoch_ratio <= 1.3, "meets_traffic_target": per_edge <= 20}
    cap_row: dict = {"section": f"dask ({CAPPED_WORKERS} workers, memory_limit {cap_mb:.0f} MB)"}
    if "error" in capped:
        cap_row["status"] = capped["error"]
        summary["capped_error"] = capped["error"]
    else:
        gap = _loss_gap(capped["losses"], anchor["losses"])
        cap_row.update({"epoch_s": round(capped["epoch_s"], 3),
                        "peak_rss_mb": f"workers {capped['worker_peak_rss_mb']}",
                        "moved_mb_per_epoch": round(capped["bytes_moved_per_epoch"] / 2**20, 1),
                        "loss_gap": f"{gap:.1e}"})
        summary.update({"capped_workers": CAPPED_WORKERS, "capped_memory_limit_mb": cap_mb,
                        "capped_worker_peak_rss_mb": capped["worker_peak_rss_mb"],
                        "capped_epoch_s": capped["epoch_s"], "capped_loss_gap": gap,
                        "capped_spill": capped["spill"], "meets_capped_target": gap <= 1e-5})
    rows.append(cap_row)
    sampled_gap = _loss_gap(sampled["losses"], sampled_np["losses"])
    rows += [{"section": "sampled, numpy (1 process)", "draw_s": round(sampled_np["draw_s"], 4),
              "step_s": round(sampled_np["step_s"], 4), "peak_rss_mb": round(sampled_np["peak_rss_mb"], 1),
              "batch_nodes": sampled_np["batch_nodes"]},
             {"section": "sampled, dask (2 workers)", "draw_s": round(sampled["draw_s"], 4),
              "step_s": round(sampled["step_s"], 4),
              "peak_rss_mb": f"workers {sampled['worker_peak_rss_mb']}, client {round(sampled['peak_rss_mb'], 1)}",
              "batch_nodes": sampled["batch_nodes"], "loss_gap": f"{sampled_gap:.1e}"}]
    summary.update({"sampled_fanouts": list(FANOUTS), "sampled_batch_size": BATCH, "sampled_batches": s["batches"],
                    "sampled_numpy_step_s": sampled_np["step_s"], "sampled_dask_step_s": sampled["step_s"],
                    "sampled_step_ratio": sampled["step_s"] / sampled_np["step_s"],
                    "sampled_numpy_draw_s": sampled_np["draw_s"], "sampled_dask_draw_s": sampled["draw_s"],
                    "sampled_numpy_peak_rss_mb": sampled_np["peak_rss_mb"],
                    "sampled_dask_client_peak_rss_mb": sampled["peak_rss_mb"],
                    "sampled_dask_client_peak_ratio": sampled["peak_rss_mb"] / sampled_np["peak_rss_mb"],
                    "sampled_dask_worker_peak_rss_mb": sampled["worker_peak_rss_mb"],
                    "sampled_dask_block_mb": sampled["block_mb"], "sampled_loss_gap": sampled_gap})
    for o in ordered:
        rows.append({"section": f"ordered loading {o['graph']} {o['order']} x2 ({o['nodes']} nodes)",
                     **{k: v for k, v in o.items() if k not in ("graph", "order", "nodes")}})
    summary["ordered_loading"] = ordered
    for p in parts:
        rows.append({"section": f"partition {p['graph']} {p['order']} x{p['blocks']}",
                     "cut_fraction": p["cut_fraction"], "halo_rows": p["halo_rows"],
                     "edge_imbalance": p["edge_imbalance"], "bytes_per_edge_epoch": p["bytes_per_edge_epoch"],
                     "order_s": p["order_s"]})
    summary["partitioning"] = parts
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":
    kind, sizes, rest = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    children = {"numpy": lambda: child_numpy(sizes),
                "shards": lambda: child_shards(sizes, rest[0], int(rest[1]), *rest[2:]),
                "ordered": lambda: child_ordered(sizes, rest[0]),
                "dask": lambda: child_dask(sizes, rest[0], int(rest[1]), float(rest[2])),
                "partitioning": lambda: child_partitioning(sizes),
                "sampled_numpy": lambda: child_sampled_numpy(sizes),
                "sampled_dask": lambda: child_sampled_dask(sizes, rest[0], int(rest[1]))}
    print(json.dumps(children[kind]()))
