"""Run a snippet in a child process under an address-space limit (RLIMIT_AS).

Memory tests run their hostile cases here, so a regression that really allocates gigabytes
gets a MemoryError in the child instead of taking the shared machine down.  The child reports
one JSON line per case: the exception type and message (or "ok"), and the growth of its peak
RSS during the case, which shows whether anything large was allocated before the refusal.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PRELUDE = """
import json, resource, sys, traceback
import numpy as np
import polygrad as pg
from polygrad import memory

def _vms():
    import psutil
    return psutil.Process().memory_info().vms

# the address space the interpreter already maps, plus HEADROOM: enough for the small operands,
# nowhere near the gigabytes a refused allocation would need
_limit = _vms() + HEADROOM
resource.setrlimit(resource.RLIMIT_AS, (_limit, _limit))
if AVAILABLE is not None:  # a fixed, small budget: cases stay tiny, the result deterministic
    memory.available_bytes = lambda backend=None: AVAILABLE

def case(name, fn):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        fn()
        outcome = {"type": "ok", "message": ""}
    except BaseException as exc:
        outcome = {"type": type(exc).__name__, "message": str(exc)[:400],
                   "mro": [c.__name__ for c in type(exc).__mro__],
                   "trace": traceback.format_exc()[-1500:]}
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(json.dumps({"case": name, "rss_growth": grown, **outcome}), flush=True)
"""


def run_limited(body: str, available: int | None = None, headroom: int = 768 << 20,
                timeout: float = 240) -> dict[str, dict]:
    """Run ``body`` (which calls ``case(name, fn)``) in a limited child; {case name: outcome}."""
    code = (_PRELUDE.replace("HEADROOM", str(headroom)).replace("AVAILABLE", repr(available))
            + textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            results[rec["case"]] = rec
    if proc.returncode != 0 and not results:
        raise AssertionError(f"limited child failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
    return results
