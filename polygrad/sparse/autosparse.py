"""Automatic sparsification of a dense matmul operand, cached per tensor storage.

``polygrad.tensor``'s matmul asks :func:`maybe_sparsify_for_matmul` whether ``a @ b`` is cheaper
with ``a`` sparse (the layout policy decides); the count and the sparse form are cached.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..runtime import sharing
from ..runtime.config import config
from ..engine.dispatch import is_grad_enabled
from ..tensor import Tensor
from .construct import _nonzero_sparse
from .layout import _events, choose_layout
from .sparse_tensor import SparseTensor


# =====================================================================================================
# automatic sparsification of a dense matmul operand (cached per tensor storage)
# =====================================================================================================

class _CacheEntry:
    __slots__ = ("token", "nnz", "sampled", "sparse")

    def __init__(self, token: Any):
        self.token = token
        self.nnz: int | None = None
        self.sampled: float | None = None
        self.sparse: SparseTensor | None = None


# id(tensor) -> entry; an entry is dropped when its tensor dies (weakref callback), and ignored
# when the tensor's storage (``t._data``) was replaced (``t.data = ...``) since it was made.
_matmul_cache: dict[int, tuple[weakref.ref, _CacheEntry]] = {}
#: entries sampled to estimate a density: at a true density of 3% the chance that 256 samples
#: exceed the rejection bound (2 x break-even + 5%, ~11%) is below 1e-9, and the gather costs a
#: few microseconds even on matrices that do not fit in cache
_SAMPLE = 256
_sample_positions: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _storage_token(data: Any) -> Any:
    try:
        return weakref.ref(data)
    except TypeError:  # arrays without weakref support (the scalar backend's): hold them
        return data


def _token_matches(token: Any, data: Any) -> bool:
    return (token() if isinstance(token, weakref.ref) else token) is data


def _still_matches(entry: _CacheEntry, host: np.ndarray) -> bool:
    """Whether the cached sparse form still equals ``host`` (exact: same nonzero count, and the
    same values at the cached positions -- a zero that became nonzero changes the count unless a
    cached position changed too)."""
    sp = entry.sparse
    if sp is None:
        return True  # only the layout estimate is cached: a stale one costs speed, never correctness
    p = sp.pattern
    values = sp._values._be.to_numpy(sp._values._data)
    return (int(np.count_nonzero(host)) == sp.nnz
            and np.array_equal(host[p.rows, p.cols], values, equal_nan=True))


def _cache_entry(a: Tensor) -> _CacheEntry:
    key = id(a)
    found = _matmul_cache.get(key)
    data = a._data
    if found is not None and found[0]() is a:
        entry = found[1]
        # storage shared with the user (pg.from_numpy, t.numpy()) may have been written since:
        # re-validate the content (O(n*m), still cheaper than a dense matmul); polygrad itself
        # never writes into a storage, so an unshared one is served as is
        if _token_matches(entry.token, data) and (
                not sharing.is_shared(data) or _still_matches(entry, a._be.to_numpy(data))):
            return entry
    entry = _CacheEntry(_storage_token(data))
    def forget(_ref: Any, k: Any = key) -> None:  # the tensor is gone: so is its entry
        _matmul_cache.pop(k, None)

    ref = weakref.ref(a, forget)
    _matmul_cache[key] = (ref, entry)
    return entry


def _sampled_density(host: np.ndarray) -> float:
    """Fraction of nonzeros among _SAMPLE scattered entries (no copy, even of a transposed view).

    Positions come from multiplicative hashing of 0.._SAMPLE-1 (computed once per shape), so the
    sample is deterministic and does not alias with banded or block patterns as a stride could.
    """
    n, m = host.shape
    numel = n * m
    if numel <= _SAMPLE:
        return float(np.count_nonzero(host)) / numel if numel else 0.0
    where_ = _sample_positions.get((n, m))
    if where_ is None:
        pos = (np.arange(_SAMPLE, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(numel)
        where_ = np.divmod(pos.astype(np.int64), m)
        if len(_sample_positions) > 256:  # a bounded memo: shapes come and go
            _sample_positions.clear()
        _sample_positions[(n, m)] = where_
    return float(np.count_nonzero(host[where_])) / _SAMPLE


def maybe_sparsify_for_matmul(a: Tensor, b: Tensor) -> SparseTensor | None:
    """A sparse form of dense ``a`` when the layout policy says ``a @ b`` is cheaper sparse, else None.

    Only a 2-D floating ``a`` that is not itself differentiated qualifies: a dense leaf requiring
    grad needs a gradient at its zeros too, which a sparse form would not give.  The nonzero count
    and the sparse form are cached on the tensor's storage (converted once; a new ``t.data``
    invalidates them; a storage shared with the user -- ``pg.from_numpy``, ``t.numpy()`` -- is
    re-validated against the cached form before each use, so in-place writes are never missed).
    """
    if a.ndim != 2 or b.ndim not in (1, 2) or a.dtype.kind != "f" or b.dtype.kind != "f":
        return None
    if a.requires_grad and is_grad_enabled():
        return None
    if a._be.lazy:  # counting its nonzeros would compute the matrix and gather it onto this process
        return None
    if a.shape[0] * a.shape[1] < config.sparse_min_elements and _events["polygrad_layout_chosen"] is None:
        return None  # choose_layout's size rule, without the bookkeeping (the common small matmul)
    entry = _cache_entry(a)
    host: list = []

    def host_array() -> np.ndarray:
        if not host:
            host.append(a._be.to_numpy(a._data))  # internal read: does not mark the storage shared
        return host[0]

    def count() -> int:
        if entry.nnz is None:
            entry.nnz = int(np.count_nonzero(host_array()))
        return entry.nnz

    if entry.nnz is None and entry.sampled is None and a.shape[0] * a.shape[1] >= config.sparse_min_elements:
        # a scattered sample lets the policy reject a clearly dense operand without an O(n*m) count
        entry.sampled = _sampled_density(host_array())
    chosen = choose_layout(a.shape, count if entry.nnz is None else entry.nnz, op="matmul",
                           feature_width=b.shape[1] if b.ndim == 2 else 1, dtype=a.dtype, backend=a._be,
                           sampled_density=entry.sampled, dense_exists=True)
    if chosen == "dense":
        return None
    if entry.sparse is None:
        entry.sparse = _nonzero_sparse(a.detach(), "csr")
        entry.nnz = entry.sparse.nnz
    return entry.sparse
