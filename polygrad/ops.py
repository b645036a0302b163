"""The primitive ops: a small closed set.  Everything else (sub, div, sigmoid, softmax, losses,
sparse row scaling, ...) is a composite of these, so it gets its gradient for free.

Each primitive has exactly three definitions elsewhere, keyed by this enum:
``inference.py`` (shape/dtype inference + validation), ``grad_rules.py`` (its VJP, written in
polygrad ops) and ``reference.py`` (its scalar reference over :class:`polygrad.Value`).
"""
from __future__ import annotations

from enum import Enum


class Op(str, Enum):
    # unary elementwise
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    RELU = "relu"
    TANH = "tanh"
    RECIPROCAL = "reciprocal"
    CAST = "cast"
    # binary elementwise (numpy broadcasting)
    ADD = "add"
    MUL = "mul"
    POW = "pow"
    MAXIMUM = "maximum"
    # comparisons (no gradient)
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"
    # ternary
    WHERE = "where"
    # reductions
    SUM = "sum"
    MAX = "max"
    # movement
    RESHAPE = "reshape"
    PERMUTE = "permute"
    EXPAND = "expand"
    GETITEM = "getitem"
    INDEX_ADD = "index_add"
    CONCAT = "concat"
    # linear algebra
    MATMUL = "matmul"
    # sparse (pattern in attrs, values as a dense 1-D operand)
    SPMM = "spmm"
    SDDMM = "sddmm"
    SEGMENT_SUM = "segment_sum"
    SEGMENT_MAX = "segment_max"

    def __str__(self) -> str:  # so messages read "op 'matmul'", not "Op.MATMUL"
        return self.value


UNARY = frozenset({Op.NEG, Op.EXP, Op.LOG, Op.RELU, Op.TANH, Op.RECIPROCAL, Op.CAST})
FLOAT_UNARY = frozenset({Op.EXP, Op.LOG, Op.TANH, Op.RECIPROCAL})
BINARY = frozenset({Op.ADD, Op.MUL, Op.POW, Op.MAXIMUM})
COMPARE = frozenset({Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE})
ELEMENTWISE = UNARY | BINARY | COMPARE | {Op.WHERE}
REDUCE = frozenset({Op.SUM, Op.MAX})
MOVEMENT = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.GETITEM, Op.INDEX_ADD, Op.CONCAT})
SPARSE = frozenset({Op.SPMM, Op.SDDMM, Op.SEGMENT_SUM, Op.SEGMENT_MAX})
# Ops whose output carries no gradient, whatever their inputs.
NON_DIFFERENTIABLE = COMPARE | {Op.SEGMENT_MAX}


def kernel_key(op: Op, layout: str) -> tuple[Op, str]:
    """The kernel-table key of ``op`` on ``layout``: "csr" and "coo" label one canonical storage,
    so a sparse kernel is keyed once, under "csr", and both labels find it."""
    return (op, "csr") if layout == "coo" else (op, layout)


def list_ops() -> list[str]:
    """Names of every primitive op, as kernels, fault injection and the conformance kit key them."""
    return [op.value for op in Op]
