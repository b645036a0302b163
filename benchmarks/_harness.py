"""The benchmark harness: a registry, the command line, and measuring helpers.

Running
-------
::

    python -m benchmarks --list               # every registered benchmark, with its description
    python -m benchmarks NAME [--quick]       # table of rows, then ONE final JSON line
    python -m benchmarks NAME --json-only     # only the JSON line (for scripts / CI)

The last line of the output is always a single JSON object::

    {"name": ..., "description": ..., "quick": ..., "summary": {...},
     "python": "3.11.7", "implementation": "CPython",
     "machine": {"cpu_count": ..., "platform": ..., "machine": ..., "processor": ...}}

Adding a benchmark
------------------
Create ``benchmarks/<name>_bench.py`` (the ``_bench.py`` suffix is how modules are discovered)
and register a ``run(quick: bool) -> dict`` function::

    from benchmarks._harness import register, timeit, optional_import, skipped_row

    @register("sparse", "SpMM forward/backward vs scipy and torch")
    def run(quick: bool) -> dict:
        torch = optional_import("torch")
        rows = []
        if torch is None:
            rows.append(skipped_row("torch", section="spmm"))
        ...
        return {"rows": rows, "summary": {"ratio_vs_scipy": 0.9}}

``rows`` is a list of flat dicts (one table row each; the columns are the union of their keys in
first-seen order); ``summary`` is a flat, JSON-serialisable dict of the headline figures.

Rules for benchmark modules:

* Import optional baselines (micrograd, torch, scipy, torch_geometric ...) *inside* ``run`` via
  :func:`optional_import`, never at module top level: ``--list`` imports every module, and a
  missing baseline must become a ``skipped: <package> not installed (pip install polygrad-core[bench])``
  row (:func:`skipped_row`), never a crash.
* ``python -m benchmarks NAME`` first imports ``NAME_bench.py`` only (lazy discovery); it falls
  back to importing every ``*_bench.py`` when the name is registered from a differently named
  module.  A module that fails to import is reported by ``--list`` and skipped.
* Ratios should be measured against anchors timed *in the same run* (machines differ; ratios
  travel, absolute seconds do not).

Helpers
-------
* :func:`timeit` -- median wall time (``time.perf_counter``) over ``repeat`` calls after ``warmup``
  untimed calls; returns ``(median_seconds, all_seconds)``.
* :func:`peak_memory_growth` -- peak growth of the process's **resident set size** (RSS, via
  psutil) while ``fn`` runs, sampled by a background thread every ``interval`` seconds (default
  1 ms), relative to the RSS just before the call.  It sees every allocation (numpy, C extensions,
  the Python heap) but, being sampled, can miss a spike shorter than ``interval``, and it cannot
  see memory the allocator reuses from earlier frees.  ``method="tracemalloc"`` instead reports
  ``tracemalloc``'s exact peak of Python-allocator traced memory (numpy arrays are traced too;
  memory allocated by other C libraries is not), at a large slow-down while tracing.  psutil
  missing -> tracemalloc is used and the result says so.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import pkgutil
import platform
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = [
    "Benchmark", "REGISTRY", "register", "discover", "timeit", "peak_memory_growth",
    "MemoryGrowth", "optional_import", "skipped_row", "format_table", "machine_info", "main",
]

BENCH_EXTRA = "pip install polygrad-core[bench]"


@dataclass
class Benchmark:
    name: str
    description: str
    run: Callable[..., dict]
    module: str
    #: ``add_arguments(parser)`` for a benchmark with options of its own (``--nodes`` ...): they are
    #: parsed from what follows its name and passed to ``run`` as keyword arguments
    options: Optional[Callable[[argparse.ArgumentParser], None]] = None


REGISTRY: dict[str, Benchmark] = {}
IMPORT_ERRORS: dict[str, str] = {}


def register(name: str, description: str,
             options: Optional[Callable[[argparse.ArgumentParser], None]] = None
             ) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Decorator registering ``run(quick: bool, **options) -> {"rows": [...], "summary": {...}}`` as
    ``name``; ``options(parser)`` declares the benchmark's own command-line options, if any."""

    def deco(fn: Callable[[bool], dict]) -> Callable[[bool], dict]:
        prev = REGISTRY.get(name)
        if prev is not None and prev.module != fn.__module__:
            raise ValueError(
                f"benchmark {name!r} registered twice: by {prev.module} and by {fn.__module__}"
            )
        REGISTRY[name] = Benchmark(name, description, fn, fn.__module__, options)
        return fn

    return deco


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _bench_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules([_package_dir()])
        if m.name.endswith("_bench") and not m.ispkg
    )


def _import(modname: str) -> bool:
    full = f"{__package__ or 'benchmarks'}.{modname}"
    try:
        importlib.import_module(full)
        return True
    except Exception as exc:  # a broken benchmark module must not break the others
        IMPORT_ERRORS[modname] = f"{type(exc).__name__}: {exc}"
        return False


def discover(name: Optional[str] = None) -> dict[str, Benchmark]:
    """Import benchmark modules: just ``<name>_bench`` when it registers ``name``, else all."""
    if name is not None:
        if name in REGISTRY:
            return REGISTRY
        if f"{name}_bench" in _bench_modules():
            _import(f"{name}_bench")
            if name in REGISTRY:
                return REGISTRY
    for mod in _bench_modules():
        _import(mod)
    return REGISTRY


