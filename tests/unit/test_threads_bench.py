"""The ``threads`` benchmark's plumbing on a tiny graph (the figures come from running it): its
own options, a row per kernel and thread count, and the same bits at every count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_threads_reports_every_kernel_at_every_count_with_the_same_bits():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "benchmarks", "threads", "--json-only", "--nodes", "3000",
                          "--edges", "30000", "--features", "8", "--threads", "1,2", "--repeat", "1",
                          "--graph", "rmat"],
                         capture_output=True, text=True, cwd=str(REPO_ROOT), env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])["summary"]
    assert (summary["nodes"], summary["edges"], summary["graph"], summary["threads"]) == (3000, 30000, "rmat", [1, 2])
    assert summary["all_same_bits"] is True
    for kernel in ("spmm", "spmm_backward", "matmul", "matmul_grad", "elementwise", "column"):
        assert f"{kernel}_t2_cpu_vs_t1" in summary, kernel
