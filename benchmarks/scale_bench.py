"""``python -m benchmarks scale``: a 2-layer GCN on a million-node random graph, polygrad vs torch.sparse.

The model (issue 11): GCN 64 -> 64 -> 8 (``--features`` -> 64 -> 8), ReLU, dropout 0.5 on the
hidden layer, Adam, softmax cross-entropy on every tenth node; a uniform random graph of
``--nodes`` nodes and ``--edges`` directed edges (repeats and self loops left in, as random
``edge_index`` data has them).  Each system runs in its own process with one thread
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), on the same graph (same seed):

* ``polygrad``    -- ``pg.nn.GCN`` on the edge_index, as a user writes it (``pip install -e .``);
* ``torch-coo``   -- plain PyTorch, ``torch.sparse.mm`` on a coalesced COO adjacency;
* ``torch-csr``   -- plain PyTorch, a CSR adjacency;
  both torch adjacencies built and normalised with scipy (coo -> csr, self loops, D^-1/2 A D^-1/2).

Per system: the first epoch *including* building and normalising the adjacency from
``edge_index``, the median later epoch, the peak RSS of the process (``ru_maxrss``, data included),
and the memory a training run adds on top of the input data (peak RSS minus the RSS once
edge_index, features and labels exist) per edge and per node-feature.  A last process times
construction alone: ``pg.from_edge_index`` + ``pg.gcn_norm`` against scipy's coo -> csr and the
same normalisation, in the same process (the ratio is the figure; absolute seconds are noise on
a shared machine).  torch is optional: without it the torch rows say so and the ratios are absent.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks._harness import BENCH_EXTRA, optional_import, register

HIDDEN, CLASSES = 64, 8
SEED = 0
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1_000_000, help="number of nodes (default 1,000,000)")
    p.add_argument("--edges", type=int, default=10_000_000, help="number of edges (default 10,000,000)")
    p.add_argument("--features", type=int, default=64, help="input feature width (default 64)")
    p.add_argument("--epochs", type=int, default=5, help="epochs per system, the first included (default 5)")
    p.add_argument("--systems", default="polygrad,torch-coo,torch-csr,construction",
                   help="comma-separated subset of polygrad, torch-coo, torch-csr, construction")


# -- the worker (one system per process) ----------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _data(nodes: int, edges: int, features: int):
    rng = np.random.default_rng(SEED)
    edge_index = rng.integers(0, nodes, (2, edges), dtype=np.int64)
    x = rng.standard_normal((nodes, features), dtype=np.float32)
    y = rng.integers(0, CLASSES, nodes, dtype=np.int64)
    train = np.arange(0, nodes, 10, dtype=np.int64)
    return edge_index, x, y, train


def _scipy_gcn_norm(edge_index: np.ndarray, n: int):
    """D^-1/2 (A + I) D^-1/2 with scipy: coo -> csr (duplicates summed), missing self loops added."""
    import scipy.sparse as sp
    a = sp.coo_matrix((np.ones(edge_index.shape[1], dtype=np.float32), (edge_index[0], edge_index[1])),
                      shape=(n, n)).tocsr()
    missing = (a.diagonal() == 0).astype(np.float32)
    a = (a + sp.diags(missing, format="csr")).tocsr()
    deg = np.asarray(a.sum(axis=1)).ravel()
    dinv = np.zeros_like(deg)
    np.power(deg, -0.5, out=dinv, where=deg > 0)
    a = sp.diags(dinv) @ a @ sp.diags(dinv)
    a.sort_indices()
    return a.tocsr()


def _train_polygrad(edge_index, x, y, train, epochs: int) -> list[float]:
    import polygrad as pg
    import polygrad.nn
    import polygrad.optim  # noqa: F401

    pg.manual_seed(SEED)
    model = pg.nn.GCN(x.shape[1], HIDDEN, 2, CLASSES, dropout=0.5, input_dropout=False)
    opt = pg.optim.Adam(model.parameters(), lr=0.01)
    xt = pg.tensor(x)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        logits = model(xt, edge_index)  # the first call builds and normalises the adjacency
        loss = pg.cross_entropy(logits, y, mask=train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def _train_torch(layout: str, edge_index, x, y, train, epochs: int) -> list[float]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    n = x.shape[0]
    w1 = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(x.shape[1], HIDDEN)))
    b1 = torch.nn.Parameter(torch.zeros(HIDDEN))
    w2 = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(HIDDEN, CLASSES)))
    b2 = torch.nn.Parameter(torch.zeros(CLASSES))
    opt = torch.optim.Adam([w1, b1, w2, b2], lr=0.01)
    xt, yt, tt = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(train)
    adj = None
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        if adj is None:
            a = _scipy_gcn_norm(edge_index, n)
            if layout == "coo":
                coo = a.tocoo()
                idx = torch.from_numpy(np.stack([coo.row, coo.col]).astype(np.int64))
                adj = torch.sparse_coo_tensor(idx, torch.from_numpy(coo.data), (n, n)).coalesce()
            else:
                adj = torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int64)),
                                              torch.from_numpy(a.indices.astype(np.int64)),
                                              torch.from_numpy(a.data), (n, n))
            del a

        def propagate(h):
            return torch.sparse.mm(adj, h) if layout == "coo" else adj @ h

        h = torch.relu(propagate(xt @ w1) + b1)
        h = torch.nn.functional.dropout(h, 0.5, training=True)
        logits = propagate(h @ w2) + b2
        loss = torch.nn.functional.cross_entropy(logits[tt], yt[tt])
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def _construction(edge_index, n: int, repeat: int = 3) -> dict:
    import polygrad as pg

    def ours():
        return pg.gcn_norm(pg.from_edge_index(edge_index, n))

    def scipy_ref():
        return _scipy_gcn_norm(edge_index, n)

    out = {}
    for name, fn in (("scipy", scipy_ref), ("polygrad", ours)):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def worker(system: str, nodes: int, edges: int, features: int, epochs: int) -> dict:
    edge_index, x, y, train = _data(nodes, edges, features)
    rss_data = _rss_bytes()
    if system == "construction":
        times = _construction(edge_index, nodes)
        return {"system": system, "polygrad_s": times["polygrad"], "scipy_s": times["scipy"],
                "ratio_vs_scipy": times["polygrad"] / times["scipy"]}
    if system == "polygrad":
        times = _train_polygrad(edge_index, x, y, train, epochs)
    else:
        times = _train_torch(system.split("-")[1], edge_index, x, y, train, epochs)
    peak = _peak_rss_bytes()
    added = peak - rss_data
    return {"system": system, "first_epoch_s": times[0],
            "later_epoch_s": statistics.median(times[1:]) if len(times) > 1 else float("nan"),
            "peak_rss_gb": peak / 1e9, "train_bytes_per_edge": added / edges,
            "train_bytes_per_node_feature": added / (nodes * features)}


# -- the driver ---------------------------------------------------------------------------------------

def _run_worker(system: str, nodes: int, edges: int, features: int, epochs: int) -> dict:
    env = dict(os.environ, **{v: "1" for v in THREAD_VARS})
    cmd = [sys.executable, "-m", "benchmarks.scale_bench", "--worker", system, "--nodes", str(nodes),
           "--edges", str(edges), "--features", str(features), "--epochs", str(epochs)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"system": system, "error": f"exit {res.returncode}: {tail[0]}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


@register("scale", "GCN on a 1M-node / 10M-edge graph: polygrad vs torch.sparse COO/CSR (own processes, "
                   "one thread), plus construction vs scipy", options=_options)
def run(quick: bool, nodes: int = 1_000_000, edges: int = 10_000_000, features: int = 64, epochs: int = 5,
        systems: str = "polygrad,torch-coo,torch-csr,construction") -> dict:
    if quick:
        nodes, edges, epochs = min(nodes, 20_000), min(edges, 200_000), min(epochs, 3)
    wanted = [s.strip() for s in systems.split(",") if s.strip()]
    has_torch = optional_import("torch") is not None
    rows = []
    for system in wanted:
        if system.startswith("torch") and not has_torch:
            rows.append({"system": system, "skipped": f"torch not installed ({BENCH_EXTRA})"})
            continue
        row = _run_worker(system, nodes, edges, features, epochs)
        rows.append(row)
    by = {r["system"]: r for r in rows if "error" not in r and "skipped" not in r}
    summary: dict = {"nodes": nodes, "edges": edges, "features": features}
    ours = by.get("polygrad")
    torch_rows = [by[s] for s in ("torch-coo", "torch-csr") if s in by]
    if ours:
        summary.update(polygrad_first_epoch_s=ours["first_epoch_s"], polygrad_later_epoch_s=ours["later_epoch_s"],
                       polygrad_peak_rss_gb=ours["peak_rss_gb"])
    if ours and torch_rows:
        summary["later_epoch_vs_best_torch"] = ours["later_epoch_s"] / min(r["later_epoch_s"] for r in torch_rows)
        summary["first_epoch_vs_best_torch"] = ours["first_epoch_s"] / min(r["first_epoch_s"] for r in torch_rows)
        summary["peak_rss_vs_best_torch"] = ours["peak_rss_gb"] / min(r["peak_rss_gb"] for r in torch_rows)
    if "construction" in by:
        summary["construction_vs_scipy"] = by["construction"]["ratio_vs_scipy"]
    for r in rows:
        if "error" in r:
            summary[f"{r['system']}_error"] = r["error"]
    return {"rows": rows, "summary": summary}


def _main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_bench")
    p.add_argument("--worker", required=True, choices=["polygrad", "torch-coo", "torch-csr", "construction"])
    _options(p)
    a = p.parse_args()
    print(json.dumps(worker(a.worker, a.nodes, a.edges, a.features, a.epochs)))


if __name__ == "__main__":
    _main()
