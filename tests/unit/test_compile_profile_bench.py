"""benchmarks/compile_profile.py: per-entry medians over a short run of the GCN demo on the synthetic
graph, on either clock, and a report that ranks them."""
from __future__ import annotations

import importlib

import pytest

from polygrad import data as pdata

profile_bench = importlib.import_module("benchmarks.compile_profile")
executor = importlib.import_module("polygrad.compile.executor")


@pytest.mark.parametrize("cpu", [False, True])
def test_profile_ranks_each_entry_by_its_median_and_restores_the_clock(cpu):
    clock = executor.time
    times, result = profile_bench.profile(pdata.stochastic_block_model(seed=0), epochs=8, cpu=cpu)
    assert executor.time is clock
    assert result["history"].replays >= 2 and times
    assert all(v >= 0.0 for v in times.values()) and any(v > 0.0 for v in times.values())
    assert any("spmm" in label for label in times)
    text = profile_bench.report(times, result, top=3)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 and "replays" in lines[0]
    shown = [float(line.split()[0]) for line in lines[2:]]
    assert shown == sorted(shown, reverse=True)
