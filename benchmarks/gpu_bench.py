"""GPU measurements of the CuPy backend: SpMM throughput and a Cora GCN epoch vs PyTorch Geometric.

Run on a machine with a CUDA GPU (``benchmarks/gpu_check.sh`` does)::

    python -m benchmarks gpu [--quick]

Without a usable cupy backend every section is a ``skipped: ...`` row naming the reason, and the
run succeeds.  ``POLYGRAD_GPU_BENCH_BACKEND=numpy`` runs the same code on another backend at
toy sizes (a rehearsal of the code path on a machine without a GPU; the figures mean nothing).

Sections
--------
**spmm**: ``Y = A @ X`` on a uniform random graph of 1,000,000 nodes and 10,000,000 directed
edges, F = 64, float32, int32 indices.  Throughput is reported as a fraction of the GPU's memory
bandwidth (``--`` 4.8 TB/s, an H200's HBM3e; ``POLYGRAD_GPU_BANDWIDTH`` overrides) under this
byte model: every byte a kernel must move at least once when nothing is reused from cache::

    values (nnz * 4) + column indices (nnz * 4) + row pointers ((n + 1) * 4)
    + one gathered row of X per nonzero (nnz * F * 4) + the output (n * F * 4)

X (256 MB) is far larger than the L2 cache and the columns are uniform random, so the gathers
really do come from HBM; a fraction near 1 would be a kernel at the bandwidth roofline.  Rows:
polygrad's SpMM through the tensor API (cuSPARSE path), polygrad's own CSR kernel, cupyx's
``csr_matrix @ X`` (which copies X to column-major per call) and ``torch.sparse.mm`` on the same
matrix (when torch has CUDA), plus SDDMM (bytes: two index arrays, two gathered rows per nonzero,
the output) and a forward+backward pass through the tensor API.  A determinism row checks that
two SpMM runs are bitwise equal.

**gcn**: a 2-layer GCN (1433 -> 16 -> 7, ReLU, no dropout, Adam lr 0.01) on Cora, full batch,
the propagation matrix ``D^-1/2 (A + I) D^-1/2`` precomputed once on both sides (PyG:
``GCNConv(cached=True)``); the time per training epoch (forward, loss on the 140 training nodes,
backward, Adam step) on polygrad/cupy and on PyTorch Geometric on the same GPU, and the test
accuracy each reaches after the run (a sanity check that both trained the same model).
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from benchmarks._harness import optional_import, planetoid_dir, register, skipped_row

HBM_BYTES_PER_S = float(os.environ.get("POLYGRAD_GPU_BANDWIDTH", 4.8e12))
NODES, EDGES, FEATURES = 1_000_000, 10_000_000, 64


# -- plumbing ------------------------------------------------------------------------------------

class _Sync:
    """Wall-clock timing that waits for the device (cupy and/or torch) before reading the clock."""

    def __init__(self, cp: Any = None, torch: Any = None) -> None:
        self.cp, self.torch = cp, torch

    def __call__(self) -> None:
        if self.cp is not None:
            self.cp.cuda.runtime.deviceSynchronize()
        if self.torch is not None and self.torch.cuda.is_available():
            self.torch.cuda.synchronize()

    def time(self, fn, repeat: int, warmup: int = 2) -> float:
        """Median seconds of ``fn()`` over ``repeat`` synchronised runs."""
        for _ in range(warmup):
            fn()
        self()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            self()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))


def _backend_under_test() -> tuple[str, str]:
    """(backend name, '' or the reason the GPU sections are skipped)."""
    import polygrad as pg
    name = os.environ.get("POLYGRAD_GPU_BENCH_BACKEND", "cupy")
    for info in pg.list_backends():
        if info.name == name:
            return name, "" if info.available else f"skipped: backend {name!r} unavailable: {info.reason}"
    return name, f"skipped: backend {name!r} is not registered"


def _pattern_from_edges(src: np.ndarray, dst: np.ndarray, n: int):
    """Canonical Pattern of edges already sorted by (src, dst) without duplicates."""
    from polygrad.sparse.pattern import Pattern
    return Pattern.from_sorted((n, n), src, dst)


def _rate(nbytes: float, seconds: float) -> dict:
    return {"GB/s": nbytes / seconds / 1e9, "frac_of_hbm": nbytes / seconds / HBM_BYTES_PER_S}


# -- SpMM ---------------------------------------------------------------------------------------------

def spmm_section(backend: str, quick: bool) -> tuple[list[dict], dict]:
    import polygrad as pg
    from polygrad.data import random_graph
    from polygrad.tensor import sddmm, spmm

    gpu = backend == "cupy"
    n, e, f = (NODES, EDGES, FEATURES) if gpu else (2_000, 20_000, 16)
    repeat = (5 if quick else 20) if gpu else 2
    from polygrad.runtime.registry import resolve
    be = resolve(backend)
    cp = be.modules().cupy if gpu else None
    torch = optional_import("torch")
    sync = _Sync(cp, torch if torch is not None and gpu else None)
    rows: list[dict] = []

    t0 = time.perf_counter()
    edge_index = random_graph(n, e, seed=0, directed=True)
    pattern = _pattern_from_edges(edge_index[0], edge_index[1], n)
    nnz = pattern.nnz
    rng = np.random.default_rng(0)
    vals_h = rng.standard_normal(nnz, dtype=np.float32)
    x_h = rng.standard_normal((n, f), dtype=np.float32)
    vals, x = pg.tensor(vals_h, backend=backend), pg.tensor(x_h, backend=backend)
    setup_s = time.perf_counter() - t0

    spmm_bytes = nnz * 4 + nnz * 4 + (n + 1) * 4 + nnz * f * 4 + n * f * 4
    sddmm_bytes = 2 * nnz * 4 + 2 * nnz * f * 4 + nnz * 4
    common = {"section": "spmm", "n": n, "nnz": nnz, "F": f}

    with pg.no_grad():
        # correctness against the host before timing anything (50 sampled rows)
        y = spmm(vals, x, pattern).numpy()
        for r in rng.choice(n, size=min(n, 50), replace=False):
            lo, hi = pattern.indptr[r], pattern.indptr[r + 1]
            want = vals_h[lo:hi] @ x_h[pattern.cols[lo:hi]]
            np.testing.assert_allclose(y[r], want, rtol=1e-3, atol=1e-3)
        path = "n/a"
        if gpu:
            if be.spmm_impl == "auto" and be.modules().cusparse is not None:
                path = "cuSPARSE (X.T, transb)" if be.cusparse_transb else "cuSPARSE (X copied to column-major)"
            else:
                path = "polygrad CSR kernel"
        t_api = sync.time(lambda: spmm(vals, x, pattern), repeat)
        rows.append({**common, "impl": f"polygrad spmm ({path})", "ms": t_api * 1e3, **_rate(spmm_bytes, t_api)})
        if gpu:
            be.spmm_impl = "kernel"
            try:
                t_k = sync.time(lambda: spmm(vals, x, pattern), repeat)
            finally:
                be.spmm_impl = "auto"
            rows.append({**common, "impl": "polygrad CSR kernel (1 thread / output)", "ms": t_k * 1e3,
                         **_rate(spmm_bytes, t_k)})
            again = [spmm(vals, x, pattern) for _ in range(2)]
            rows.append({**common, "impl": "determinism: two SpMM runs bitwise equal",
                         "status": bool(cp.array_equal(again[0]._data, again[1]._data))})
            sparse = optional_import("cupyx.scipy.sparse")
            if sparse is not None:
                indptr32, _, cols32 = be.device_indices(pattern)
                a = sparse.csr_matrix((vals._data, cols32, indptr32), shape=pattern.shape)
                t_cupyx = sync.time(lambda: a @ x._data, repeat)
                rows.append({**common, "impl": "cupyx csr_matrix @ X (anchor)", "ms": t_cupyx * 1e3,
                             **_rate(spmm_bytes, t_cupyx)})
            if torch is not None and torch.cuda.is_available():
                dev = torch.device("cuda")
                at = torch.sparse_csr_tensor(torch.as_tensor(pattern.indptr, device=dev),
                                             torch.as_tensor(pattern.cols, device=dev),
                                             torch.as_tensor(vals_h, device=dev), size=pattern.shape)
                xt = torch.as_tensor(x_h, device=dev)
                t_torch = sync.time(lambda: torch.sparse.mm(at, xt), repeat)
                rows.append({**common, "impl": "torch.sparse.mm CSR (anchor)", "ms": t_torch * 1e3,
                             **_rate(spmm_bytes, t_torch)})
                del at, xt
            else:
                rows.append(skipped_row("torch", section="spmm", reason="skipped: torch with CUDA not available"))
        t_sddmm = sync.time(lambda: sddmm(x, x, pattern), repeat)
        rows.append({**common, "impl": "polygrad sddmm (1 thread / nonzero)", "ms": t_sddmm * 1e3,
                     **_rate(sddmm_bytes, t_sddmm)})
        if gpu:
            _, r32, c32 = be.device_indices(pattern)
            xd = x._data
            t_gather = sync.time(lambda: (xd[r32] * xd[c32]).sum(axis=1), repeat)
            rows.append({**common, "impl": "gather + row reduction (alternative SDDMM)", "ms": t_gather * 1e3,
                         **_rate(sddmm_bytes, t_gather)})

    g = pg.tensor(rng.standard_normal((n, f), dtype=np.float32), backend=backend)
    vg = pg.tensor(vals_h, backend=backend, requires_grad=True)
    xg = pg.tensor(x_h, backend=backend, requires_grad=True)

    def fwd_bwd():
        vg.grad = xg.grad = None
        (spmm(vg, xg, pattern) * g).sum().backward()

    t_fb = sync.time(fwd_bwd, max(2, repeat // 4), warmup=1)
    rows.append({**common, "impl": "forward + backward (SpMM, SDDMM, transposed SpMM)", "ms": t_fb * 1e3})
    summary = {"spmm_ms": t_api * 1e3, "spmm_frac_of_hbm": spmm_bytes / t_api / HBM_BYTES_PER_S,
               "spmm_path": path, "sddmm_ms": t_sddmm * 1e3,
               "sddmm_frac_of_hbm": sddmm_bytes / t_sddmm / HBM_BYTES_PER_S,
               "spmm_fwd_bwd_ms": t_fb * 1e3, "graph_setup_s": setup_s,
               "byte_model_spmm_GB": spmm_bytes / 1e9, "hbm_bytes_per_s": HBM_BYTES_PER_S}
    return rows, summary


# -- GCN on Cora ------------------------------------------------------------------------------------



def _polygrad_gcn(backend: str, data, epochs: int, sync: _Sync) -> tuple[float, float]:
    """(seconds per epoch, test accuracy) of polygrad's GCN on ``backend``."""
    import polygrad as pg
    from polygrad.data import normalized_adjacency
    from polygrad.tensor import spmm

    n = data.num_nodes
    adj = normalized_adjacency(data.edge_index, n, dtype=np.float32)
    pattern = _pattern_from_edges(np.repeat(np.arange(n), np.diff(adj.indptr)), adj.indices, n)
    a_vals = pg.tensor(adj.data.astype(np.float32), backend=backend)
    x = pg.tensor(data.x_dense(np.float32), backend=backend)
    rng = np.random.default_rng(0)

    def glorot(fan_in, fan_out):
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        return pg.tensor(rng.uniform(-lim, lim, (fan_in, fan_out)).astype(np.float32), backend=backend,
                         requires_grad=True)

    params = [glorot(x.shape[1], 16), pg.tensor(np.zeros(16, np.float32), backend=backend, requires_grad=True),
              glorot(16, data.num_classes),
              pg.tensor(np.zeros(data.num_classes, np.float32), backend=backend, requires_grad=True)]
    moments = [[pg.zeros_like(p), pg.zeros_like(p)] for p in params]
    train = np.flatnonzero(data.train_mask)
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8

    def forward():
        w1, c1, w2, c2 = params
        h = (spmm(a_vals, x @ w1, pattern) + c1).relu()
        return spmm(a_vals, h @ w2, pattern) + c2

    def epoch(step: list):
        for p in params:
            p.grad = None
        loss = pg.cross_entropy(forward(), data.y, mask=train)
        loss.backward()
        step[0] += 1
        k = step[0]
        with pg.no_grad():
            for p, (m, v) in zip(params, moments):
                m.data = m * b1 + p.grad * (1 - b1)
                v.data = v * b2 + p.grad * p.grad * (1 - b2)
                mhat = m / (1 - b1 ** k)
                vhat = v / (1 - b2 ** k)
                p.data = p - lr * mhat / (vhat.sqrt() + eps)

    step = [0]
    for _ in range(5):
        epoch(step)
    sync()
    t0 = time.perf_counter()
    for _ in range(epochs):
        epoch(step)
    sync()
    per_epoch = (time.perf_counter() - t0) / epochs
    with pg.no_grad():
        pred = forward().numpy().argmax(axis=1)
    test = data.test_mask
    return per_epoch, float((pred[test] == data.y[test]).mean())


