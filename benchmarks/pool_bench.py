"""The host array pool against no pool, each in a fresh process: peak memory when output sizes keep
changing, idle memory it keeps afterwards, and time when they do not.

    python -m benchmarks pool [--quick]

* ``churn``: 40 steps, each two elementwise ops on a slice of one input, whose outputs are a new
  size between 120 and 240 MB every step (the issue's case).  A pool that keeps every size it saw
  holds gigabytes; this one gives buffers of sizes no longer asked for back.  Target (architecture
  round 3): peak RSS with the pool <= 1.2x without it.
* ``loader``: the same with a new input array of that size each step (a data loader's batch): the
  pool cannot see that allocation, so the buffers it keeps idle until its next miss add to it.
* ``steady``: the same op on one size, repeatedly (a training loop): the pool saves the page
  faults of fresh memory at every step, so it should be faster.

Each row is measured in its own subprocess (``POLYGRAD_NUMPY_POOL=1`` or ``0``) so neither run
inherits the other's heap; peak RSS is the process's own high-water mark (``ru_maxrss``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks._harness import register

_CHILD = r"""
import json, resource, sys, time
import numpy as np
import polygrad as pg
from polygrad.runtime.pool import HOST_POOL

case, steps = sys.argv[1], int(sys.argv[2])
MB = 1 << 20
rng = np.random.default_rng(0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
keep = []
t0 = time.perf_counter()
fixed = pg.tensor(np.ones(240 * MB // 8))
for i in range(steps):
    n = 160 * MB // 8 if case == "steady" else int(rng.integers(120, 241)) * MB // 8
    # churn: slices of one input; loader: a new input each step, as a data loader hands over batches
    # of varying sizes (its arrays, and pg.tensor's copy of them, are not the pool's)
    x = pg.tensor(np.ones(n)) if case == "loader" else fixed[:n]
    y = (x * 1.5).exp()                # kernel outputs of n float64 each
    keep.append(float(y[0]))
    del x, y
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": elapsed, "peak_bytes": peak - base,
                  "idle_bytes": HOST_POOL.idle_bytes()}))
"""


def _run(case: str, steps: int, pool: bool) -> dict:
    env = {**os.environ, "POLYGRAD_NUMPY_POOL": "1" if pool else "0", "POLYGRAD_BACKEND": "numpy"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, case, str(steps)], env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pool benchmark child ({case}, pool={pool}) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@register("pool", "host array pool vs none: peak RSS with varying sizes (target <= 1.2x), steady-loop time")
def run(quick: bool) -> dict:
    steps = 12 if quick else 40
    rows, summary = [], {}
    for case in ("churn", "loader", "steady"):
        with_pool, without = _run(case, steps, True), _run(case, steps, False)
        for label, r in (("pool", with_pool), ("no pool", without)):
            rows.append({"case": case, "system": label, "steps": steps, "seconds": round(r["seconds"], 3),
                         "peak_MB": round(r["peak_bytes"] / 2**20),
                         "idle_after_MB": None if r["idle_bytes"] is None else round(r["idle_bytes"] / 2**20)})
        summary[f"{case}_peak_ratio_pool_vs_none"] = round(with_pool["peak_bytes"] / max(without["peak_bytes"], 1), 3)
        summary[f"{case}_time_ratio_pool_vs_none"] = round(with_pool["seconds"] / without["seconds"], 3)
    summary["churn_target_peak_ratio"] = 1.2
    return {"rows": rows, "summary": summary}