# ---------------------------------------------------------------------------------------------
# measuring helpers
# ---------------------------------------------------------------------------------------------
def timeit(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times timed.

    Returns ``(median_seconds, [seconds of each timed call])``.  The garbage collector is left
    as the caller set it (benchmarks that compare GC on/off control it themselves).
    """
    if repeat < 1:
        raise ValueError("timeit: repeat must be >= 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


@dataclass
class MemoryGrowth:
    """Result of :func:`peak_memory_growth`: ``bytes`` of peak growth, how it was measured."""

    bytes: int
    method: str            # "rss" (psutil, sampled) or "tracemalloc"
    result: Any = field(default=None, repr=False)

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


def peak_memory_growth(fn: Callable[[], Any], method: str = "rss", interval: float = 0.001) -> MemoryGrowth:
    """Peak memory growth while ``fn()`` runs (see the module docstring for the two methods).

    ``method="rss"``: psutil RSS sampled every ``interval`` s in a daemon thread, minus the RSS
    measured right before the call (after a ``gc.collect()``).  ``method="tracemalloc"``: the
    tracemalloc peak during the call.  ``fn``'s return value is kept in ``.result``.
    """
    gc.collect()
    if method == "rss":
        try:
            import psutil
        except ImportError:
            method = "tracemalloc"
    if method == "tracemalloc":
        import tracemalloc

        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        try:
            result = fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            if not was_tracing:
                tracemalloc.stop()
        return MemoryGrowth(max(0, peak - base), "tracemalloc", result)
    if method != "rss":
        raise ValueError(f"peak_memory_growth: method must be 'rss' or 'tracemalloc', got {method!r}")

    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss = proc.memory_info().rss
            if rss > peak[0]:
                peak[0] = rss
            stop.wait(interval)

    th = threading.Thread(target=sample, name="peak_memory_growth", daemon=True)
    th.start()
    try:
        result = fn()
    finally:
        stop.set()
        th.join()
    rss = proc.memory_info().rss
    return MemoryGrowth(max(0, max(peak[0], rss) - base), "rss", result)


def optional_import(name: str) -> Any:
    """Import an optional baseline; ``None`` when it is not installed (or fails to import)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def skipped_row(package: str, section: str = "", reason: Optional[str] = None) -> dict:
    """The table row shown instead of a baseline that is not installed."""
    row = {"section": section} if section else {}
    row["status"] = reason or f"skipped: {package} not installed ({BENCH_EXTRA})"
    return row


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e4 or a < 1e-3:
            return f"{v:.3e}"
        return f"{v:.4g}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    """Plain aligned text table; columns are the union of row keys in first-seen order."""
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def machine_info() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else str(x)
    try:
        return float(x)  # numpy scalars
    except Exception:
        return str(x)


def planetoid_dir():
    """Folder with the Planetoid files: $POLYGRAD_PLANETOID_DIR, ../shared/data/planetoid beside the
    checkout, .device_data/planetoid (the GPU machine's carried copy), or the download cache."""
    from pathlib import Path

    from polygrad.data import find_planetoid_dir
    repo = Path(__file__).resolve().parents[1]
    return find_planetoid_dir(repo.parent / "shared" / "data" / "planetoid", repo / ".device_data" / "planetoid")


def _current_backend() -> str:
    import polygrad as pg
    return pg.get_backend()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="polygrad benchmarks")
    p.add_argument("name", nargs="?", help="benchmark to run (see --list)")
    p.add_argument("--list", action="store_true", help="list registered benchmarks and exit")
    p.add_argument("--quick", action="store_true", help="fewer steps/repeats (smoke test)")
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--backend", metavar="NAME",
                   help="polygrad backend the benchmark's tensors are created on (default: numpy)")
    args, extra = p.parse_known_args(argv)
    if args.backend:
        import polygrad as pg
        pg.set_backend(args.backend)  # BackendUnavailableError names the reason when it cannot run

    if args.list or not args.name:
        discover()
        for b in sorted(REGISTRY.values(), key=lambda b: b.name):
            print(f"{b.name:<12} {b.description}")
        for mod, err in sorted(IMPORT_ERRORS.items()):
            print(f"{'(' + mod + ')':<12} failed to import: {err}")
        if not args.list:
            p.print_usage()
            return 2
        return 0

    discover(args.name)
    bench = REGISTRY.get(args.name)
    if bench is None:
        known = ", ".join(sorted(REGISTRY)) or "none"
        print(f"unknown benchmark {args.name!r}; known: {known}", file=sys.stderr)
        for mod, err in sorted(IMPORT_ERRORS.items()):
            print(f"  ({mod} failed to import: {err})", file=sys.stderr)
        return 2

    kwargs: dict = {}
    if bench.options is not None:
        own = argparse.ArgumentParser(prog=f"python -m benchmarks {bench.name}")
        bench.options(own)
        kwargs = vars(own.parse_args(extra))
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")

    status = 0
    try:
        result = bench.run(args.quick, **kwargs)
        rows = list(result.get("rows", []))
        summary = dict(result.get("summary", {}))
    except Exception as exc:
        traceback.print_exc()
        rows, summary, status = [], {"error": f"{type(exc).__name__}: {exc}"}, 1

    if not args.json_only:
        print(format_table(rows))
    record = {
        "name": bench.name,
        "description": bench.description,
        "quick": args.quick,
        "backend": _current_backend(),
        "summary": summary,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": machine_info(),
    }
    print(json.dumps(_jsonable(record), sort_keys=False))
    return status
