"""THE gradient table: one vector-Jacobian product per primitive, written in polygrad ops.

Because each rule is made of differentiable polygrad ops, gradients of gradients work
(``create_graph=True``), and a backend only has to supply forward kernels.  A rule returns one
gradient per input (None where the input needs none), at the *output's broadcast shape* for
elementwise ops: autodiff's ``unbroadcast`` reduces it to the input's shape.

Subgradient conventions (fixed here, and mirrored by the scalar reference):
  * relu'(0) = 0 (as micrograd and PyTorch); relu' at NaN is 1 (PyTorch);
  * maximum(a, b) on a tie, and max over an axis with several maximal elements, split the
    gradient evenly among the tied elements (as torch.maximum and torch.amax); a NaN operand of
    maximum passes the whole gradient to both, a NaN max goes to the NaN elements (PyTorch);
  * pow: d(a ** b)/da = 0 where b == 0, d(a ** b)/db = 0 where a == 0 and b >= 0 (PyTorch);
  * clip/clamp passes the whole gradient at its bounds (tensor.clip is written with where).
The edge points are checked against PyTorch's values by ``polygrad.testing.edges`` (the
conformance kit's edge-point set).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import cross_entropy, graph
from .dispatch import apply
from ..ir.errors import GraphError
from ..ir.ops import Op

if TYPE_CHECKING:
    from ..tensor import Tensor

Rule = Callable[..., tuple]


def _const(like, value: float) -> "Tensor":
    """A 0-d constant of ``like``'s dtype on its backend (it broadcasts)."""
    return like._from_host(np.asarray(value, like.dtype))


def _mul(a, b):
    return apply(Op.MUL, (a, b))


def _add(a, b):
    return apply(Op.ADD, (a, b))


def _neg(x):
    return apply(Op.NEG, (x,))


def _one_minus(x):
    return _add(_const(x, 1), _neg(x))


def _reshape(x, shape: tuple):
    return x if x.shape == shape else apply(Op.RESHAPE, (x,), {"shape": shape})


def _cast(x, dtype):
    return x if x.dtype == dtype else apply(Op.CAST, (x,), {"dtype": dtype})


def _take(x, index: tuple):
    """``x[index]`` for an index already in getitem's normalised form (a tuple)."""
    return apply(Op.GETITEM, (x,), {"index": index})


def _needs(node) -> tuple[bool, ...]:
    return tuple(t.requires_grad for t in node.inputs)


# Rules are written with apply on primitives only, never the user-facing Tensor API: this layer
# sits below tensor.py, and it skips the wrappers' argument checks, sparse routing and layout
# policy (a gradient's layout is the forward's business, not something to re-decide every pass).

def _mm(a, b):
    return apply(Op.MATMUL, (a, b))


def reads(inputs: str | tuple[bool, ...] = "all", output: bool = False) -> Callable[[Rule], Rule]:
    """Declare, beside a rule, which data it reads: ``inputs`` is "all", "none" (shapes, dtypes
    and attrs only), "cross" (each of two operands only for the other's gradient) or one flag per
    input; ``output`` whether it reads the op's result.  The graph keeps the inputs (and outputs)
    no rule reads as data-less stand-ins (graph.saved_inputs), which is what keeps a training
    step's memory near the size of what backward really needs."""
    def mark(rule: Rule) -> Rule:
        rule.reads_inputs = inputs  # type: ignore[attr-defined]
        rule.reads_output = output  # type: ignore[attr-defined]
        return rule
    return mark


@reads(inputs="none")
def _neg_rule(node, out, g):
    return (_neg(g),)


@reads(inputs="none", output=True)
def _exp_rule(node, out, g):
    return (_mul(g, out),)


def _expm1_rule(node, out, g):
    # exp(x) itself rather than PyTorch's ``out + 1``: exact where ``out + 1`` rounds, and elu's
    # gradient keeps the bits it had as ``exp(x) - 1``
    return (_mul(g, apply(Op.EXP, (node.inputs[0],))),)


def _log_rule(node, out, g):
    return (_mul(g, apply(Op.RECIPROCAL, (node.inputs[0],))),)


@reads(inputs="none", output=True)
def _relu_rule(node, out, g):
    # 0 where x <= 0 (relu'(0) = 0), g elsewhere -- NaN included, as PyTorch's threshold_backward.
    # Read from the output (out <= 0 exactly where x <= 0; NaN stays NaN): the output is kept by
    # whatever consumes it anyway, so the input need not be (graph.saved_inputs)
    return (apply(Op.WHERE, (apply(Op.LE, (out, _const(out, 0))), _const(g, 0), g)),)


