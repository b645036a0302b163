"""polygrad benchmarks: ``python -m benchmarks --list`` / ``python -m benchmarks NAME [--quick]``.

Each benchmark lives in ``benchmarks/<name>_bench.py`` and registers itself with
:func:`benchmarks._harness.register`; see ``benchmarks/_harness.py`` for the contract and helpers.
Optional baselines come from ``pip install polygrad-core[bench]``.
"""
from benchmarks._harness import (  # noqa: F401  (re-exported for benchmark modules)
    optional_import,
    peak_memory_growth,
    register,
    skipped_row,
    timeit,
)
