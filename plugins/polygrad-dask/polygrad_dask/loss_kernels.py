"""``Op.CROSS_ENTROPY`` and ``Op.SOFT_CROSS_ENTROPY`` on dask: one task per row block forward and
backward, the composite's bits.

Without a kernel, ``pg.cross_entropy(logits, classes)`` on dask runs its composite: some 40
dask tasks of a few microseconds each (max, its aggregate, neg, add, exp, sum, its aggregate,
log, a ``vindex`` gather, ...) whose dependent steps wait on the scheduler in turn.  Here the
per-row work is the steps of :mod:`polygrad.engine.cross_entropy` (the composite's own sequence)
run with numpy on each row block, as ONE task on that block's worker; only the cross-row sum
leaves the block.

The numbers are the composite's on dask, bit for bit, because each step calls on a block what
dask calls on it: ufuncs per block (``np.negative`` for ``da.negative``, ...), a row reduction as
dask's chunk function then its aggregate over that one partial (:class:`BlockSteps`), and a
row-wise result does not depend on the other rows of the array.  The rows' losses are then laid
out in the chunks the composite's ``vindex`` gives them (so "none" hands later ops the same
chunks), and "sum"/"mean" reduce them as the composite does: dask's own ``sum`` of those chunks,
then the mean's multiply -- in one task where the losses are one chunk (the common case: a
``vindex`` output chunk holds ``max(row block) * C`` points).  ``tests/test_fused_loss.py``
checks loss and gradient bitwise against the composite on generated logits.

Class probabilities (``Op.SOFT_CROSS_ENTROPY``) go the same way: one task per row block gives its
rows' losses -- or, for "sum" and "mean", their partial sum, dask's chunk step, with the block's
``exp(shifted)`` and row sums, which its backward then reads instead of recomputing them (a tiny
task per block hands only the partial on) -- and one task adds the partials as dask's aggregate
does and applies the mean's multiply (so 5 tasks forward for 2 blocks, where the composite made
about 25); the backward is one task per block for both gradients.  The probabilities must come
in the logits' own blocks.

Logits that are not float32/float64, are split along the class axis, have an empty row block or
no rows run the same steps over the backend's own dask kernels instead: the composite's
dask graph, the composite's numbers.
"""
from __future__ import annotations

import collections
import uuid
import weakref
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.reductions import chunk_max
from dask.highlevelgraph import HighLevelGraph

from polygrad.backends.cross_entropy_kernels import KernelSteps
from polygrad.engine import cross_entropy
from polygrad.ir.ops import Op
from polygrad.runtime.backend import elementwise_kernels

from . import cluster
from .chunks import row_chunks

#: logits dtypes the per-block path serves (others take the dask kernels' path)
BLOCK_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _sum_dtype(dtype: np.dtype) -> Any:
    """The accumulator dtype ``da.sum`` passes to its chunk and aggregate sums."""
    return getattr(np.zeros(1, dtype=dtype).sum(), "dtype", object)


def _block_sum(x: np.ndarray, *, axes: tuple, keepdims: bool) -> np.ndarray:
    """``da.sum`` over axes ``x`` is not split along, on one block: chunk sum, then the
    aggregate over that single partial (``dask.array.reductions.sum``'s two functions)."""
    dtype = _sum_dtype(x.dtype)
    part = np.sum(x, axis=axes, keepdims=True, dtype=dtype)
    return np.sum(part, axis=axes, keepdims=keepdims, dtype=dtype)


def _block_max(x: np.ndarray, *, axes: tuple, keepdims: bool) -> np.ndarray:
    """``da.max`` on one block: ``chunk_max`` then ``np.max`` over that single partial."""
    return np.max(chunk_max(x, axis=axes, keepdims=True), axis=axes, keepdims=keepdims)


def _block_getitem(x: np.ndarray, *, index: tuple) -> np.ndarray:
    return x[index]  # the picked values, as vindex copies them