@reads(inputs="none", output=True)
def _tanh_rule(node, out, g):
    return (_mul(g, _one_minus(_mul(out, out))),)


@reads(inputs="none", output=True)
def _reciprocal_rule(node, out, g):
    return (_mul(_mul(_neg(g), out), out),)


@reads(inputs="none")
def _cast_rule(node, out, g):
    x = node.inputs[0]
    return (_cast(g, x.dtype) if x.dtype.kind == "f" else None,)


@reads(inputs="none")
def _add_rule(node, out, g):
    return (g, g)


@reads(inputs="cross")
def _mul_rule(node, out, g):
    a, b = node.inputs
    if a is b:  # x * x: one gradient, no accumulation of two halves
        return (_mul(_mul(g, a), _const(g, 2)), None)
    na, nb = _needs(node)
    return (_mul(g, b) if na else None, _mul(g, a) if nb else None)


@reads(output=True)
def _pow_rule(node, out, g):
    # PyTorch's edge conventions: d/da is 0 where b == 0 (x ** 0 is the constant 1, even at
    # a == 0 where b * a ** (b - 1) would be 0 * inf); d/db is 0 where a == 0 and b >= 0 (the
    # limit of a ** b * log(a)), -inf/inf where a == 0 and b < 0, NaN where a < 0.
    a, b = node.inputs
    na, nb = _needs(node)
    zero = _const(g, 0)
    da = db = None
    if na:
        full = _mul(_mul(g, b), apply(Op.POW, (a, _add(b, _neg(_const(b, 1))))))
        da = apply(Op.WHERE, (apply(Op.EQ, (b, _const(b, 0))), zero, full))
    if nb:
        full = _mul(_mul(g, out), apply(Op.LOG, (a,)))
        b_nonneg = apply(Op.WHERE, (apply(Op.GE, (b, _const(b, 0))), zero, full))
        db = apply(Op.WHERE, (apply(Op.EQ, (a, _const(a, 0))), b_nonneg, full))
    return (da, db)


