"""The stable (major, minor) order of integer pairs -- ``np.lexsort((minor, major))`` -- in one sort.

``np.lexsort`` sorts by each key in turn (a merge sort per key): ~90 us for GIN's ~2,700 edges,
the largest single cost of building a batch's graph structure.  When the pairs' ranges let
``(major - lo) * span + (minor - lo')`` fit in an int64, that one key orders the pairs exactly as
the two keys do (``minor - lo'`` lies in ``[0, span)``), and numpy's stable argsort of integers (a
radix sort) gives the same permutation -- equal pairs keep their input order in both -- in ~10 us.
Anything else (floats, huge ranges, empty input) is ``np.lexsort`` itself.
"""
from __future__ import annotations

import numpy as np

__all__ = ["lexsort_pairs"]

#: keys up to this stay far from int64's limit (the product is checked in Python integers)
_MAX_KEY = 1 << 62


def lexsort_pairs(minor: np.ndarray, major: np.ndarray) -> np.ndarray:
    """``np.lexsort((minor, major))``: positions sorted by ``major``, then ``minor``, ties in input order."""
    if minor.ndim != 1 or major.shape != minor.shape or not minor.size or not (_fits(minor) and _fits(major)):
        return np.lexsort((minor, major))
    lo_minor, lo_major = int(minor.min()), int(major.min())
    span = int(minor.max()) - lo_minor + 1
    if (int(major.max()) - lo_major + 1) * span > _MAX_KEY:
        return np.lexsort((minor, major))
    key = (major.astype(np.int64, copy=False) - lo_major) * span + (minor.astype(np.int64, copy=False) - lo_minor)
    return np.argsort(key, kind="stable")


def _fits(a: np.ndarray) -> bool:
    """Whether ``a``'s integers all convert to int64 (uint64 may not)."""
    return a.dtype.kind == "i" or (a.dtype.kind == "u" and a.dtype.itemsize < 8)