def _block_index_add(src: np.ndarray, *, index: tuple, shape: tuple) -> np.ndarray:
    """Zeros with ``src`` added at ``index`` by ``np.add.at`` (``dense_kernels._add_at_block``)."""
    out = np.zeros(shape, dtype=src.dtype)
    np.add.at(out, index, src)
    return out


def _block_expand(x: np.ndarray, *, shape: tuple) -> np.ndarray:
    return np.broadcast_to(x, shape)


def _block_reshape(x: np.ndarray, *, shape: tuple) -> np.ndarray:
    return np.reshape(x, shape)


#: what each step of the composite runs on one row block under dask (its kernels' per-block calls)
BLOCK_KERNELS: dict = {
    **{(op, "dense"): fn for op, fn in elementwise_kernels(np).items()},
    (Op.SUM, "dense"): _block_sum, (Op.MAX, "dense"): _block_max, (Op.GETITEM, "dense"): _block_getitem,
    (Op.INDEX_ADD, "dense"): _block_index_add, (Op.EXPAND, "dense"): _block_expand,
    (Op.RESHAPE, "dense"): _block_reshape,
}
BLOCK_STEPS = KernelSteps(BLOCK_KERNELS, np)
#: plain numpy steps, for logits with no rows (numpy's max of an empty block is its ``(0, 1)``)
NUMPY_STEPS = KernelSteps({**BLOCK_KERNELS,
                           (Op.SUM, "dense"): lambda x, *, axes, keepdims: np.sum(x, axis=axes, keepdims=keepdims),
                           (Op.MAX, "dense"): lambda x, *, axes, keepdims: np.max(x, axis=axes, keepdims=keepdims)}, np)


# -- per-block work (runs on the workers) ----------------------------------------------------------

def _block_losses(x: np.ndarray, target: np.ndarray, keep: dict | None = None) -> np.ndarray:
    """The rows' losses ``[rows]`` of one logits block (reduction "none"; ``keep``: ``loss``'s)."""
    return np.asarray(cross_entropy.loss(x, target, "none", BLOCK_STEPS, keep))


def _block_forward(x: np.ndarray, target: np.ndarray) -> tuple:
    """The block's rows' losses with the forward's ``exp(shifted)`` and row sums, which the
    block's backward then reads instead of recomputing them."""
    keep: dict = {}
    losses = _block_losses(x, target, keep)
    return losses, keep["e"], keep["s"]


def _forward_first(forward: tuple) -> np.ndarray:
    """The first result of a per-block forward task (its losses, or a soft loss's partial sum): a
    task of its own on the block's worker, so only that travels on, not the block's exponentials."""
    return forward[0]


def _reduce_one_chunk(dtype: np.dtype, scale: float | None, *blocks: np.ndarray) -> np.ndarray:
    """``da.sum`` of the losses when they form one chunk (chunk sum, aggregate over that one
    partial), then the mean's multiply by its constant (``scale``; None for "sum")."""
    losses = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
    total = _block_sum(losses, axes=(0,), keepdims=False)
    return total if scale is None else np.multiply(total, np.asarray(scale, dtype=dtype))


def _block_grad(g: np.ndarray, x: np.ndarray, target: np.ndarray, reduction: str,
                scale: float | None, forward: tuple | None = None) -> np.ndarray:
    """The logits' gradient on one block from the loss's gradient ``g`` (``()`` for "sum" and
    "mean", the block's rows for "none").  "mean" scales ``g`` first, as the composite's mul rule
    does with the whole array's ``1/N``; then the rows are those of a "sum" over this block.  The
    exponentials are the block's :func:`_block_forward`'s where there is one (the same bits)."""
    if scale is not None:
        g = np.multiply(g, np.asarray(scale, dtype=x.dtype))  # the forward's constant
    saved = None if forward is None else forward[1:]
    return np.asarray(cross_entropy.logits_grad(g, x, target, "none" if reduction == "none" else "sum",
                                                BLOCK_STEPS, saved))


# -- graph building (on the client) ----------------------------------------------------------------