def _maximum_rule(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    # 1 to the winner, 0.5 to each on a tie, and (PyTorch's rule) 1 to both where a NaN is involved
    tie = _mul(_cast(apply(Op.EQ, (a, b)), g.dtype), _const(g, 0.5))
    ga = _mul(g, _one_minus(_add(_cast(apply(Op.LT, (a, b)), g.dtype), tie))) if na else None
    gb = _mul(g, _one_minus(_add(_cast(apply(Op.GT, (a, b)), g.dtype), tie))) if nb else None
    return (ga, gb)


@reads(inputs=(True, False, False))
def _where_rule(node, out, g):
    cond = node.inputs[0]
    _, na, nb = _needs(node)
    zero = _const(g, 0)
    return (None, apply(Op.WHERE, (cond, g, zero)) if na else None,
            apply(Op.WHERE, (cond, zero, g)) if nb else None)


def _keepdims(g, node):
    """g reshaped so the reduced axes are kept as size 1 (ready to broadcast against the input)."""
    if node.attrs["keepdims"]:
        return g
    x = node.inputs[0]
    return _reshape(g, tuple(1 if i in node.attrs["axes"] else n for i, n in enumerate(x.shape)))


@reads(inputs="none")
def _sum_rule(node, out, g):
    shape = node.inputs[0].shape
    axes = node.attrs["axes"]
    if not node.attrs["keepdims"] and axes != tuple(range(len(axes))):
        g = _keepdims(g, node)  # reduced axes not leading: put them back as size 1 first
    return (g if g.shape == shape else apply(Op.EXPAND, (g,), {"shape": shape}),)


@reads(output=True)
def _max_rule(node, out, g):
    x = node.inputs[0]
    o = _keepdims(out, node)
    # the maximal elements; where the max is NaN, the NaN elements (torch's evenly_distribute)
    is_nan_x = _cast(apply(Op.NE, (x, x)), g.dtype)
    is_nan_o = _cast(apply(Op.NE, (o, o)), g.dtype)
    mask = _add(_cast(apply(Op.EQ, (x, o)), g.dtype), _mul(is_nan_x, is_nan_o))
    count = apply(Op.SUM, (mask,), {"axes": node.attrs["axes"], "keepdims": True})
    return (_mul(_mul(_keepdims(g, node), mask), apply(Op.RECIPROCAL, (count,))),)


@reads(inputs="none")
def _reshape_rule(node, out, g):
    return (_reshape(g, node.inputs[0].shape),)


@reads(inputs="none")
def _permute_rule(node, out, g):
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (apply(Op.PERMUTE, (g,), {"perm": tuple(inverse)}),)


@reads(inputs="none")
def _expand_rule(node, out, g):
    return (g,)  # autodiff's unbroadcast sums the expanded axes


@reads(inputs="none")
def _getitem_rule(node, out, g):
    x = node.inputs[0]  # the index was normalised against x.shape when the forward was recorded
    return (apply(Op.INDEX_ADD, (g,), {"index": node.attrs["index"], "shape": x.shape}),)


@reads(inputs="none")
def _index_add_rule(node, out, g):
    return (_take(g, node.attrs["index"]),)


@reads(inputs="none")
def _concat_rule(node, out, g):
    axis = node.attrs["axis"]
    grads, start = [], 0
    for t in node.inputs:
        stop = start + t.shape[axis]
        grads.append(_take(g, (slice(None),) * axis + (slice(start, stop),)) if t.requires_grad else None)
        start = stop
    return tuple(grads)


def matmul_grads(g: Any, a: Any, b: Any, needs: tuple, reshape: Callable, mm: Callable,
                 permute: Callable) -> tuple:
    """``(dA, dB)`` of ``A @ B`` from ``dY``, before a broadcast operand is summed back to its shape:
    ``dA = dY @ Bᵀ``, ``dB = Aᵀ @ dY``, with vector operands given their lost axis and back.

    Written once over three primitives -- ``reshape(x, shape)``, ``mm(x, y)``, ``permute(x, perm)``
    -- so the rule (polygrad ops) and a backend's fused backward (its raw kernels, e.g.
    ``backends/matmul_vjp.py``) make the same calls on the same arrays, and agree bit for bit."""
    if a.ndim == 2 and b.ndim == 2:  # the common case: the calls _matmul_grads_any makes for it
        na, nb = needs
        perm = (1, 0)
        return (mm(g, permute(b, perm)) if na else None), (mm(permute(a, perm), g) if nb else None)
    return _matmul_grads_any(g, a, b, needs, reshape, mm, permute)


def _matmul_grads_any(g: Any, a: Any, b: Any, needs: tuple, reshape: Callable, mm: Callable,
                      permute: Callable) -> tuple:
    """:func:`matmul_grads` for operands of any rank (vectors, batches)."""
    na, nb = needs

    def reshaped(x: Any, shape: tuple) -> Any:
        return x if x.shape == shape else reshape(x, shape)

    def swap_last(x: Any) -> Any:
        perm = list(range(x.ndim))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return permute(x, tuple(perm))

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
        ga = mm(g2, swap_last(b2))
        if a.ndim == 1:
            ga = reshaped(ga, ga.shape[:-2] + (a.shape[0],))
    if nb:
        gb = mm(swap_last(a2), g2)
        if b.ndim == 1:
            gb = reshaped(gb, gb.shape[:-2] + (b.shape[0],))
    return ga, gb


def _permute_op(x, perm: tuple):
    return apply(Op.PERMUTE, (x,), {"perm": perm})


@reads(inputs="cross")
def _matmul_rule(node, out, g):
    a, b = node.inputs
    return matmul_grads(g, a, b, _needs(node), _reshape, _mm, _permute_op)


@reads(inputs=(False, True, True))
def _addmm_rule(node, out, g):
    # input + mat1 @ mat2: the add's rule (g to both; autodiff sums the input's broadcast axes),
    # then the product's
    _, a, b = node.inputs
    needs = _needs(node)
    return (g if needs[0] else None, *matmul_grads(g, a, b, needs[1:], _reshape, _mm, _permute_op))


@reads(inputs=(False, True, True))
def _addcmul_rule(node, out, g):
    # input + a * b (the product has the output's shape): the add's rule, then the product's
    _, a, b = node.inputs
    nc, na, nb = _needs(node)
    return (g if nc else None, _mul(g, b) if na else None, _mul(g, a) if nb else None)


def _spmm_op(values, x, pattern):
    return apply(Op.SPMM, (values, x), {"pattern": pattern}, pattern.layout)


def _sddmm_op(p, q, pattern):
    return apply(Op.SDDMM, (p, q), {"pattern": pattern}, pattern.layout)


@reads(inputs="cross")
def _spmm_rule(node, out, g):
    values, x = node.inputs
    nv, nx = _needs(node)
    pattern = node.attrs["pattern"]
    dvalues = dx = None
    if nv:  # dA only at A's nonzeros: an SDDMM, never an n x m matrix
        if x.ndim == 1:
            dvalues = _sddmm_op(_reshape(g, (g.shape[0], 1)), _reshape(x, (x.shape[0], 1)), pattern)
        else:
            dvalues = _sddmm_op(g, x, pattern)
    if nx:  # dX = A^T dY through the cached transpose
        t_pattern, perm = pattern.transpose()
        dx = _spmm_op(_take(values, (perm,)), g, t_pattern)
    return (dvalues, dx)


@reads(inputs="cross")
def _sddmm_rule(node, out, g):
    p, q = node.inputs
    npp, nq = _needs(node)
    pattern = node.attrs["pattern"]
    dp = _spmm_op(g, q, pattern) if npp else None
    dq = None
    if nq:
        t_pattern, perm = pattern.transpose()
        dq = _spmm_op(_take(g, (perm,)), p, t_pattern)
    return (dp, dq)


@reads(inputs="none")
def _segment_sum_rule(node, out, g):
    return (_take(g, (node.attrs["pattern"].rows,)),)


class _ApplySteps:
    """The steps of :mod:`cross_entropy` as dispatched primitives (gradients of gradients work)."""

    neg = staticmethod(_neg)
    add = staticmethod(_add)
    mul = staticmethod(_mul)
    const = staticmethod(_const)

    @staticmethod
    def maximum(a, b): return apply(Op.MAXIMUM, (a, b))
    @staticmethod
    def lt(a, b): return apply(Op.LT, (a, b))
    @staticmethod
    def where(c, a, b): return apply(Op.WHERE, (c, a, b))
    @staticmethod
    def exp(x): return apply(Op.EXP, (x,))
    @staticmethod
    def log(x): return apply(Op.LOG, (x,))
    @staticmethod
    def reciprocal(x): return apply(Op.RECIPROCAL, (x,))
    @staticmethod
    def sum(x, axes, keepdims): return apply(Op.SUM, (x,), {"axes": axes, "keepdims": keepdims})
    @staticmethod
    def max(x, axes, keepdims): return apply(Op.MAX, (x,), {"axes": axes, "keepdims": keepdims})
    @staticmethod
    def getitem(x, index): return _take(x, index)
    @staticmethod
    def index_add(x, index, shape): return apply(Op.INDEX_ADD, (x,), {"index": index, "shape": shape})
    @staticmethod
    def expand(x, shape): return apply(Op.EXPAND, (x,), {"shape": shape})
    @staticmethod
    def reshape(x, shape): return _reshape(x, shape)
    @staticmethod
    def detached(x): return x._new(x._data, x._be, x.shape, x.dtype)


APPLY_STEPS = _ApplySteps()


@reads(inputs=(True,))
def _cross_entropy_rule(node, out, g):
    return (cross_entropy.logits_grad(g, node.inputs[0], node.attrs["target"], node.attrs["reduction"],
                                   APPLY_STEPS),)


@reads(inputs=(True, True))
def _soft_cross_entropy_rule(node, out, g):
    x, probs = node.inputs
    return cross_entropy.soft_grads(g, x, probs, node.attrs["reduction"], _needs(node), APPLY_STEPS)


# The table: each op's rule is the function above named ``_<op>_rule`` (one place per op; the ops
# in ops.NON_DIFFERENTIABLE have none), found by that name the way pluggy finds hooks.
RULES: dict[Op, Rule] = {op: globals()[f"_{op.value}_rule"] for op in Op if f"_{op.value}_rule" in globals()}
_unmatched = sorted(name for name in globals() if name.startswith("_") and name.endswith("_rule")
                    and name[1:-len("_rule")] not in {op.value for op in Op})
assert not _unmatched, f"gradient rules named for no op: {_unmatched}"


def _data_needed(op: Op, needs: tuple) -> tuple | None:
    """Which inputs' data the rule for ``op`` reads, given which inputs need a gradient (None:
    all), from its :func:`reads` declaration."""
    inputs = getattr(RULES.get(op), "reads_inputs", "all")
    if inputs == "all":
        return None
    if inputs == "none":
        return (False,) * len(needs)
    if inputs == "cross":  # each operand is read for the other's gradient (fused kernels too)
        return (needs[1], needs[0])
    return tuple(inputs)


graph.data_needed = _data_needed
graph.reads_output = frozenset(op for op, rule in RULES.items() if getattr(rule, "reads_output", False))


def vjp(node, out: "Tensor", g: "Tensor") -> tuple:
    rule = RULES.get(node.op)
    if rule is None:
        raise GraphError(f"op '{node.op}' is not differentiable")
    return rule(node, out, g)
