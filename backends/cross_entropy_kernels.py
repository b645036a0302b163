"""CROSS_ENTROPY's and SOFT_CROSS_ENTROPY's forward kernels and fused backwards, built from a
backend's own forward kernels.

The composite ``pg.cross_entropy`` dispatches 12 ops forward and about as many backward, each costing
more than its kernel on a batch's ``[32, 2]`` logits.  These run the steps of
:mod:`polygrad.engine.cross_entropy` -- the composite's own sequence, which the VJP rule runs
with ``apply`` -- over the backend's kernels for max, neg, add, exp, sum, ... without dispatching
them, so the loss and its gradient are the composite's bit for bit
(``tests/unit/test_cross_entropy_op.py``, generated logits).

The kernel table is read when a kernel runs, not when it is built: a backend that replaces
kernels of the shared table after :func:`~polygrad.backends.array_kernels.make_kernels` (numpy's
pooled and threaded ones) is followed, so dispatch and these steps always call the same kernels.
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.engine import cross_entropy
from polygrad.ir.ops import Op

from .kernel_view import DispatchKernels, KernelTable


class KernelSteps:
    """:class:`polygrad.engine.cross_entropy.Steps` over raw kernels ``kernels[(op, "dense")]``."""

    def __init__(self, kernels: KernelTable, xp: Any) -> None:
        self._k = kernels
        self._xp = xp
        #: the backend whose dispatched kernels these steps call (None: a table of their own); a
        #: capture may then replay the steps as kernel calls of its own (polygrad.compile.inline_steps)
        self.follows_dispatch_of = kernels.name if isinstance(kernels, DispatchKernels) else None

    def _run(self, op: Op, *arrays: Any, **attrs: Any) -> Any:
        return self._k[(op, "dense")](*arrays, **attrs)

    def neg(self, x: Any) -> Any: return self._run(Op.NEG, x)
    def add(self, a: Any, b: Any) -> Any: return self._run(Op.ADD, a, b)
    def mul(self, a: Any, b: Any) -> Any: return self._run(Op.MUL, a, b)
    def maximum(self, a: Any, b: Any) -> Any: return self._run(Op.MAXIMUM, a, b)
    def lt(self, a: Any, b: Any) -> Any: return self._run(Op.LT, a, b)
    def where(self, c: Any, a: Any, b: Any) -> Any: return self._run(Op.WHERE, c, a, b)
    def exp(self, x: Any) -> Any: return self._run(Op.EXP, x)
    def log(self, x: Any) -> Any: return self._run(Op.LOG, x)
    def reciprocal(self, x: Any) -> Any: return self._run(Op.RECIPROCAL, x)
    def sum(self, x: Any, axes: tuple, keepdims: bool) -> Any: return self._run(Op.SUM, x, axes=axes, keepdims=keepdims)
    def max(self, x: Any, axes: tuple, keepdims: bool) -> Any: return self._run(Op.MAX, x, axes=axes, keepdims=keepdims)
    def getitem(self, x: Any, index: tuple) -> Any: return self._run(Op.GETITEM, x, index=index)
    def index_add(self, x: Any, index: tuple, shape: tuple) -> Any:
        return self._run(Op.INDEX_ADD, x, index=index, shape=shape)
    def expand(self, x: Any, shape: tuple) -> Any: return self._run(Op.EXPAND, x, shape=shape)
    def reshape(self, x: Any, shape: tuple) -> Any: return self._run(Op.RESHAPE, x, shape=shape)
    def const(self, like: Any, value: float) -> Any: return self._xp.asarray(value, dtype=like.dtype)
    def detached(self, x: Any) -> Any: return x


def cross_entropy_kernel(kernels: KernelTable, xp: Any) -> Callable:
    """The forward kernel ``(logits, *, target, reduction) -> loss`` over ``kernels``."""
    steps = KernelSteps(kernels, xp)

    def kernel(x: Any, *, target: Any, reduction: str) -> Any:
        return cross_entropy.loss(x, target, reduction, steps)

    # what it runs, for a capture that replays the steps itself (polygrad.compile.inline_steps); a
    # wrapper that copies the attribute does not name itself, and stays one call
    kernel.polygrad_steps = (kernel, steps)  # type: ignore[attr-defined]
    return kernel


def cross_entropy_vjp(kernels: KernelTable, xp: Any) -> Callable:
    """The fused backward ``(dLoss, logits, *, needs, target, reduction) -> (dLogits,)``."""
    steps = KernelSteps(kernels, xp)

    def vjp(g: Any, x: Any, *, needs: tuple, target: Any, reduction: str) -> tuple:
        return (cross_entropy.logits_grad(g, x, target, reduction, steps) if needs[0] else None,)

    vjp.polygrad_steps = (vjp, steps)  # type: ignore[attr-defined]
    return vjp


def soft_cross_entropy_kernel(kernels: KernelTable, xp: Any) -> Callable:
    """The forward kernel ``(logits, probs, *, reduction) -> loss`` over ``kernels``."""
    steps = KernelSteps(kernels, xp)

    def kernel(x: Any, probs: Any, *, reduction: str) -> Any:
        return cross_entropy.soft_loss(x, probs, reduction, steps)

    kernel.accepts = _in_one_process  # type: ignore[attr-defined]
    return kernel


def _in_one_process(x: Any, probs: Any) -> bool:
    """``pg.cross_entropy`` runs the composite, not this kernel: in one process the fused backward's
    recomputation of the forward's shift and exponentials (which the composite keeps for its
    backward) costs more than the dispatches it saves -- forward and backward of one-hot targets
    took 1.16x the composite's time at 2708 x 7, 1.59x at 20k x 8 and 1.47x at 1M x 8 (numpy).  The
    op is for a distributed backend, where each step is a task (``polygrad_dask.loss_kernels``);
    this kernel still runs where the op is applied (conformance, the bitwise tests of its steps)."""
    return False


def soft_cross_entropy_vjp(kernels: KernelTable, xp: Any) -> Callable:
    """The fused backward ``(dLoss, logits, probs, *, needs, reduction) -> (dLogits, dProbs)``."""
    steps = KernelSteps(kernels, xp)

    def vjp(g: Any, x: Any, probs: Any, *, needs: tuple, reduction: str) -> tuple:
        return cross_entropy.soft_grads(g, x, probs, reduction, needs, steps)

    return vjp
