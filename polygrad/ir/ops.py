"""The primitive ops: a small closed set.  Everything else (sub, div, sigmoid, softmax, losses,
sparse row scaling, ...) is a composite of these, so it gets its gradient for free.

Each primitive is declared here once, with its groups; the engine defines its VJP once
(``engine/grad_rules.py``), its scalar meaning once (a ``Value`` method, which ``engine/reference.py``
uses by name), and its shape rule derives from its group (``engine/inference.py``).  The README's
"Adding a primitive op" lists every place; ``tests/unit/test_architecture.py`` names any one missed.
"""
from __future__ import annotations

from enum import Enum


class Op(str, Enum):
    """A primitive op: its name, and the groups it belongs to (declared with it, once).

    Groups: "unary", "float_unary" (a unary op defined on floats only), "binary", "compare",
    "ternary", "reduce", "movement", "sparse" (pattern in attrs, values a dense 1-D operand),
    "no_grad" (the output carries no gradient, whatever the inputs), "fused" (one op for a
    composite of others, run as one for speed: a backend may leave its kernel out, and the
    front end then runs the composite, whose bits the op's kernels must give).
    """

    _value_: str
    groups: frozenset[str]

    def __new__(cls, name: str, *groups: str) -> "Op":
        op = str.__new__(cls, name)
        op._value_ = name
        op.groups = frozenset(groups)
        return op

    NEG = "neg", "unary"
    EXP = "exp", "unary", "float_unary"
    EXPM1 = "expm1", "unary", "float_unary"  # exp(x) - 1 without its cancellation near 0 (elu)
    LOG = "log", "unary", "float_unary"
    RELU = "relu", "unary"
    TANH = "tanh", "unary", "float_unary"
    RECIPROCAL = "reciprocal", "unary", "float_unary"
    CAST = "cast", "unary"
    # elementwise, numpy broadcasting
    ADD = "add", "binary"
    MUL = "mul", "binary"
    POW = "pow", "binary"
    MAXIMUM = "maximum", "binary"
    LT = "lt", "compare", "no_grad"
    LE = "le", "compare", "no_grad"
    GT = "gt", "compare", "no_grad"
    GE = "ge", "compare", "no_grad"
    EQ = "eq", "compare", "no_grad"
    NE = "ne", "compare", "no_grad"
    WHERE = "where", "ternary"
    SUM = "sum", "reduce"
    MAX = "max", "reduce"
    RESHAPE = "reshape", "movement"
    PERMUTE = "permute", "movement"
    EXPAND = "expand", "movement"
    GETITEM = "getitem", "movement"
    INDEX_ADD = "index_add", "movement"
    CONCAT = "concat", "movement"
    MATMUL = "matmul"  # linear algebra
    ADDMM = "addmm", "fused"  # input + mat1 @ mat2 (nn.Linear's x @ W + b)
    ADDCMUL = "addcmul", "fused"  # input + tensor1 * tensor2 (GINConv's out + x * (1 + eps))
    CROSS_ENTROPY = "cross_entropy", "fused"  # pg.cross_entropy at integer classes (attrs: target, reduction)
    SOFT_CROSS_ENTROPY = "soft_cross_entropy", "fused"  # pg.cross_entropy at class probabilities (attrs: reduction)
    SPMM = "spmm", "sparse"
    SDDMM = "sddmm", "sparse"
    SEGMENT_SUM = "segment_sum", "sparse"
    SEGMENT_MAX = "segment_max", "sparse", "no_grad"

    def __str__(self) -> str:  # so messages read "op 'matmul'", not "Op.MATMUL"
        return self.value


def _group(name: str) -> frozenset[Op]:
    return frozenset(op for op in Op if name in op.groups)


UNARY = _group("unary")
FLOAT_UNARY = _group("float_unary")
BINARY = _group("binary")
COMPARE = _group("compare")
ELEMENTWISE = UNARY | BINARY | COMPARE | _group("ternary")
REDUCE = _group("reduce")
MOVEMENT = _group("movement")
SPARSE = _group("sparse")
# Ops whose output carries no gradient, whatever their inputs.
NON_DIFFERENTIABLE = _group("no_grad")
# Ops a backend may leave out (polygrad then runs the composite each one fuses).
FUSED = _group("fused")
_GROUPS = {"unary", "float_unary", "binary", "compare", "ternary", "reduce", "movement", "sparse", "no_grad",
           "fused"}
assert all(op.groups <= _GROUPS for op in Op), "an Op names a group that does not exist"


# The array-namespace function (numpy, cupy, dask.array, jax.numpy, the array API standard) that
# computes an elementwise primitive, where its name is not the op's own (the first a namespace has
# wins).  polygrad.runtime.backend.elementwise_kernels(xp) builds the table every backend starts
# from, so a new elementwise op named like its array function needs no kernel anywhere.
_ARRAY_FUNCTION_NAMES: dict[Op, tuple[str, ...]] = {
    Op.NEG: ("negative",), Op.MUL: ("multiply",), Op.POW: ("power", "pow"), Op.LT: ("less",),
    Op.LE: ("less_equal",), Op.GT: ("greater",), Op.GE: ("greater_equal",), Op.EQ: ("equal",),
    Op.NE: ("not_equal",),
}


def array_function_names(op: Op) -> tuple[str, ...]:
    """The names an array namespace may give the function that computes ``op`` (its own name, or
    numpy's spelling of it: ``neg`` is ``negative``)."""
    return _ARRAY_FUNCTION_NAMES.get(op, (op.value,))


def kernel_key(op: Op, layout: str) -> tuple[Op, str]:
    """The kernel-table key of ``op`` on ``layout``: "csr" and "coo" label one canonical storage,
    so a sparse kernel is keyed once, under "csr", and both labels find it."""
    return (op, "csr") if layout == "coo" else (op, layout)


def list_ops() -> list[str]:
    """Names of every primitive op, as kernels, fault injection and the conformance kit key them."""
    return [op.value for op in Op]
