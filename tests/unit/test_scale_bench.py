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
