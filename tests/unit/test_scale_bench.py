"""The ``scale`` benchmark's plumbing (its own options through the harness, one process per system,
the JSON summary), on a tiny graph: the figures themselves come from running it, not from tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          cwd=str(REPO_ROOT), env=env, timeout=300)


def test_scale_runs_its_systems_with_its_own_options():
    res = _bench("scale", "--json-only", "--nodes", "3000", "--edges", "20000", "--features", "8",
                 "--epochs", "2", "--systems", "polygrad,construction")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])["summary"]
    assert (summary["nodes"], summary["edges"], summary["features"]) == (3000, 20000, 8)
    assert summary["polygrad_later_epoch_s"] > 0 and summary["polygrad_peak_rss_gb"] > 0
    assert summary["construction_vs_scipy"] > 0
    assert not any(k.endswith("_error") for k in summary), summary


def test_options_are_refused_for_a_benchmark_without_them():
    res = _bench("value", "--nodes", "5")
    assert res.returncode == 2 and "unrecognized arguments: --nodes 5" in res.stderr


def test_scale_rejects_a_malformed_option():
    res = _bench("scale", "--nodes", "many")
    assert res.returncode == 2 and "--nodes" in res.stderr


def test_scale_runs_each_system_at_each_thread_count_on_an_rmat_graph():
    res = _bench("scale", "--json-only", "--nodes", "2000", "--edges", "16000", "--features", "8",
                 "--epochs", "2", "--systems", "polygrad", "--threads", "1,2", "--graph", "rmat")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])["summary"]
    assert summary["graph"] == "rmat" and summary["threads"] == [1, 2]
    assert summary["polygrad_later_epoch_s_t2"] > 0 and summary["polygrad_epoch_t2_vs_t1"] > 0
    assert summary["polygrad_losses_bit_identical_across_threads"] is True
    assert 0 < summary["polygrad_projected_t16_vs_t1"] <= 1


def test_scale_rejects_bad_thread_lists_and_graphs():
    for args in (("--threads", "0,2"), ("--threads", "two"), ("--graph", "tree")):
        res = _bench("scale", *args)
        assert res.returncode == 2 and args[0] in res.stderr, (args, res.stderr[-500:])


def test_rmat_edges_are_in_range_and_skewed():
    from benchmarks.scale_bench import rmat_edge_index
    import numpy as np

    ei = rmat_edge_index(np.random.default_rng(0), 3000, 60_000)  # not a power of two: folded
    assert ei.shape == (2, 60_000) and ei.min() >= 0 and ei.max() < 3000
    degree = np.bincount(ei[0], minlength=3000)
    assert degree.max() > 20 * degree.mean()  # a power law: a few huge rows
