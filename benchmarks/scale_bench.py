"""``python -m benchmarks scale``: a 2-layer GCN on a million-node random graph, polygrad vs torch.sparse.

The model (issue 11): GCN 64 -> 64 -> 8 (``--features`` -> 64 -> 8), ReLU, dropout 0.5 on the
hidden layer, Adam, softmax cross-entropy on every tenth node; a random graph of ``--nodes``
nodes and ``--edges`` directed edges (repeats and self loops left in, as random ``edge_index``
data has them): ``--graph uniform`` (endpoints uniform) or ``--graph rmat`` (Graph500's R-MAT
power law, a=0.57, b=c=0.19, vertex ids permuted).  Each system runs in its own process, once per
thread count of ``--threads`` (``1,2`` ...: ``POLYGRAD_NUM_THREADS``, ``OMP_NUM_THREADS`` and the
BLAS variables, ``torch.set_num_threads``), on the same graph (same seed):

* ``polygrad``    -- ``pg.nn.GCN`` on the edge_index, as a user writes it (``pip install -e .``), the
  features shared with ``pg.from_numpy`` as the torch rows share them with ``torch.from_numpy``;
* ``torch-coo``   -- plain PyTorch, ``torch.sparse.mm`` on a coalesced COO adjacency;
* ``torch-csr``   -- plain PyTorch, a CSR adjacency;
  both torch adjacencies built and normalised with scipy (coo -> csr, self loops, D^-1/2 A D^-1/2);
* ``pyg``         -- PyTorch Geometric's ``GCNConv`` (two layers, ``cached=True``), when installed.

With several thread counts the table gains a scaling section: each system's later epoch at each
count against its own at the first count, polygrad against torch CSR at the same count, whether
polygrad's losses are bit-identical across counts, and an Amdahl projection to 16 threads from
the first two counts (a projection, not a measurement).

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
from typing import Any, Callable

import numpy as np

from benchmarks._harness import BENCH_EXTRA, optional_import, register

HIDDEN, CLASSES = 64, 8
SEED = 0
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


SYSTEMS = ("polygrad", "torch-coo", "torch-csr", "pyg", "construction")
GRAPHS = ("uniform", "rmat")
#: Graph500's R-MAT quadrant probabilities (a, b, c; d = the rest)
RMAT_ABC = (0.57, 0.19, 0.19)


def _thread_list(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads: a comma-separated list of integers, got {text!r}")
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--threads: thread counts must be >= 1, got {text!r}")
    return counts


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1_000_000, help="number of nodes (default 1,000,000)")
    p.add_argument("--edges", type=int, default=10_000_000, help="number of edges (default 10,000,000)")
    p.add_argument("--features", type=int, default=64, help="input feature width (default 64)")
    p.add_argument("--epochs", type=int, default=5, help="epochs per system, the first included (default 5)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated subset of " + ", ".join(SYSTEMS) + " (default: all)")
    p.add_argument("--graph", choices=GRAPHS, default="uniform", help="uniform random or R-MAT power-law graph")
    p.add_argument("--threads", type=_thread_list, default=[1],
                   help="comma-separated thread counts, each system run at each (default 1), e.g. 1,2")


# -- the worker (one system per process) ----------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rmat_edge_index(rng: np.random.Generator, nodes: int, edges: int) -> np.ndarray:
    """Graph500's R-MAT: per bit of the endpoints a quadrant with probabilities a, b, c, d; then the
    vertex ids permuted (as Graph500 does, so high degrees are not all at low ids) and folded into
    ``[0, nodes)`` when ``nodes`` is not a power of two."""
    scale = max(1, int(np.ceil(np.log2(max(nodes, 2)))))
    a, b, c = RMAT_ABC
    src = np.zeros(edges, dtype=np.int64)
    dst = np.zeros(edges, dtype=np.int64)
    for bit in range(scale):
        u = rng.random(edges, dtype=np.float32)
        down = u >= a + b                       # quadrants c, d: source bit set
        right = ((u >= a) & (u < a + b)) | (u >= a + b + c)  # quadrants b, d: target bit set
        src |= down.astype(np.int64) << bit
        dst |= right.astype(np.int64) << bit
        del u, down, right
    perm = rng.permutation(1 << scale) % nodes
    return np.stack([perm[src], perm[dst]])


def _data(nodes: int, edges: int, features: int, graph: str = "uniform"):
    rng = np.random.default_rng(SEED)
    if graph == "rmat":
        edge_index = rmat_edge_index(rng, nodes, edges)
    else:
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


def _train_polygrad(edge_index, x, y, train, epochs: int) -> tuple[list[float], list[str]]:
    import polygrad as pg
    import polygrad.nn
    import polygrad.optim  # noqa: F401

    pg.manual_seed(SEED)
    model = pg.nn.GCN(x.shape[1], HIDDEN, 2, CLASSES, dropout=0.5, input_dropout=False)
    opt = pg.optim.Adam(model.parameters(), lr=0.01)
    xt = pg.from_numpy(x)  # shares x's memory, as torch.from_numpy in the torch rows (pg.tensor copies: 256 MB)
    times, losses = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        logits = model(xt, edge_index)  # the first call builds and normalises the adjacency
        loss = pg.cross_entropy(logits, y, mask=train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()).hex())  # the exact bits, compared across thread counts
    return times, losses


def _train_torch(layout: str, edge_index, x, y, train, epochs: int, threads: int = 1) -> list[float]:
    import torch

    torch.set_num_threads(threads)
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

        _torch_gcn_step(torch, lambda: propagate(xt @ w1) + b1, lambda h: propagate(h @ w2) + b2, opt, yt, tt)
        times.append(time.perf_counter() - t0)
    return times


def _torch_gcn_step(torch: Any, first: Callable[[], Any], second: Callable[[Any], Any], opt: Any,
                    yt: Any, tt: Any) -> None:
    """One training step of a two-layer GCN on torch, the same for the plain-torch and the PyG rows:
    ``relu(first())``, dropout 0.5, ``second``, cross-entropy on the training nodes, an optimizer step."""
    h = torch.relu(first())
    h = torch.nn.functional.dropout(h, 0.5, training=True)
    logits = second(h)
    loss = torch.nn.functional.cross_entropy(logits[tt], yt[tt])
    opt.zero_grad()
    loss.backward()
    opt.step()


def _train_pyg(edge_index, x, y, train, epochs: int, threads: int = 1) -> list[float]:
    """PyG's GCNConv, two layers as above (``cached=True``: the normalisation is done in the first
    epoch and reused, as polygrad's and the torch rows' adjacency is)."""
    import torch
    from torch_geometric.nn import GCNConv

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    conv1 = GCNConv(x.shape[1], HIDDEN, cached=True)
    conv2 = GCNConv(HIDDEN, CLASSES, cached=True)
    opt = torch.optim.Adam(list(conv1.parameters()) + list(conv2.parameters()), lr=0.01)
    xt, yt, tt = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(train)
    ei = torch.from_numpy(edge_index)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        _torch_gcn_step(torch, lambda: conv1(xt, ei), lambda h: conv2(h, ei), opt, yt, tt)
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


def worker(system: str, nodes: int, edges: int, features: int, epochs: int, graph: str = "uniform",
           threads: int = 1) -> dict:
    edge_index, x, y, train = _data(nodes, edges, features, graph)
    rss_data = _rss_bytes()
    head = {"system": system, "threads": threads}
    if system == "construction":
        built = _construction(edge_index, nodes)
        return {**head, "polygrad_s": built["polygrad"], "scipy_s": built["scipy"],
                "ratio_vs_scipy": built["polygrad"] / built["scipy"]}
    losses: list[str] = []
    times: list[float]
    if system == "polygrad":
        times, losses = _train_polygrad(edge_index, x, y, train, epochs)
    elif system == "pyg":
        times = _train_pyg(edge_index, x, y, train, epochs, threads)
    else:
        times = _train_torch(system.split("-")[1], edge_index, x, y, train, epochs, threads)
    peak = _peak_rss_bytes()
    added = peak - rss_data
    row = {**head, "first_epoch_s": times[0],
           "later_epoch_s": statistics.median(times[1:]) if len(times) > 1 else float("nan"),
           "peak_rss_gb": peak / 1e9, "train_bytes_per_edge": added / edges,
           "train_bytes_per_node_feature": added / (nodes * features)}
    if losses:
        row["losses"] = losses
    return row


# -- the driver ---------------------------------------------------------------------------------------

def _run_worker(system: str, nodes: int, edges: int, features: int, epochs: int, graph: str = "uniform",
                threads: int = 1) -> dict:
    env = dict(os.environ, POLYGRAD_NUM_THREADS=str(threads), **{v: str(threads) for v in THREAD_VARS})
    cmd = [sys.executable, "-m", "benchmarks.scale_bench", "--worker", system, "--nodes", str(nodes),
           "--edges", str(edges), "--features", str(features), "--epochs", str(epochs), "--graph", graph,
           "--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"system": system, "threads": threads, "error": f"exit {res.returncode}: {tail[0]}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def amdahl_16(ratio_2: float) -> float:
    """The 16-thread epoch as a fraction of the 1-thread one, by Amdahl's law fitted to the 2-thread
    ratio (parallel fraction p = 2 (1 - ratio_2)); a projection, not a measurement."""
    p = min(1.0, max(0.0, 2.0 * (1.0 - ratio_2)))
    return (1.0 - p) + p / 16.0


def _scaling(by: dict, counts: list[int], summary: dict) -> list[dict]:
    """Rows of the scaling table, and its headline figures into ``summary``."""
    rows = []
    base = counts[0]
    for system in ("polygrad", "torch-csr", "torch-coo", "pyg"):
        first = by.get((system, base))
        for t in counts:
            r = by.get((system, t))
            if r is None:
                continue
            row = {"section": "scaling", "system": system, "threads": t, "later_epoch_s": r["later_epoch_s"]}
            if first is not None:
                row[f"vs_{base}_thread"] = r["later_epoch_s"] / first["later_epoch_s"]
            csr = by.get(("torch-csr", t))
            if system == "polygrad" and csr is not None:
                row["vs_torch_csr_same_threads"] = r["later_epoch_s"] / csr["later_epoch_s"]
                summary[f"polygrad_vs_torch_csr_t{t}"] = row["vs_torch_csr_same_threads"]
            if system == "polygrad" and first is not None:
                summary[f"polygrad_later_epoch_s_t{t}"] = r["later_epoch_s"]
                summary[f"polygrad_epoch_t{t}_vs_t{base}"] = row[f"vs_{base}_thread"]
            rows.append(row)
        two = by.get((system, 2))
        if base == 1 and first is not None and two is not None:
            projected = amdahl_16(two["later_epoch_s"] / first["later_epoch_s"])
            rows.append({"section": "scaling", "system": system, "threads": "16 (Amdahl projection)",
                         "later_epoch_s": first["later_epoch_s"] * projected, "vs_1_thread": projected})
            summary[f"{system}_projected_t16_vs_t1"] = projected
    runs = [by[("polygrad", t)] for t in counts if ("polygrad", t) in by]
    if len(runs) > 1:
        summary["polygrad_losses_bit_identical_across_threads"] = all(r.get("losses") == runs[0].get("losses")
                                                                      for r in runs)
    return rows


@register("scale", "GCN on a 1M-node / 10M-edge graph (uniform or R-MAT): polygrad vs torch.sparse COO/CSR "
                   "and PyG, each in its own process at each --threads count, plus construction vs scipy",
          options=_options)
def run(quick: bool, nodes: int = 1_000_000, edges: int = 10_000_000, features: int = 64, epochs: int = 5,
        systems: str = ",".join(SYSTEMS), graph: str = "uniform", threads: list[int] | None = None) -> dict:
    if quick:
        nodes, edges, epochs = min(nodes, 20_000), min(edges, 200_000), min(epochs, 3)
    counts = threads or [1]
    wanted = [s.strip() for s in systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"scale: unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    has_torch = optional_import("torch") is not None
    has_pyg = has_torch and optional_import("torch_geometric") is not None
    rows: list[dict[str, Any]] = []
    for t in counts:
        for system in wanted:
            if system.startswith("torch") and not has_torch:
                rows.append({"system": system, "threads": t, "skipped": f"torch not installed ({BENCH_EXTRA})"})
                continue
            if system == "pyg" and not has_pyg:
                rows.append({"system": system, "threads": t,
                             "skipped": f"torch_geometric not installed ({BENCH_EXTRA})"})
                continue
            row = _run_worker(system, nodes, edges, features, epochs, graph, t)
            rows.append(row)
    by = {(r["system"], r["threads"]): r for r in rows if "error" not in r and "skipped" not in r}
    summary: dict = {"nodes": nodes, "edges": edges, "features": features, "graph": graph, "threads": counts}
    one = counts[0]
    ours = by.get(("polygrad", one))
    torch_rows = [by[(s, one)] for s in ("torch-coo", "torch-csr") if (s, one) in by]
    if ours:
        summary.update(polygrad_first_epoch_s=ours["first_epoch_s"], polygrad_later_epoch_s=ours["later_epoch_s"],
                       polygrad_peak_rss_gb=ours["peak_rss_gb"])
    if ours and torch_rows:  # at the first thread count (the Done-when figures are at one thread)
        summary["later_epoch_vs_best_torch"] = ours["later_epoch_s"] / min(r["later_epoch_s"] for r in torch_rows)
        summary["first_epoch_vs_best_torch"] = ours["first_epoch_s"] / min(r["first_epoch_s"] for r in torch_rows)
        summary["peak_rss_vs_best_torch"] = ours["peak_rss_gb"] / min(r["peak_rss_gb"] for r in torch_rows)
    if ("pyg", one) in by and ours:
        summary["later_epoch_vs_pyg"] = ours["later_epoch_s"] / by[("pyg", one)]["later_epoch_s"]
        summary["peak_rss_vs_pyg"] = ours["peak_rss_gb"] / by[("pyg", one)]["peak_rss_gb"]
    if ("construction", one) in by:
        summary["construction_vs_scipy"] = by[("construction", one)]["ratio_vs_scipy"]
    for r in rows:
        if "error" in r:
            summary[f"{r['system']}_t{r['threads']}_error"] = r["error"]
    scaling = _scaling(by, counts, summary) if len(counts) > 1 else []
    for r in rows:  # the loss bits were for the comparison above; the table shows the last one
        if "losses" in r:
            r["last_loss"] = float.fromhex(r.pop("losses")[-1])
    return {"rows": rows + scaling, "summary": summary}


def _main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_bench")
    p.add_argument("--worker", required=True, choices=SYSTEMS)
    _options(p)
    a = p.parse_args()
    print(json.dumps(worker(a.worker, a.nodes, a.edges, a.features, a.epochs, a.graph, a.threads[0])))


if __name__ == "__main__":
    _main()
