"""Per-op dispatch overhead of the numpy backend on tiny tensors, with and without the monitor.

Tiny (2-element) tensors make the kernels' own cost negligible, so the time per op is polygrad's
dispatch path: inference, the kernel-table lookup, output checks, node recording and the event
check.  Measured in four configurations, interleaved round by round (order rotated) so machine
noise hits all alike; a ratio is the median of the per-round ratios to ``none``:

* ``none``      no monitor was ever created (the anchor);
* ``disabled``  a monitor created, used and paused (``m.pause()``): installed but not enabled;
* ``enabled``   inside ``with pg.monitor():`` -- every op fires the ``polygrad_op_executed`` hook;
* ``noop_hook`` a plugin whose ``polygrad_op_executed`` does nothing: pluggy's call cost alone.

The target: ``disabled`` within 5% of ``none`` (the monitor costs nothing unless enabled).
"""
from __future__ import annotations

import gc
import statistics
import time

from benchmarks._harness import register

TARGET = 1.05


def _workload(pg, requires_grad: bool):
    a = pg.tensor([1.0, 2.0], requires_grad=requires_grad)
    b = pg.tensor([3.0, 4.0])

    def run(n: int) -> int:
        for _ in range(n):
            c = a + b
            d = c * a
            e = d.relu()
            e.sum()
        return 4 * n  # ops per call

    return run


def _time(run, n: int) -> float:
    """Seconds per op for one batch."""
    gc.disable()
    try:
        t0 = time.perf_counter()
        ops = run(n)
        return (time.perf_counter() - t0) / ops
    finally:
        gc.enable()


@register("dispatch", "per-op dispatch overhead (numpy, tiny tensors) with the monitor off / installed-disabled / on")
def run(quick: bool) -> dict:
    import polygrad as pg
    from polygrad.runtime.registry import registry

    class NoopHook:
        @pg.hookimpl
        def polygrad_op_executed(self, op, backend, layout, inputs, output):
            return None

    rounds, n = (8, 300) if quick else (120, 300)
    rows, summary = [], {}
    for grad in (False, True):
        work = _workload(pg, grad)
        samples: dict[str, list[float]] = {k: [] for k in ("none", "disabled", "enabled", "noop_hook")}
        work(50)  # warm caches
        monitor = pg.monitor()
        monitor.start()
        work(10)
        monitor.pause()   # installed (created, used) but disabled
        noop = NoopHook()

        def measure(config: str) -> None:
            if config == "enabled":
                monitor.resume()
            elif config == "noop_hook":
                registry.register_plugin(noop, "dispatch-bench-noop")
            try:
                samples[config].append(_time(work, n))
            finally:
                monitor.pause()
                registry.unregister_plugin(noop)

        order = ["none", "disabled", "enabled", "noop_hook"]
        for r in range(rounds):
            # rotate the order each round so no configuration always runs first (or last)
            for config in order[r % 4:] + order[:r % 4]:
                measure(config)  # "none" and "disabled" run the same path: nothing registered
        monitor.stop()
        assert all(v is None for v in registry.events.values()), "a hook stayed registered"
        # ratio: the median over rounds of each round's ratio to "none" (paired, so a slow spell of
        # the shared machine affects numerator and denominator alike)
        med = {k: statistics.median(v) for k, v in samples.items()}
        ratio = {k: statistics.median(a / b for a, b in zip(v, samples["none"])) for k, v in samples.items()}
        tag = "grad" if grad else "no_grad"
        for k in ("none", "disabled", "enabled", "noop_hook"):
            rows.append({"mode": tag, "config": k, "us_per_op": med[k] * 1e6, "min_us": min(samples[k]) * 1e6,
                         "ratio_vs_none": ratio[k]})
        summary[f"{tag}_us_per_op_none"] = med["none"] * 1e6
        summary[f"{tag}_ratio_disabled"] = ratio["disabled"]
        summary[f"{tag}_ratio_enabled"] = ratio["enabled"]
        summary[f"{tag}_ratio_noop_hook"] = ratio["noop_hook"]
    summary["target_ratio_disabled"] = TARGET
    summary["disabled_within_target"] = all(summary[f"{t}_ratio_disabled"] <= TARGET for t in ("no_grad", "grad"))
    return {"rows": rows, "summary": summary}