def _serves(x: Any) -> bool:
    """Whether the per-block path gives the composite's bits for these logits -- and its gradient
    the composite's chunks: the composite builds the gradient in the backend's own row blocks
    (:func:`~polygrad_dask.chunks.row_chunks`), and logits split otherwise (``from_backend`` with chunks of the
    caller's, features made before ``set_partitions`` changed) would hand later reductions over
    rows (a weight gradient ``x.T @ g``) other blocks to sum, so other bits."""
    return (isinstance(x, da.Array) and x.ndim == 2 and x.dtype in BLOCK_DTYPES and x.shape[0] > 0
            and x.shape[1] >= 1 and x.numblocks[1] == 1 and all(r > 0 for r in x.chunks[0])
            and tuple(x.chunks[0]) == row_chunks(x.shape[0]))


def _takes_upstream(g: Any, x: da.Array, reduction: str) -> bool:
    """Whether the soft op's per-block backward gives the composite's gradient for upstream ``g``:
    of the logits' dtype, and for "none" in their row blocks (the composite's elementwise steps
    split the rows as ``g`` and the logits together split them, and a later reduction over rows
    would add other blocks)."""
    return g.dtype == x.dtype and (reduction != "none" or tuple(g.chunks) == (tuple(x.chunks[0]),))


def _row_blocks(x: da.Array) -> list:
    return list(x.to_delayed(optimize_graph=False)[:, 0])


def _stacked(prefix: str, fn: Any, calls: list, chunks: tuple, dtype: Any) -> da.Array:
    """The dask array whose row block ``i`` is ``fn(*calls[i])``, run on row block ``i``'s worker,
    each task keyed as the array's own chunk (no alias tasks)."""
    name = f"{prefix}-{uuid.uuid4().hex}"
    done = _block_tasks(name, fn, calls, (0,) * (len(chunks) - 1))
    return da.Array(HighLevelGraph.from_collections(name, {}, dependencies=done), name, chunks, dtype=dtype)


def _block_tasks(name: str, fn: Any, calls: list, tail: tuple = ()) -> list:
    """Delayed ``fn(*calls[i])`` keyed ``(name, i, *tail)``, each on row block ``i``'s worker."""
    done = []
    for i, args in enumerate(calls):
        with cluster.pinned(i):
            done.append(dask.delayed(fn, pure=False)(*args, dask_key_name=(name, i) + tail))
    return done


