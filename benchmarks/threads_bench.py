"""``python -m benchmarks threads``: the numpy backend's parallel kernels at 1, 2, ... threads.

For each kernel of a GCN epoch that runs in blocks (``backends/parallel.py``) -- SpMM forward
``A @ X``, its backward ``Aᵀ @ dY``, the dense products ``x @ W`` and ``xᵀ @ g`` (BLAS on one
thread in blocks), a large elementwise op, the column sums of a bias gradient --
on a random graph (``--nodes`` / ``--edges``, uniform or R-MAT, F = ``--features``), at each
count of ``--threads``:

* ``wall_ms``: median wall time of one call;
* ``cpu_ms``: process CPU time (every thread) of one call -- the total work, which a loaded
  machine does not inflate as it does the wall time; ``cpu_vs_1`` > 1 is work a thread count
  adds (a gather, a copy) that one thread does not do;
* ``serial_ms``: wall time the calling thread spends in the kernel *outside* the blocks (setting
  up, cutting rows, allocating): the part no thread count shortens (Amdahl's serial fraction);
  at one thread a kernel with a serial path of its own (SpMM backward) runs no blocks at all;
* ``busy``: the blocks' summed wall time / (wall time in blocks x threads): 1.0 when every thread
  works throughout; lower when threads wait (imbalance, or other processes holding the cores);
* ``same_bits``: the output is bit-identical to the 1-thread output.

On a loaded machine only ``cpu_ms``, ``serial_ms`` and ``same_bits`` mean much (say the load);
``wall_ms`` scaling needs free cores.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from benchmarks._harness import register

_DEFAULTS = {"nodes": 1_000_000, "edges": 10_000_000, "features": 64}
_QUICK = {"nodes": 100_000, "edges": 1_000_000, "features": 64}


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=None, help="nodes (default 1,000,000; --quick 100,000)")
    p.add_argument("--edges", type=int, default=None, help="edges (default 10,000,000; --quick 1,000,000)")
    p.add_argument("--features", type=int, default=None, help="feature width F (default 64)")
    p.add_argument("--graph", choices=("uniform", "rmat"), default="uniform")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per kernel and count (default 5)")


class _BlockClock:
    """Wraps ``parallel.run_blocks``: wall time inside it, and the summed wall time of its blocks."""

    def __init__(self, parallel: Any) -> None:
        self.parallel, self.real = parallel, parallel.run_blocks
        self.inside = self.block_sum = 0.0

    def __enter__(self) -> "_BlockClock":
        def timed(fn: Callable[..., Any], blocks: Any, threads: Any = None) -> None:
            def block(*args: Any) -> None:
                t0 = time.perf_counter()
                fn(*args)
                self.block_sum += time.perf_counter() - t0  # float += under the GIL: no lost update

            t0 = time.perf_counter()
            self.real(block, blocks, threads)
            self.inside += time.perf_counter() - t0

        self.parallel.run_blocks = timed
        return self

    def __exit__(self, *exc: Any) -> None:
        self.parallel.run_blocks = self.real


def _kernels(nodes: int, edges: int, features: int, graph: str) -> dict[str, Callable[[], np.ndarray]]:
    import polygrad as pg
    from polygrad.backends import numpy as nb
    from polygrad.backends import parallel
    from benchmarks.scale_bench import rmat_edge_index

    rng = np.random.default_rng(0)
    ei = (rmat_edge_index(rng, nodes, edges) if graph == "rmat"
          else rng.integers(0, nodes, (2, edges), dtype=np.int64))
    adj = pg.gcn_norm(pg.from_edge_index(ei, nodes))
    del ei
    pattern = adj.pattern
    values = adj.values
    # the storage itself, as the kernels get it in training (.numpy() would mark it writable by the user)
    vals = np.ascontiguousarray(values._be.to_numpy(values._data), dtype=np.float32)
    indptr, cols = nb.sparsetools_indices(pattern)
    x = rng.standard_normal((nodes, features), dtype=np.float32)
    g = rng.standard_normal((nodes, features), dtype=np.float32)
    out = np.empty((nodes, features), dtype=np.float32)
    parallel.transposed_csr(pattern, indptr, cols)  # built once per graph: not part of a call

    def spmm() -> np.ndarray:
        parallel.csr_spmm(nodes, nodes, indptr, cols, vals, x, out)
        return out

    def spmm_backward() -> np.ndarray:
        parallel.transposed_spmm(pattern, indptr, cols, vals, g, out)
        return out

    def elementwise() -> np.ndarray:
        return parallel.elementwise(np.multiply, (x, g), out)

    def column_sums() -> np.ndarray:
        return parallel.column_sums(x)

    w = rng.standard_normal((features, features), dtype=np.float32)
    small = np.empty((features, features), dtype=np.float32)

    def matmul() -> np.ndarray:
        return parallel.matmul(x, w, out)

    def weight_gradient() -> np.ndarray:
        return parallel.matmul(x.T, g, small)

    return {"spmm A@X": spmm, "spmm backward Aᵀ@dY": spmm_backward, "matmul x@W": matmul,
            "matmul weight grad xᵀ@g": weight_gradient, "elementwise x*g": elementwise,
            "column sums": column_sums}


def _measure(fn: Callable[[], np.ndarray], repeat: int) -> tuple[dict, np.ndarray]:
    from polygrad.backends import parallel

    result = fn().copy()  # warm-up (and the output, compared across counts)
    walls, cpus, serials, busys = [], [], [], []
    for _ in range(repeat):
        with _BlockClock(parallel) as clock:
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        walls.append(wall)
        cpus.append(cpu)
        serials.append(wall - clock.inside)
        busys.append(clock.block_sum / clock.inside if clock.inside else float("nan"))
    return {"wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus),
            "serial_ms": 1e3 * statistics.median(serials), "busy_sum": statistics.median(busys)}, result


def measure(nodes: int, edges: int, features: int, graph: str, counts: list[int], repeat: int) -> dict:
    import polygrad as pg

    before = pg.get_num_threads()
    rows: list[dict] = []
    summary: dict[str, Any] = {"nodes": nodes, "edges": edges, "features": features, "graph": graph,
                               "threads": counts, "load_average_1min": os.getloadavg()[0]}
    try:
        for name, fn in _kernels(nodes, edges, features, graph).items():
            base: dict = {}
            first: np.ndarray | None = None
            for t in counts:
                pg.set_num_threads(t)
                m, result = _measure(fn, repeat)
                busy = m.pop("busy_sum") / t
                if first is None:
                    first, base = result, m
                row = {"kernel": name, "threads": t, **{k: round(v, 2) for k, v in m.items()},
                       "busy": round(busy, 2), "wall_vs_1": round(m["wall_ms"] / base["wall_ms"], 3),
                       "cpu_vs_1": round(m["cpu_ms"] / base["cpu_ms"], 3),
                       "same_bits": bool(np.array_equal(result, first))}
                rows.append(row)
                key = name.split()[0] + ("_backward" if "backward" in name else "_grad" if "grad" in name else "")
                summary[f"{key}_t{t}_wall_vs_t{counts[0]}"] = row["wall_vs_1"]
                summary[f"{key}_t{t}_cpu_vs_t{counts[0]}"] = row["cpu_vs_1"]
                summary[f"{key}_t{t}_serial_ms"] = row["serial_ms"]
                summary.setdefault("all_same_bits", True)
                summary["all_same_bits"] &= row["same_bits"]
    finally:
        pg.set_num_threads(before)
    summary["load_average_1min_after"] = os.getloadavg()[0]
    return {"rows": rows, "summary": summary}


@register("threads", "parallel numpy kernels (SpMM fwd/bwd, elementwise, column sums) at 1, 2, ... threads: "
                     "wall, CPU time, serial part, thread busy fraction, same bits",
          options=_options)
def run(quick: bool, nodes: int | None = None, edges: int | None = None, features: int | None = None,
        graph: str = "uniform", threads: str = "1,2", repeat: int = 5) -> dict:
    size = dict(_QUICK if quick else _DEFAULTS)
    for k, v in (("nodes", nodes), ("edges", edges), ("features", features)):
        if v is not None:
            size[k] = v
    counts = [int(c) for c in threads.split(",") if c.strip()]
    return measure(size["nodes"], size["edges"], size["features"], graph, counts, 3 if quick else repeat)
