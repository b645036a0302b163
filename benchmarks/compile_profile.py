"""Where a compiled GCN epoch spends its time: each program entry of the pure replay, timed over a
training run (``polygrad.compile.executor.profile_entries``), ranked.

``python -m benchmarks.compile_profile [--data DIR] [--dataset cora] [--epochs 200] [--top 25]``

Prints, per entry, microseconds per replay, its share of the timed entries' total and the
generated line (``b4 = k1(b2, b3, pattern=C24)``: slot 4 is kernel 1 of slots 2 and 3), then the
run's median epoch time.  The timing adds two clock reads per entry (roughly 0.1 us each), so
the epoch time printed here is above the untimed demo's; compare entries with each other, not
with another run's epoch.  Timings on a shared machine are noisy: rank, don't quote to the
microsecond.
"""
from __future__ import annotations

import argparse
import importlib
import re

from polygrad import data as pdata
from polygrad.apps import demos

executor = importlib.import_module("polygrad.compile.executor")  # the package's name is also a function


def profile(ds: pdata.GraphDataset, epochs: int) -> tuple[dict[str, float], dict]:
    with executor.profile_entries() as times:
        result = demos.train_gcn(ds, seed=0, epochs=epochs, compile=True)
    return times, result


def report(times: dict[str, float], result: dict, top: int) -> str:
    replays = max(result["history"].replays, 1)
    total = sum(times.values())
    lines = [f"{replays} replays, {total / replays * 1e6:.0f} us of timed entries per replay; "
             f"median epoch {result['epoch_time_ms']:.3f} ms (timed), test accuracy {result['test_accuracy']:.3f}",
             f"{'us/replay':>10} {'share':>6}  entry"]
    for label, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        shown = re.sub(r"^[0-9a-f]+:", "", label)  # the capture's id: one capture replays here
        lines.append(f"{seconds / replays * 1e6:10.1f} {seconds / total:6.1%}  {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="Planetoid folder (default: a synthetic graph)")
    parser.add_argument("--dataset", default="cora")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    ds = pdata.load_planetoid(args.data, args.dataset) if args.data else pdata.stochastic_block_model(seed=0)
    times, result = profile(ds, args.epochs)
    print(report(times, result, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
