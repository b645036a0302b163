"""SpMM forward+backward on the numpy backend, without and with polygrad-scipy's overrides.

    python plugins/polygrad-scipy/bench/spmm_speed.py [--quick]

Prints the median time of each and the speed-up (ratios measured in the same run).  Also times
the other sparse kernels scipy could serve, to show why only SpMM is overridden.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polygrad as pg  # noqa: E402
import polygrad_scipy  # noqa: E402
from polygrad.sparse.pattern import Pattern  # noqa: E402
from polygrad.runtime.registry import registry  # noqa: E402
from polygrad.tensor import spmm  # noqa: E402
from polygrad.testing.temporary import temporary_plugin  # noqa: E402


def pattern(n: int, nnz: int, seed: int = 0) -> Pattern:
    rng = np.random.default_rng(seed)
    pattern, _, _ = Pattern.from_coo((n, n), rng.integers(0, n, nnz), rng.integers(0, n, nnz))
    return pattern


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    quick = "--quick" in sys.argv
    sizes = [(2708, 13264, 16), (2708, 13264, 64)] + ([] if quick else [(100_000, 1_000_000, 16)])
    repeat = 3 if quick else 7
    registry.load()
    plugin_installed = registry.tables["numpy"].get((pg.Op.SPMM, "csr")) is polygrad_scipy.kernels.spmm
    if plugin_installed:
        print("polygrad-scipy is installed: both columns would use it; run from an environment without it")
        return
    print(f"{'n':>8} {'nnz':>9} {'F':>4}  {'pass':<22} {'numpy ms':>9} {'+scipy ms':>9} {'speed-up':>8}")
    for n, nnz, f in sizes:
        p = pattern(n, nnz)
        v = pg.tensor(np.random.default_rng(1).random(p.nnz))
        x = pg.tensor(np.random.default_rng(2).random((n, f)))
        passes = {"forward": (False, False), "fwd+bwd dX (GCN)": (False, True), "fwd+bwd dA, dX": (True, True)}
        for label, (grad_v, grad_x) in passes.items():
            v.requires_grad, x.requires_grad = grad_v, grad_x

            def step():
                v.grad = x.grad = None
                out = spmm(v, x, p)
                if grad_v or grad_x:
                    out.sum().backward()

            base = median_time(step, repeat)
            with temporary_plugin(polygrad_scipy, "scipy"):
                fast = median_time(step, repeat)
            print(f"{n:>8} {p.nnz:>9} {f:>4}  {label:<22} {base * 1e3:>9.2f} {fast * 1e3:>9.2f} {base / fast:>7.1f}x")
    # the other sparse ops: numpy's kernels vs what scipy could do
    p = pattern(2708, 13264)
    vals = np.random.default_rng(3).random(p.nnz)
    numpy_seg = registry.tables["numpy"][(pg.Op.SEGMENT_SUM, "csr")]
    t_np = median_time(lambda: numpy_seg(vals, pattern=p), 20)
    t_sp = median_time(lambda: np.asarray(polygrad_scipy.kernels.as_csr(vals, p).sum(axis=1)).ravel(), 20)
    print(f"segment_sum (Cora-sized): numpy reduceat {t_np * 1e3:.3f} ms, scipy row sums {t_sp * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
