"""THE gradient table: one vector-Jacobian product per primitive, written in polygrad ops.

Because each rule is made of differentiable polygrad ops, gradients of gradients work
(``create_graph=True``), and a backend only has to supply forward kernels.  A rule returns one
gradient per input (None where the input needs none), at the *output's broadcast shape* for
elementwise ops: autodiff's ``unbroadcast`` reduces it to the input's shape.

Subgradient conventions (fixed here, and mirrored by the scalar reference):
  * relu'(0) = 0 (as micrograd);
  * maximum(a, b) on a tie, and max over an axis with several maximal elements, split the
    gradient evenly among the tied elements.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from .dispatch import apply
from .errors import GraphError
from .ops import Op

if TYPE_CHECKING:
    from .tensor import Tensor

Rule = Callable[..., tuple]


def _const(like, value: float) -> "Tensor":
    """A 0-d constant of ``like``'s dtype on its backend (it broadcasts)."""
    be = like._be
    return like._new(be.from_numpy(np.asarray(value, like.dtype)), be, (), like.dtype)


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


def _swap_last(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return apply(Op.PERMUTE, (x,), {"perm": tuple(perm)})


def _neg_rule(node, out, g):
    return (_neg(g),)


def _exp_rule(node, out, g):
    return (_mul(g, out),)


def _log_rule(node, out, g):
    return (_mul(g, apply(Op.RECIPROCAL, (node.inputs[0],))),)


def _relu_rule(node, out, g):
    x = node.inputs[0]
    return (_mul(g, apply(Op.GT, (x, _const(x, 0)))),)


def _tanh_rule(node, out, g):
    return (_mul(g, _one_minus(_mul(out, out))),)


def _reciprocal_rule(node, out, g):
    return (_mul(_mul(_neg(g), out), out),)


def _cast_rule(node, out, g):
    x = node.inputs[0]
    return (_cast(g, x.dtype) if x.dtype.kind == "f" else None,)


def _add_rule(node, out, g):
    return (g, g)


def _mul_rule(node, out, g):
    a, b = node.inputs
    if a is b:  # x * x: one gradient, no accumulation of two halves
        return (_mul(_mul(g, a), _const(g, 2)), None)
    na, nb = _needs(node)
    return (_mul(g, b) if na else None, _mul(g, a) if nb else None)


def _pow_rule(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    da = _mul(_mul(g, b), apply(Op.POW, (a, _add(b, _neg(_const(b, 1)))))) if na else None
    db = _mul(_mul(g, out), apply(Op.LOG, (a,))) if nb else None
    return (da, db)


def _maximum_rule(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    # 1 where a wins, 0.5 on ties, 0 where b wins
    share = _add(_cast(apply(Op.GT, (a, b)), g.dtype),
                 _mul(_cast(apply(Op.EQ, (a, b)), g.dtype), _const(g, 0.5)))
    return (_mul(g, share) if na else None, _mul(g, _one_minus(share)) if nb else None)


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


def _sum_rule(node, out, g):
    shape = node.inputs[0].shape
    axes = node.attrs["axes"]
    if not node.attrs["keepdims"] and axes != tuple(range(len(axes))):
        g = _keepdims(g, node)  # reduced axes not leading: put them back as size 1 first
    return (g if g.shape == shape else apply(Op.EXPAND, (g,), {"shape": shape}),)


def _max_rule(node, out, g):
    x = node.inputs[0]
    mask = _cast(apply(Op.EQ, (x, _keepdims(out, node))), g.dtype)
    count = apply(Op.SUM, (mask,), {"axes": node.attrs["axes"], "keepdims": True})
    return (_mul(_mul(_keepdims(g, node), mask), apply(Op.RECIPROCAL, (count,))),)


def _reshape_rule(node, out, g):
    return (_reshape(g, node.inputs[0].shape),)


def _permute_rule(node, out, g):
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (apply(Op.PERMUTE, (g,), {"perm": tuple(inverse)}),)


def _expand_rule(node, out, g):
    return (g,)  # autodiff's unbroadcast sums the expanded axes


def _getitem_rule(node, out, g):
    x = node.inputs[0]  # the index was normalised against x.shape when the forward was recorded
    return (apply(Op.INDEX_ADD, (g,), {"index": node.attrs["index"], "shape": x.shape}),)


def _index_add_rule(node, out, g):
    return (_take(g, node.attrs["index"]),)


def _concat_rule(node, out, g):
    axis = node.attrs["axis"]
    grads, start = [], 0
    for t in node.inputs:
        stop = start + t.shape[axis]
        grads.append(_take(g, (slice(None),) * axis + (slice(start, stop),)) if t.requires_grad else None)
        start = stop
    return tuple(grads)


def _matmul_rule(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    a2 = a if a.ndim > 1 else _reshape(a, (1, a.shape[0]))
    b2 = b if b.ndim > 1 else _reshape(b, (b.shape[0], 1))
    g2 = g
    if a.ndim == 1:  # put back the row axis a vector operand lost
        g2 = _reshape(g2, g2.shape[:-1] + (1,) + g2.shape[-1:] if b.ndim > 1 else g2.shape + (1,))
    if b.ndim == 1:
        g2 = _reshape(g2, g2.shape + (1,))
    ga = gb = None
    if na:
        ga = _mm(g2, _swap_last(b2))
        if a.ndim == 1:
            ga = _reshape(ga, ga.shape[:-2] + (a.shape[0],))
    if nb:
        gb = _mm(_swap_last(a2), g2)
        if b.ndim == 1:
            gb = _reshape(gb, gb.shape[:-2] + (b.shape[0],))
    return (ga, gb)


def _spmm_op(values, x, pattern):
    return apply(Op.SPMM, (values, x), {"pattern": pattern}, pattern.layout)


def _sddmm_op(p, q, pattern):
    return apply(Op.SDDMM, (p, q), {"pattern": pattern}, pattern.layout)


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


def _segment_sum_rule(node, out, g):
    return (_take(g, (node.attrs["pattern"].rows,)),)


RULES: dict[Op, Rule] = {
    Op.NEG: _neg_rule, Op.EXP: _exp_rule, Op.LOG: _log_rule, Op.RELU: _relu_rule, Op.TANH: _tanh_rule,
    Op.RECIPROCAL: _reciprocal_rule, Op.CAST: _cast_rule,
    Op.ADD: _add_rule, Op.MUL: _mul_rule, Op.POW: _pow_rule, Op.MAXIMUM: _maximum_rule, Op.WHERE: _where_rule,
    Op.SUM: _sum_rule, Op.MAX: _max_rule,
    Op.RESHAPE: _reshape_rule, Op.PERMUTE: _permute_rule, Op.EXPAND: _expand_rule, Op.GETITEM: _getitem_rule,
    Op.INDEX_ADD: _index_add_rule, Op.CONCAT: _concat_rule, Op.MATMUL: _matmul_rule,
    Op.SPMM: _spmm_rule, Op.SDDMM: _sddmm_rule, Op.SEGMENT_SUM: _segment_sum_rule,
}


def vjp(node, out: "Tensor", g: "Tensor") -> tuple:
    rule = RULES.get(node.op)
    if rule is None:
        raise GraphError(f"op '{node.op}' is not differentiable")
    return rule(node, out, g)
