"""ADDCMUL's forward kernel and fused backward, built from a backend's own kernels.

``GINConv`` computes ``out + x * (1 + eps)``: a MUL and an ADD forward; backward the add's rule,
the mul's two products and the unbroadcast SUMs of ``eps``'s gradient -- six dispatches where one
fused backward will do.  ADDCMUL (PyTorch's ``torch.addcmul(input, tensor1, tensor2)``, with the
product of the output's shape) runs the same kernels on the same arrays: forward
``add(input, mul(tensor1, tensor2))``; backward ``input``'s gradient and the products ``g * t2``,
``g * t1``, each summed to its operand's shape by :func:`polygrad.engine.autodiff.unbroadcast`
over the SUM kernel.  So the bits are the composite's (``tests/unit/test_addcmul_op.py``).
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.engine.autodiff import unbroadcast
from polygrad.ir.ops import Op

from .kernel_view import KernelTable


def addcmul_kernel(kernels: KernelTable) -> Callable:
    """The forward kernel ``(input, tensor1, tensor2) -> input + tensor1 * tensor2`` over ``kernels``."""

    def addcmul(c: Any, a: Any, b: Any) -> Any:
        return kernels[(Op.ADD, "dense")](c, kernels[(Op.MUL, "dense")](a, b))

    return addcmul


def addcmul_vjp(kernels: KernelTable) -> Callable:
    """The fused backward ``(dY, input, tensor1, tensor2, needs) -> (dInput, dTensor1, dTensor2)``."""

    def vjp(g: Any, c: Any, a: Any, b: Any, *, needs: tuple) -> tuple:
        mul, reduce_sum = kernels[(Op.MUL, "dense")], kernels[(Op.SUM, "dense")]
        nc, na, nb = needs
        return (unbroadcast(g, c.shape, reduce_sum) if nc else None,
                unbroadcast(mul(g, b), a.shape, reduce_sum) if na else None,
                unbroadcast(mul(g, a), b.shape, reduce_sum) if nb else None)

    return vjp