def _target_blocks(x: da.Array, target: np.ndarray) -> list:
    bounds = np.cumsum((0,) + x.chunks[0])
    return [np.ascontiguousarray(target[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def vindex_chunks(x: da.Array) -> tuple:
    """The chunks of ``x.vindex[arange(N), target]`` (dask's ``_vindex_array``): blocks of
    ``max(row block) * C`` points, the last one holding the rest."""
    n = x.shape[0]
    per = max(x.chunks[0]) * x.shape[1]
    full, rest = divmod(n, per)
    return ((per,) * full + ((rest,) if rest else ()),)


def _dask_steps() -> KernelSteps:
    from . import dense_kernels

    return KernelSteps({(op, "dense"): fn for op, fn in dense_kernels.KERNELS.items()}, da)


def cross_entropy_kernel(x: da.Array, *, target: np.ndarray, reduction: str) -> da.Array:
    """Forward ``Op.CROSS_ENTROPY``: per-row losses one task per row block, reduced as the
    composite reduces them."""
    n = x.shape[0]
    if n == 0 and x.ndim == 2:  # the composite fails here (a vindex of nothing): numpy's empty loss
        return da.from_array(cross_entropy.loss(np.zeros(x.shape, x.dtype), target, reduction, NUMPY_STEPS))
    if not _serves(x):
        return cross_entropy.loss(x, target, reduction, _dask_steps())
    pairs = list(zip(_row_blocks(x), _target_blocks(x, target)))
    chunks = vindex_chunks(x)
    scale = cross_entropy.mean_scale(n) if reduction == "mean" else None
    if reduction != "none" and len(chunks[0]) == 1:
        return _loss_keeping_forwards("cross-entropy", _block_forward, "rows", (x.chunks[0],), _reduce_one_chunk,
                                      pairs, x.dtype, scale, _classes_key(x))
    losses = _stacked("cross-entropy-rows", _block_losses, pairs, (x.chunks[0],), x.dtype)
    losses = losses.rechunk(chunks)  # "none" hands later ops the composite's chunks
    if reduction == "none":
        return losses
    total = losses.sum(axis=(0,), keepdims=False)  # dense_kernels.reduce_sum's call
    return total if scale is None else da.multiply(total, np.asarray(scale, dtype=x.dtype))


def cross_entropy_vjp(g: da.Array, x: da.Array, *, needs: tuple, target: np.ndarray,
                      reduction: str) -> tuple:
    """Fused backward: the logits' gradient one task per row block (the composite's rule steps)."""
    if not needs[0]:
        return (None,)
    if x.shape[0] == 0:
        return (da.zeros(x.shape, dtype=x.dtype),)
    if not _serves(x) or g.dtype != x.dtype:
        return (cross_entropy.logits_grad(g, x, target, reduction, _dask_steps()),)
    if reduction == "none":
        gs = list(g.rechunk((x.chunks[0],)).to_delayed(optimize_graph=False))
    else:
        gs = [g.to_delayed(optimize_graph=False)[()]] * len(x.chunks[0])
    scale = cross_entropy.mean_scale(x.shape[0]) if reduction == "mean" else None
    blocks = list(zip(gs, _row_blocks(x), _target_blocks(x, target)))
    forwards = _forwards_of(_classes_key(x), len(blocks)) if reduction != "none" else [None] * len(blocks)
    calls = [(gb, xb, tb, reduction, scale, fw) for (gb, xb, tb), fw in zip(blocks, forwards)]
    return (_stacked("cross-entropy-grad", _block_grad, calls, x.chunks, x.dtype),)


# -- class probabilities (Op.SOFT_CROSS_ENTROPY) ------------------------------------------------------

def _one_aggregate(blocks: int) -> bool:
    """Whether ``da.sum`` over ``blocks`` chunks adds their partials in one aggregate: at most
    ``split_every`` of them (dask's config, 4 by default; its ``_tree_reduce`` reads it as this
    does); over more, dask adds them in a tree, and the losses go through dask's own sum."""
    split_every = dask.config.get("split_every", 4) or 4
    if isinstance(split_every, dict):
        split_every = split_every.get(0, 2)
    return isinstance(split_every, int) and blocks <= max(split_every, 2)


def _block_soft_losses(x: np.ndarray, probs: np.ndarray, keep: dict | None = None) -> np.ndarray:
    """The rows' losses ``[rows]`` of one block (reduction "none"; ``keep``: ``soft_loss``'s)."""
    return np.asarray(cross_entropy.soft_loss(x, probs, "none", BLOCK_STEPS, keep))


def _block_soft_forward(x: np.ndarray, probs: np.ndarray) -> tuple:
    """The block's rows' losses summed as ``da.sum``'s chunk step sums them (``[1]``), with the
    forward's ``exp(shifted)`` and row sums, which the block's backward then reads instead of
    recomputing them."""
    keep: dict = {}
    losses = _block_soft_losses(x, probs, keep)
    return np.sum(losses, axis=(0,), keepdims=True, dtype=_sum_dtype(losses.dtype)), keep["e"], keep["s"]


#: the per-block forward tasks of cross-entropies whose loss array is alive, by their inputs'
#: array names (a dask array's name is its value's: :func:`_classes_key`, :func:`_soft_key`), so
#: their backward reads the forward's exponentials instead of recomputing them (~40 ms per
#: 500k x 8 float32 block).  An entry goes with its loss array (a weak reference's callback), so it
#: keeps no graph alive that the loss does not; at most FORWARDS_KEPT are held in any case (a
#: training step makes one).
_FORWARDS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
FORWARDS_KEPT = 8


def _classes_key(x: da.Array) -> tuple:
    """The entry of an integer-target loss of logits ``x``: the kept exponentials and sums are
    ``x``'s alone (the target only picks the losses), so the logits name it."""
    return ("classes", x.name)


def _soft_key(x: da.Array, probs: da.Array) -> tuple:
    return ("probabilities", x.name, probs.name)


def _remember(key: tuple, loss: da.Array, forwards: list) -> None:
    def forget(ref: Any) -> None:
        entry = _FORWARDS.get(key)
        if entry is not None and entry[0] is ref:
            _FORWARDS.pop(key, None)

    _FORWARDS[key] = (weakref.ref(loss, forget), forwards)
    _FORWARDS.move_to_end(key)
    while len(_FORWARDS) > FORWARDS_KEPT:
        _FORWARDS.popitem(last=False)


def _forwards_of(key: tuple, blocks: int) -> list:
    """The forward tasks of the loss ``key`` names, while that loss array lives, else Nones (the
    backward then recomputes the exponentials)."""
    entry = _FORWARDS.get(key)
    if entry is None or entry[0]() is None or len(entry[1]) != blocks:
        return [None] * blocks
    return list(entry[1])


def _loss_keeping_forwards(prefix: str, forward: Any, first: str, first_chunks: tuple, total: Any, pairs: list,
                           dtype: Any, scale: float | None, key: tuple) -> da.Array:
    """The 0-d loss over row blocks: a ``forward(*pairs[i])`` task per block (its first result,
    then the exponentials and row sums its backward reads), a tiny task per block handing only the
    first result on (chunks ``first_chunks``), and ``total(dtype, scale, *firsts)`` on row block
    0's worker; the forward tasks are remembered under ``key`` while the loss array lives."""
    forwards = _block_tasks(f"{prefix}-forward-{uuid.uuid4().hex}", forward, pairs)
    firsts = _stacked(f"{prefix}-{first}", _forward_first, [(f,) for f in forwards], first_chunks, dtype)
    name = f"{prefix}-total-{uuid.uuid4().hex}"
    with cluster.pinned(0):  # keyed as the 0-d array's one chunk: no alias task
        done = dask.delayed(total, pure=False)(dtype, scale, *firsts.to_delayed(optimize_graph=False),
                                               dask_key_name=(name,))
    loss = da.Array(HighLevelGraph.from_collections(name, {}, dependencies=[done]), name, (), dtype=dtype)
    _remember(key, loss, forwards)
    return loss


def _soft_total(dtype: np.dtype, scale: float | None, *partials: np.ndarray) -> np.ndarray:
    """``da.sum``'s aggregate over the blocks' partials (one level: :func:`_one_aggregate`),
    then the mean's multiply by its constant (``scale``; None for "sum")."""
    total = np.sum(np.concatenate(partials), axis=(0,), keepdims=False, dtype=_sum_dtype(np.dtype(dtype)))
    return total if scale is None else np.multiply(total, np.asarray(scale, dtype=dtype))


def _block_soft_grad(g: np.ndarray, x: np.ndarray, probs: np.ndarray, reduction: str, scale: float | None,
                     which: int, forward: tuple | None = None) -> np.ndarray:
    """Input ``which``'s gradient (0: the logits, 1: the probabilities) on one block, as
    :func:`_block_grad` (a task per gradient: the common step needs only the logits'), from the
    block's :func:`_block_soft_forward` where there is one (its exponentials: the same bits)."""
    if scale is not None:
        g = np.multiply(g, np.asarray(scale, dtype=x.dtype))  # the forward's constant
    needs = (which == 0, which == 1)
    saved = None if forward is None else forward[1:]
    grads = cross_entropy.soft_grads(g, x, probs, "none" if reduction == "none" else "sum", needs, BLOCK_STEPS,
                                     saved)
    return np.asarray(grads[which])


def _serves_pair(x: Any, probs: Any) -> bool:
    """:func:`_serves` for the logits, and probabilities of their dtype in their very blocks (the
    composite's multiply would otherwise re-split the rows, and its sum add other blocks)."""
    return (_serves(x) and isinstance(probs, da.Array) and probs.dtype == x.dtype and probs.shape == x.shape
            and probs.chunks == x.chunks)


def soft_cross_entropy_kernel(x: da.Array, probs: da.Array, *, reduction: str) -> da.Array:
    """Forward ``Op.SOFT_CROSS_ENTROPY``: one task per row block, then one aggregate for "sum" and
    "mean" (the composite's reduction, bit for bit)."""
    n = x.shape[0]
    if n == 0 and x.ndim == 2:  # no rows: numpy's loss (0 for "sum", NaN for "mean")
        empty = np.zeros(x.shape, x.dtype)
        return da.from_array(np.asarray(cross_entropy.soft_loss(empty, empty, reduction, NUMPY_STEPS)))
    if not _serves_pair(x, probs):
        return cross_entropy.soft_loss(x, probs, reduction, _dask_steps())
    pairs = list(zip(_row_blocks(x), _row_blocks(probs)))
    scale = cross_entropy.mean_scale(n) if reduction == "mean" else None
    if reduction != "none" and _one_aggregate(len(pairs)):
        return _loss_keeping_forwards("soft-cross-entropy", _block_soft_forward, "partial", ((1,) * len(pairs),),
                                      _soft_total, pairs, x.dtype, scale, _soft_key(x, probs))
    losses = _stacked("soft-cross-entropy-rows", _block_soft_losses, pairs, (x.chunks[0],), x.dtype)
    if reduction == "none":
        return losses
    total = losses.sum(axis=(0,), keepdims=False)  # dense_kernels.reduce_sum's call
    return total if scale is None else da.multiply(total, np.asarray(scale, dtype=x.dtype))


def soft_cross_entropy_vjp(g: da.Array, x: da.Array, probs: da.Array, *, needs: tuple, reduction: str) -> tuple:
    """Fused backward: both gradients from one task per row block (the composite's rule steps)."""
    if not any(needs):
        return (None, None)
    if x.shape[0] == 0:
        zeros = da.zeros(x.shape, dtype=x.dtype)
        return (zeros if needs[0] else None, zeros if needs[1] else None)
    if not _serves_pair(x, probs) or not _takes_upstream(g, x, reduction):
        return cross_entropy.soft_grads(g, x, probs, reduction, needs, _dask_steps())
    if reduction == "none":
        gs = list(g.to_delayed(optimize_graph=False))
    else:
        gs = [g.to_delayed(optimize_graph=False)[()]] * len(x.chunks[0])
    scale = cross_entropy.mean_scale(x.shape[0]) if reduction == "mean" else None
    blocks = list(zip(gs, _row_blocks(x), _row_blocks(probs)))
    forwards = _forwards_of(_soft_key(x, probs), len(blocks)) if reduction != "none" else [None] * len(blocks)
    out = []
    for which, need in enumerate(needs):
        calls = [(gb, xb, pb, reduction, scale, which, fw) for (gb, xb, pb), fw in zip(blocks, forwards)]
        out.append(_stacked("soft-cross-entropy-grad", _block_soft_grad, calls, x.chunks, x.dtype) if need else None)
    return tuple(out)


# pg.cross_entropy asks before it uses the op (polygrad.tensor.losses): logits the per-block path
# cannot serve with the composite's bits and chunks run the composite itself, not its steps here
def _accepts(x: Any) -> bool:
    """Logits the op takes: those the per-block path serves, and no rows (numpy's loss, where
    the composite fails on dask)."""
    return isinstance(x, da.Array) and x.ndim == 2 and (x.shape[0] == 0 or _serves(x))


cross_entropy_kernel.accepts = _accepts  # type: ignore[attr-defined]


def _accepts_pair(x: Any, probs: Any) -> bool:
    """Logits and probabilities the soft op takes: those the per-block path serves, and no rows."""
    return (isinstance(x, da.Array) and isinstance(probs, da.Array) and x.ndim == 2
            and (x.shape[0] == 0 or _serves_pair(x, probs)))


soft_cross_entropy_kernel.accepts = _accepts_pair  # type: ignore[attr-defined]

__all__ = ["cross_entropy_kernel", "cross_entropy_vjp", "soft_cross_entropy_kernel", "soft_cross_entropy_vjp",
           "vindex_chunks", "BLOCK_STEPS"]
