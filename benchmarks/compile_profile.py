"""Where a compiled GCN epoch spends its time: each program entry of the pure replay, timed over a
training run (``polygrad.compile.executor.profile_entries``), ranked.

``python -m benchmarks.compile_profile [--data DIR] [--dataset cora] [--epochs 200] [--top 25]``

Prints, per entry, its median microseconds over the epochs (each epoch runs one replay; a
median, so that the machine's load spikes do not rank an entry), its share of the sum of those
medians and the generated line (``b4 = k1(b2, b3, pattern=C24)``: slot 4 is kernel 1 of slots 2
and 3), then the run's median epoch time.  The timing adds two clock reads per entry (roughly
0.1 us each), so the epoch time printed here is above the untimed demo's; compare entries with
each other, not with another run's epoch.  ``--cpu`` times with the thread's CPU clock instead
of the wall clock (what other processes on the machine take is then left out; each read costs
~0.5 us).  Timings on a shared machine are noisy: rank, don't quote to the microsecond.
"""
from __future__ import annotations

import argparse
import importlib
import re
import statistics
import time
from types import SimpleNamespace

from polygrad import data as pdata
from polygrad.apps import demos

executor = importlib.import_module("polygrad.compile.executor")  # the package's name is also a function


def profile(ds: pdata.GraphDataset, epochs: int, cpu: bool = False) -> tuple[dict[str, float], dict]:
    """Per entry, its median seconds per replay over the epochs; and the demo's result."""
    snapshots: list[dict[str, float]] = []
    clock = executor.time
    if cpu:  # the executor reads its clock as time.perf_counter when it generates the timed replay
        executor.time = SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[attr-defined]
    try:
        with executor.profile_entries() as times:
            result = demos.train_gcn(ds, seed=0, epochs=epochs, compile=True,
                                     on_epoch=lambda rec: snapshots.append(dict(times)))
    finally:
        executor.time = clock  # type: ignore[attr-defined]
    per: dict[str, list[float]] = {}
    for before, after in zip(snapshots, snapshots[1:]):
        for label, total in after.items():
            per.setdefault(label, []).append(total - before.get(label, 0.0))
    return {label: statistics.median(v) for label, v in per.items() if v}, result


def report(times: dict[str, float], result: dict, top: int) -> str:
    total = sum(times.values())
    lines = [f"{result['history'].replays} replays, {total * 1e6:.0f} us per replay (sum of the entries' medians); "
             f"median epoch {result['epoch_time_ms']:.3f} ms (timed), test accuracy {result['test_accuracy']:.3f}",
             f"{'us/replay':>10} {'share':>6}  entry"]
    for label, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        shown = re.sub(r"^[0-9a-f]+:", "", label)  # the capture's id: one capture replays here
        lines.append(f"{seconds * 1e6:10.1f} {seconds / total if total else 0.0:6.1%}  {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="Planetoid folder (default: a synthetic graph)")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cpu", action="store_true", help="time with the thread's CPU clock")
    args = parser.parse_args(argv)
    ds = pdata.load_planetoid(args.data, args.dataset) if args.data else pdata.stochastic_block_model(seed=0)
    times, result = profile(ds, args.epochs, args.cpu)
    print(report(times, result, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
