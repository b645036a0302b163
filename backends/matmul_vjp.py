"""A fused backward for dense MATMUL, built from a backend's own forward kernels.

The VJP rule (polygrad.engine.grad_rules._matmul_rule) computes ``dA = dY @ Bᵀ`` and
``dB = Aᵀ @ dY`` as four dispatched ops (two PERMUTEs, two MATMULs), and autodiff then sums a
broadcast operand's gradient down to its shape (``unbroadcast``, SUM ops).  Each dispatch costs
more than a small product itself (GIN's [664, 32] x [32, 32] layers: ~20 us of dispatch per matmul
backward against a few us of BLAS).  This kernel makes the *same kernel calls on the same arrays*
-- the rule's own ``matmul_grads`` run over the backend's reshape, permute and matmul kernels,
then the sum kernel for a broadcast operand -- without dispatching them, so its gradients are the
rule's bit for bit (tests/unit/test_matmul_fused_vjp.py checks it with generated shapes, vector
operands and broadcast batches included).

Autodiff uses the rule instead when gradients must be differentiable again (``create_graph``).
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.engine.autodiff import unbroadcast
from polygrad.engine.grad_rules import matmul_grads
from polygrad.ir.ops import Op

from .kernel_view import KernelTable


def dense_matmul_vjp(kernels: KernelTable) -> Callable:
    """The fused ``(dY, A, B, needs) -> (dA, dB)`` of MATMUL over ``kernels`` (a backend's
    ``(op, layout) -> kernel`` table, or a :class:`~polygrad.backends.kernel_view.DispatchKernels`
    view of it; read when the kernel runs)."""

    def matmul_vjp(g: Any, a: Any, b: Any, *, needs: tuple) -> tuple:
        # looked up per call: ``kernels`` may be a view of what dispatch runs now (backends/kernel_view.py)
        reshape, permute = kernels[(Op.RESHAPE, "dense")], kernels[(Op.PERMUTE, "dense")]
        reduce_sum = kernels[(Op.SUM, "dense")]
        ga, gb = matmul_grads(g, a, b, needs, lambda x, shape: reshape(x, shape=shape), kernels[(Op.MATMUL, "dense")],
                              lambda x, perm: permute(x, perm=perm))
        return (None if ga is None else unbroadcast(ga, a.shape, reduce_sum),
                None if gb is None else unbroadcast(gb, b.shape, reduce_sum))

    return matmul_vjp
