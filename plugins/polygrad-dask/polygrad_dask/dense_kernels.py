"""Dense kernels on dask arrays: each builds a task graph, block by block (rows stay chunked).

Most ops are dask.array's own (elementwise, reductions, matmul, movement).  What dask does not
do the way polygrad needs is written here: a boolean mask index becomes integer positions (dask
would give unknown chunk sizes), several array indices become a pointwise ``vindex``, and
``index_add`` (the backward of indexing) is done per output row block from the positions that
land in it, so no task holds a whole ``N x F`` array.
"""
from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.core import elemwise

from polygrad.backends import numpy as numpy_backend
from polygrad.ir.ops import Op
from polygrad.runtime.backend import elementwise_kernels

from . import chunks


def relu(x: da.Array) -> da.Array:
    return da.maximum(x, x.dtype.type(0))


def where_block(cond: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.where(cond, a, b)`` on one block, bit for bit, without a branch per element.

    np.where branches per element, which mispredicts on a random condition: ReLU's backward
    ``where(out <= 0, 0, g)`` took 109 ms per 500k x 16 float32 block against ~50 ms here.  On
    the bits (any dtype of 4 or 8 bytes; NaN, -0.0 and infinities pass untouched)
    ``where(cond, 0, b)`` is ``b & (cond - 1)`` and a general one ``b ^ ((a ^ b) * cond)``
    (``where_bits_into``, shared with the numpy backend).  The numpy backend's
    ``branch_free_where`` writes into its pooled buffers on its threads: a dask worker keeps its
    task results (a pool would hand their memory out again) and runs one task per thread, so here
    the output is a plain ``np.empty``.  Other dtypes, small blocks and
    operands that are not C-contiguous (np.where would keep their layout) go to np.where.
    """
    dt = a.dtype
    if cond.dtype != np.bool_ or b.dtype != dt or dt.itemsize not in (4, 8) or dt.kind not in "fiu":
        return np.where(cond, a, b)
    ints = np.dtype(f"i{dt.itemsize}")
    bits_a, bits_b = a.view(ints), b.view(ints)
    zero_a = a.ndim == 0 and not bits_a
    shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    size = int(np.prod(shape))
    # below these sizes np.where is as fast (the numpy backend's thresholds, measured there)
    smallest = numpy_backend.BRANCH_FREE_WHERE_MIN if zero_a else numpy_backend.BRANCH_FREE_WHERE_GENERAL_MIN
    if size < smallest or not all(v.flags.c_contiguous for v in (cond, a, b) if v.shape == shape):
        return np.where(cond, a, b)
    out = np.empty(shape, ints)
    numpy_backend.where_bits_into(out, cond, bits_a, bits_b, zero_a)
    return out.view(dt)


def where(cond: da.Array, a: da.Array, b: da.Array) -> da.Array:
    """``da.where`` (the same ``elemwise`` graph: chunks, broadcasting, dtype) with
    :func:`where_block` on each block instead of np.where."""
    return elemwise(where_block, cond, a, b)


def cast(x: da.Array, *, dtype: Any) -> da.Array:
    return x.astype(dtype)


def _sum_block(block: np.ndarray, axes: tuple, keepdims: bool, dtype: Any) -> np.ndarray:
    return np.sum(block, axis=axes, keepdims=keepdims, dtype=dtype)


def _max_block(block: np.ndarray, axes: tuple, keepdims: bool, dtype: Any) -> np.ndarray:
    return np.max(block, axis=axes, keepdims=keepdims)


def _within_blocks(x: da.Array, reduce_block: Any, axes: tuple, keepdims: bool, dtype: Any) -> da.Array | None:
    """A reduction over ``axes`` as ONE task per block (``reduce_block``: :func:`_sum_block` or
    :func:`_max_block`) when no reduced axis is split into chunks -- a row-wise sum or max of a
    row-blocked array, as in a softmax or a loss -- else None.

    dask's reduction makes two tasks per block even then: the block's reduction with
    ``keepdims``, then an "aggregate" that reduces the one partial again -- a scheduler round trip
    on the step's critical path, and an identity on what the first reduction gives: a max over one
    element is that element (NaN payloads and -0.0 included); a sum over one element maps -0.0 to
    +0.0 and quiets a signalling NaN, but a sum never gives either (numpy starts it from +0.0 and
    adds quietly).  So the same numpy call on the same block gives dask's bits
    (``tests/test_row_reductions.py``, generated arrays with NaN payloads and -0.0)."""
    axes = tuple(sorted(a % x.ndim for a in axes))
    if not axes or any(len(x.chunks[a]) != 1 for a in axes):
        return None
    if keepdims:
        kept = tuple((1,) if d in axes else c for d, c in enumerate(x.chunks))
        return x.map_blocks(reduce_block, axes, keepdims, dtype, chunks=kept, dtype=dtype)
    left = tuple(c for d, c in enumerate(x.chunks) if d not in axes)
    return x.map_blocks(reduce_block, axes, keepdims, dtype, chunks=left, drop_axis=axes, dtype=dtype)


def reduce_sum(x: da.Array, *, axes: tuple, keepdims: bool) -> da.Array:
    # no axes: the identity, except bool/int, which numpy's sum promotes (as the numpy backend)
    if not axes:
        return x.sum(axis=axes, keepdims=keepdims) if x.dtype.kind in "biu" else x
    dtype = np.zeros(1, dtype=x.dtype).sum().dtype  # the dtype dask's sum gives (bool/int: platform int)
    out = _within_blocks(x, _sum_block, tuple(axes), keepdims, dtype)
    return x.sum(axis=axes, keepdims=keepdims) if out is None else out


def reduce_max(x: da.Array, *, axes: tuple, keepdims: bool) -> da.Array:
    if not axes:
        return x
    out = _within_blocks(x, _max_block, tuple(axes), keepdims, x.dtype)
    return x.max(axis=axes, keepdims=keepdims) if out is None else out


def reshape(x: da.Array, *, shape: tuple) -> da.Array:
    try:
        return x.reshape(shape, merge_chunks=True)
    except NotImplementedError:
        # dask reshapes only by merging or evenly splitting axes; an uneven regrouping (a small
        # weight, a loss term) goes through one block: rows are never regrouped that way
        return x.rechunk(-1).reshape(shape).rechunk(chunks.chunks_for(tuple(shape)))


def permute(x: da.Array, *, perm: tuple) -> da.Array:
    return da.transpose(x, perm)


def expand(x: da.Array, *, shape: tuple) -> da.Array:
    """``x`` broadcast to ``shape``, chunked as every array of that shape (row blocks on axis 0).

    dask's default gives a broadcast axis one chunk: a bias expanded to ``N x F`` would be one
    ``N``-row block that every elementwise op with a row-blocked array first splits
    (``rechunk``), on one worker, with half of it sent to the other; chunked by rows, each block
    is a view made where it is used."""
    shape = tuple(shape)
    lead = len(shape) - x.ndim
    out = []
    for d, n in enumerate(shape):
        k = d - lead
        if k >= 0 and x.shape[k] == n and n != 1:
            out.append(x.chunks[k])  # an axis x already has: its own chunks (broadcast_to requires them)
        else:
            out.append(chunks.row_chunks(n) if d == 0 else (n,))
    return da.broadcast_to(x, shape, chunks=tuple(out))


def _host_index(index: tuple) -> tuple:
    """Boolean arrays as integer positions (known chunk sizes), everything else as given."""
    out: list = []
    for i in index:
        if isinstance(i, np.ndarray) and i.dtype == np.bool_:
            out.extend(np.nonzero(i))
        else:
            out.append(i)
    return tuple(out)


def _is_array(i: Any) -> bool:
    return isinstance(i, np.ndarray) and i.ndim > 0


def getitem(x: da.Array, *, index: tuple) -> da.Array:
    idx = _host_index(index)
    arrays = [i for i in idx if _is_array(i)]
    if len(arrays) <= 1:
        return x[idx]
    if all(_is_array(i) for i in idx):
        return x.vindex[idx]
    # numpy's rules for arrays mixed with slices reorder axes; dask does not implement them
    raise NotImplementedError("dask: indexing with several arrays mixed with slices is left to the "
                              "fallback chain")


def _pointwise(index: tuple, shape: tuple, src_shape: tuple) -> list | None:
    """The index as equal-length 1-D integer arrays on the leading axes (wrapped into range) when
    ``src`` is laid out as ``[K] + shape[k:]``; None for any other form."""
    idx = _host_index(index)
    if not idx or not all(_is_array(i) and i.ndim == 1 and i.dtype.kind in "iu" for i in idx):
        return None
    k = idx[0].shape[0]
    if any(i.shape[0] != k for i in idx) or tuple(src_shape) != (k,) + tuple(shape[len(idx):]):
        return None
    return [np.asarray(i, dtype=np.int64) % max(n, 1) for i, n in zip(idx, shape)]


def _joined(pieces: tuple) -> np.ndarray:
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)


def _add_at_block(rows: int, tail: tuple, dtype: Any, local: tuple, *src: np.ndarray) -> np.ndarray:
    out = np.zeros((rows,) + tail, dtype=dtype)
    np.add.at(out, local, _joined(src))  # unbuffered: repeated positions accumulate
    return out


def _add_at_whole(shape: tuple, dtype: Any, index: tuple, *src: np.ndarray) -> np.ndarray:
    out = np.zeros(shape, dtype=dtype)
    np.add.at(out, index, _joined(src))
    return out


def _chunks_of(x: da.Array) -> list:
    """``x``'s chunks as delayed values, in row order (``x`` is split along its first axis only).
    A dask array handed whole to a delayed call becomes a 'finalize' task that does not keep the
    futures inside the array alive: a persisted operand's keys could be released before it runs
    ("lost dependencies")."""
    x = x.rechunk((x.chunks[0],) + tuple((s,) for s in x.shape[1:])) if x.ndim > 1 else x
    return list(x.to_delayed(optimize_graph=False).reshape(-1)) if x.size or x.ndim else [x.to_delayed()]


def index_add(src: da.Array, *, index: tuple, shape: tuple) -> da.Array:
    """``zeros(shape)`` with ``src`` added at ``index`` (repeats accumulate), per output row block."""
    dtype = src.dtype
    point = _pointwise(index, shape, src.shape) if shape else None
    if point is None:
        # other index forms (slices, scalars, broadcast arrays): one task; they come from small
        # ops (a loss picking a column), never from message passing
        whole = da.from_delayed(_delayed(_add_at_whole)(tuple(shape), dtype, index, *_chunks_of(src)), shape,
                                dtype=dtype)
        return whole.rechunk(chunks.chunks_for(tuple(shape))) if shape else whole
    tail = tuple(shape[1:])
    blocks = []
    start = 0
    for rows in chunks.row_chunks(shape[0]):
        stop = start + rows
        hit = np.nonzero((point[0] >= start) & (point[0] < stop))[0]
        local = (point[0][hit] - start,) + tuple(p[hit] for p in point[1:])
        part = src[hit] if hit.size else np.zeros((0,) + tuple(src.shape[1:]), dtype=dtype)
        pieces = _chunks_of(part) if isinstance(part, da.Array) else [part]
        blocks.append(da.from_delayed(_delayed(_add_at_block)(rows, tail, dtype, local, *pieces),
                                      (rows,) + tail, dtype=dtype))
        start = stop
    return da.concatenate(blocks, axis=0) if len(blocks) > 1 else blocks[0]


def _delayed(fn):
    return dask.delayed(fn, pure=True)


def concat(*arrays: da.Array, axis: int) -> da.Array:
    return da.concatenate(arrays, axis=axis)


KERNELS: dict[Op, Any] = {
    **elementwise_kernels(da), Op.RELU: relu, Op.CAST: cast, Op.WHERE: where,
    Op.SUM: reduce_sum, Op.MAX: reduce_max,
    Op.RESHAPE: reshape, Op.PERMUTE: permute, Op.EXPAND: expand, Op.GETITEM: getitem,
    Op.INDEX_ADD: index_add, Op.CONCAT: concat, Op.MATMUL: da.matmul,
}