def _pyg_gcn(data, epochs: int, sync: _Sync) -> tuple[float, float] | str:
    torch = optional_import("torch")
    pyg_nn = optional_import("torch_geometric.nn")
    if torch is None or pyg_nn is None:
        return "skipped: torch_geometric not installed (pip install polygrad-core[bench])"
    if not torch.cuda.is_available():
        return "skipped: torch has no CUDA device"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.as_tensor(data.x_dense(np.float32), device=dev)
    ei = torch.as_tensor(data.edge_index, device=dev)
    y = torch.as_tensor(data.y, device=dev)
    train = torch.as_tensor(data.train_mask, device=dev)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = pyg_nn.GCNConv(x.shape[1], 16, cached=True)
            self.c2 = pyg_nn.GCNConv(16, data.num_classes, cached=True)

        def forward(self):
            return self.c2(self.c1(x, ei).relu(), ei)

    model = Net().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model()[train], y[train])
        loss.backward()
        opt.step()

    for _ in range(5):
        epoch()
    sync()
    t0 = time.perf_counter()
    for _ in range(epochs):
        epoch()
    sync()
    per_epoch = (time.perf_counter() - t0) / epochs
    with torch.no_grad():
        pred = model().argmax(dim=1).cpu().numpy()
    test = data.test_mask
    return per_epoch, float((pred[test] == data.y[test]).mean())


