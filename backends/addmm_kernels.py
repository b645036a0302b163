"""ADDMM's forward kernel and fused backward, built from a backend's own kernels.

``nn.Linear`` computes ``x @ W + b``: a MATMUL and a broadcast ADD, whose backward is the add's
rule, one unbroadcast SUM for ``b`` and the matmul's backward -- three dispatches forward and
backward where one will do on GIN's small batches.  ADDMM (PyTorch's ``torch.addmm(b, x, W)``)
runs the same kernels on the same arrays: forward ``add(matmul(x, W), b)``; backward ``b``'s
gradient through :func:`polygrad.engine.autodiff.unbroadcast` over the SUM kernel and the
matmul's through :func:`~polygrad.backends.matmul_vjp.dense_matmul_vjp` (the rule's own
``matmul_grads``).  So the bits are the composite's (``tests/unit/test_addmm_op.py``).

The kernel table is read when a kernel runs: a backend's later overrides are followed.
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.engine.autodiff import unbroadcast
from polygrad.ir.ops import Op


from .kernel_view import KernelTable
from .matmul_vjp import dense_matmul_vjp


def addmm_kernel(kernels: KernelTable) -> Callable:
    """The forward kernel ``(input, mat1, mat2) -> mat1 @ mat2 + input`` over ``kernels``."""

    def addmm(bias: Any, a: Any, b: Any) -> Any:
        return kernels[(Op.ADD, "dense")](kernels[(Op.MATMUL, "dense")](a, b), bias)

    return addmm


def addmm_vjp(kernels: KernelTable) -> Callable:
    """The fused backward ``(dY, input, mat1, mat2, needs) -> (dInput, dMat1, dMat2)`` over
    ``kernels`` (read when it runs)."""
    matmul_vjp = dense_matmul_vjp(kernels)

    def vjp(g: Any, bias: Any, a: Any, b: Any, *, needs: tuple) -> tuple:
        ga, gb = matmul_vjp(g, a, b, needs=needs[1:])
        return (unbroadcast(g, bias.shape, kernels[(Op.SUM, "dense")]) if needs[0] else None, ga, gb)

    return vjp
