"""An optimizer's update of a large host parameter, in blocks of elements on polygrad's threads.

Adam, AdamW and SGD update each element from that element alone (``m = b1 * m + (1 - b1) * g``,
``p - lr * m / (sqrt(v) + eps)``, ...), so running the update on consecutive slices of the
flattened parameter, gradient and state gives every element the bits the whole-array update
gives it: the same result at any thread count.  numpy's ufuncs release the GIL on large arrays,
so the blocks run in parallel.  One thread updates the whole array at once, as before (blocks of
a fixed small size, to keep the temporaries in cache, measured 2x faster or 1.6x slower on one
thread depending on whether glibc's malloc had raised its trim threshold: not robust enough to
keep).  The full-size outputs come from the host array pool: last step's buffers, once nothing
holds them, instead of fresh pages every step.

An optimizer opts in with ``elementwise_update = True``; one whose rule reads the whole tensor (a
norm, as LAMB's trust ratio) must not.  Only numpy arrays go through here: a device array's
update is one kernel launch per op already.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad.runtime.pool import HOST_POOL
from polygrad.runtime.threads import even_blocks, get_num_threads, run_blocks

__all__ = ["update_in_blocks", "RuleInBlocks", "PARALLEL_MIN", "BLOCKS_PER_THREAD"]

#: parameters smaller than this are updated whole: 2**20 float32 elements take ~5-10 ms per Adam
#: step, against ~0.1 ms to hand out blocks
PARALLEL_MIN = 1 << 20
#: blocks per thread (more than one: a thread slowed by other processes leaves its blocks to others)
BLOCKS_PER_THREAD = 4

Update = Callable[[Any, Any, float, Any, dict, bool], Any]


def update_in_blocks(update: Update, x: Any, g: Any, lr: float, group: Any, state: dict, fast: bool) -> Any:
    """``update(x, g, lr, group, state, fast)`` -- the new value of ``x``, with ``state`` updated --
    computed block by block when ``x`` and ``g`` are numpy arrays of at least ``PARALLEL_MIN``
    elements.  Each block updates a copy of ``state`` whose parameter-shaped arrays are the
    block's slices; the first block runs alone and tells which results are per-element arrays
    (written into full-size outputs by every block) and which are numbers (a step count, the
    same in every block, kept from the first)."""
    if not (fast and type(x) is np.ndarray and type(g) is np.ndarray and x.size >= PARALLEL_MIN
            and g.shape == x.shape):
        return update(x, g, lr, group, state, fast)
    shape, size = x.shape, x.size
    xs, gs = x.reshape(-1), g.reshape(-1)
    sliced = {k: v.reshape(-1) for k, v in state.items() if type(v) is np.ndarray and v.shape == shape}

    def run(lo: int, hi: int) -> tuple[Any, dict]:
        sub = {k: (sliced[k][lo:hi] if k in sliced else v) for k, v in state.items()}
        return update(xs[lo:hi], gs[lo:hi], lr, group, sub, fast), sub

    threads = get_num_threads()
    if threads == 1:
        return update(x, g, lr, group, state, fast)
    bounds = even_blocks(size, threads * BLOCKS_PER_THREAD)
    first, sub = run(*bounds[0])
    width = bounds[0][1]
    # full-size outputs from the host pool: last step's buffers, once nothing holds them
    new = HOST_POOL.empty((size,), first.dtype)
    new[:width] = first
    arrays = {k: HOST_POOL.empty((size,), v.dtype) for k, v in sub.items()
              if type(v) is np.ndarray and v.shape == (width,)}
    for k, out in arrays.items():
        out[:width] = sub[k]
    numbers = {k: v for k, v in sub.items() if k not in arrays}

    def block(lo: int, hi: int) -> None:
        value, part = run(lo, hi)
        new[lo:hi] = value
        for k, out in arrays.items():
            out[lo:hi] = part[k]

    run_blocks(block, bounds[1:], threads)
    state.update(numbers)
    state.update({k: out.reshape(shape) for k, out in arrays.items()})
    return new.reshape(shape)


class RuleInBlocks:
    """A :class:`~polygrad.optim.optimizer.Rule`'s function ``fn(x, g, *state arrays, *numbers)``
    run as :func:`update_in_blocks` runs it: on the blocks of a numpy ``x`` of at least
    ``PARALLEL_MIN`` elements (the blocks the thread count gives when it is called), the state
    arrays of ``x``'s shape sliced alike.  A ``pg.compile`` capture records a large parameter's
    update as a call of this, so a replay computes each block as eager does: numpy's ``+`` and
    ``*`` of two NaNs keep one operand's NaN or the other's depending on whether the element is in
    the vector body or the scalar tail of the array they run on, and a block's tail is not the
    whole array's.  Equal for equal functions (two captures of one step compare equal)."""

    def __init__(self, fn: Callable[..., tuple]):
        self.fn = fn
        self.__name__ = f"in_blocks_{getattr(fn, '__name__', 'rule')}"  # what a program listing names it
        self.__qualname__ = f"in_blocks_{getattr(fn, '__qualname__', 'rule')}"

    def __eq__(self, other: object) -> bool:
        return type(other) is RuleInBlocks and self.fn == other.fn

    def __hash__(self) -> int:
        return hash(self.fn)

    def __repr__(self) -> str:
        return f"RuleInBlocks({self.fn!r})"

    def __call__(self, x: Any, g: Any, *rest: Any, **attrs: Any) -> tuple:
        threads = get_num_threads()
        if (threads == 1 or type(x) is not np.ndarray or type(g) is not np.ndarray or x.size < PARALLEL_MIN
                or g.shape != x.shape):
            return self.fn(x, g, *rest, **attrs)
        shape, size = x.shape, x.size
        args = [a.reshape(-1) if type(a) is np.ndarray and a.shape == shape else a for a in (x, g, *rest)]
        whole = [type(a) is np.ndarray and a.shape == (size,) for a in args]

        def run(lo: int, hi: int) -> tuple:
            return self.fn(*[a[lo:hi] if w else a for a, w in zip(args, whole)], **attrs)

        bounds = even_blocks(size, threads * BLOCKS_PER_THREAD)
        first = run(*bounds[0])
        width = bounds[0][1]
        if any(type(a) is not np.ndarray or a.shape != (width,) for a in first):
            return self.fn(x, g, *rest, **attrs)  # not one result per element: the whole array at once
        outs = [HOST_POOL.empty((size,), a.dtype) for a in first]
        for out, a in zip(outs, first):
            out[:width] = a

        def block(lo: int, hi: int) -> None:
            for out, a in zip(outs, run(lo, hi)):
                out[lo:hi] = a

        run_blocks(block, bounds[1:], threads)
        return tuple(out.reshape(shape) for out in outs)