def gcn_section(backend: str, quick: bool) -> tuple[list[dict], dict]:
    from polygrad.data import load_planetoid
    from polygrad.runtime.registry import resolve

    root = planetoid_dir()
    if root is None:
        return [skipped_row("", section="gcn", reason="skipped: Cora not found (set POLYGRAD_PLANETOID_DIR "
                                                      "or copy it to .device_data/planetoid)")], {}
    data = load_planetoid(root, "cora")
    gpu = backend == "cupy"
    epochs = int(os.environ.get("POLYGRAD_GPU_BENCH_EPOCHS", 0)) or ((50 if quick else 200) if gpu else 3)
    torch = optional_import("torch")
    cp = resolve(backend).modules().cupy if gpu else None
    sync = _Sync(cp, torch if gpu else None)
    rows: list[dict] = []
    t_pg, acc_pg = _polygrad_gcn(backend, data, epochs, sync)
    rows.append({"section": "gcn", "impl": f"polygrad ({backend})", "epochs": epochs, "ms/epoch": t_pg * 1e3,
                 "test_acc": acc_pg})
    summary = {"gcn_polygrad_ms_per_epoch": t_pg * 1e3, "gcn_polygrad_test_acc": acc_pg}
    pyg = _pyg_gcn(data, epochs, sync) if gpu else "skipped: PyG comparison only on the GPU"
    if isinstance(pyg, str):
        rows.append(skipped_row("torch_geometric", section="gcn", reason=pyg))
    else:
        t_pyg, acc_pyg = pyg
        rows.append({"section": "gcn", "impl": "PyTorch Geometric (cuda)", "epochs": epochs,
                     "ms/epoch": t_pyg * 1e3, "test_acc": acc_pyg})
        summary.update(gcn_pyg_ms_per_epoch=t_pyg * 1e3, gcn_pyg_test_acc=acc_pyg,
                       gcn_polygrad_over_pyg=t_pg / t_pyg)
    return rows, summary


@register("gpu", "CuPy backend on the GPU: SpMM throughput vs HBM bandwidth, Cora GCN epoch vs PyG")
def run(quick: bool) -> dict:
    backend, skip = _backend_under_test()
    if skip:
        return {"rows": [skipped_row("", section="spmm", reason=skip), skipped_row("", section="gcn", reason=skip)],
                "summary": {"skipped": skip}}
    rows: list[dict] = []
    summary: dict = {"backend": backend}
    if backend == "cupy":
        from polygrad.runtime.registry import resolve
        info = resolve("cupy").info()
        summary.update({f"gpu_{k}": v for k, v in info.items() if k not in ("available", "reason")})
    for section in (spmm_section, gcn_section):
        r, s = section(backend, quick)
        rows += r
        summary.update(s)
    return {"rows": rows, "summary": summary}
