"""A fused backward for dense MATMUL, built from a backend's own forward kernels.

The VJP rule (polygrad.engine.grad_rules._matmul_rule) computes ``dA = dY @ Bᵀ`` and
``dB = Aᵀ @ dY`` as four dispatched ops (two PERMUTEs, two MATMULs), and autodiff then sums a
broadcast operand's gradient down to its shape (``unbroadcast``, SUM ops).  Each dispatch costs
more than a small product itself (GIN's [664, 32] x [32, 32] layers: ~20 us of dispatch per matmul
backward against a few us of BLAS).  This kernel makes the *same kernel calls on the same arrays*
in the same order -- the backend's reshape, permute, matmul and sum kernels -- without
dispatching them, so its gradients are the rule's bit for bit (tests/unit/test_matmul_fused_vjp.py
checks it with generated shapes, vector operands and broadcast batches included).

Autodiff uses the rule instead when gradients must be differentiable again (``create_graph``).
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.ir.ops import Op


def dense_matmul_vjp(kernels: dict) -> Callable:
    """The fused ``(dY, A, B, needs) -> (dA, dB)`` of MATMUL over ``kernels`` (a backend's
    ``(op, layout) -> kernel`` table, read once: the kernels this backend registers)."""
    matmul = kernels[(Op.MATMUL, "dense")]
    permute = kernels[(Op.PERMUTE, "dense")]
    reshape = kernels[(Op.RESHAPE, "dense")]
    reduce_sum = kernels[(Op.SUM, "dense")]

    def reshaped(x: Any, shape: tuple) -> Any:  # the rule's _reshape: no op when the shape is already it
        return x if x.shape == shape else reshape(x, shape=shape)

    def swap_last(x: Any) -> Any:
        perm = list(range(x.ndim))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return permute(x, perm=tuple(perm))

    def unbroadcast(g: Any, shape: tuple) -> Any:  # autodiff.unbroadcast, with the SUM kernel's attrs
        if g.shape == shape:
            return g
        lead = g.ndim - len(shape)
        if lead:
            g = reduce_sum(g, axes=tuple(range(lead)), keepdims=False)
        ones = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
        if ones:
            g = reduce_sum(g, axes=ones, keepdims=True)
        return g

    def matmul_vjp(g: Any, a: Any, b: Any, *, needs: tuple) -> tuple:
        na, nb = needs
        # an operand is only read for the other's gradient (it may be a data-less stand-in otherwise)
        a2 = None if not nb else a if a.ndim > 1 else reshaped(a, (1, a.shape[0]))
        b2 = None if not na else b if b.ndim > 1 else reshaped(b, (b.shape[0], 1))
        g2 = g
        if a.ndim == 1:  # put back the row axis a vector operand lost
            g2 = reshaped(g2, g2.shape[:-1] + (1,) + g2.shape[-1:] if b.ndim > 1 else g2.shape + (1,))
        if b.ndim == 1:
            g2 = reshaped(g2, g2.shape + (1,))
        ga = gb = None
        if na:
            ga = matmul(g2, swap_last(b2))
            if a.ndim == 1:
                ga = reshaped(ga, ga.shape[:-2] + (a.shape[0],))
            ga = unbroadcast(ga, a.shape)
        if nb:
            gb = matmul(swap_last(a2), g2)
            if b.ndim == 1:
                gb = reshaped(gb, gb.shape[:-2] + (b.shape[0],))
            gb = unbroadcast(gb, b.shape)
        return ga, gb

    return matmul_vjp
