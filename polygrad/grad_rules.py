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
The edge points are checked against PyTorch's values by ``polygrad.testing.edges`` (the conformance kit's edge-point set).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .dispatch import apply
from .errors import GraphError
from .ops import Op

if TYPE_CHECKING:
    from .tensor import Tensor

Rule = Callable[..., tuple]


def _needs(node) -> tuple[bool, ...]:
    return tuple(t.requires_grad for t in node.inputs)


# Rules run on every backward: for dense-only operands they call the primitives directly, which
# skips the user-facing wrappers' argument checks, sparse routing and layout policy (a gradient's
# layout is the forward's business, not something to re-decide on every pass).

def _mm(a, b):
    return apply(Op.MATMUL, (a, b))


def _swap_last(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return apply(Op.PERMUTE, (x,), {"perm": tuple(perm)})


def _neg(node, out, g):
    return (-g,)


def _exp(node, out, g):
    return (g * out,)


def _log(node, out, g):
    return (g / node.inputs[0],)


def _relu(node, out, g):
    from .tensor import where
    # 0 where x <= 0 (relu'(0) = 0), g elsewhere -- NaN included, as PyTorch's threshold_backward
    return (where(node.inputs[0] <= 0, 0.0, g),)


def _tanh(node, out, g):
    return (g * (1 - out * out),)


def _reciprocal(node, out, g):
    return (-g * out * out,)


def _cast(node, out, g):
    x = node.inputs[0]
    return (g.cast(x.dtype) if x.dtype.kind == "f" else None,)


def _add(node, out, g):
    return (g, g)


def _mul(node, out, g):
    a, b = node.inputs
    if a is b:  # x * x: one gradient, no accumulation of two halves
        return (apply(Op.MUL, (g, a)) * 2, None)
    na, nb = _needs(node)
    return (apply(Op.MUL, (g, b)) if na else None, apply(Op.MUL, (g, a)) if nb else None)


def _pow(node, out, g):
    # PyTorch's edge conventions: d/da is 0 where b == 0 (x ** 0 is the constant 1, even at
    # a == 0 where b * a ** (b - 1) would be 0 * inf); d/db is 0 where a == 0 and b >= 0 (the
    # limit of a ** b * log(a)), -inf/inf where a == 0 and b < 0, NaN where a < 0.
    from .tensor import where
    a, b = node.inputs
    na, nb = _needs(node)
    ga = gb = None
    if na:
        ga = where(b == 0, 0.0, g * b * a ** (b - 1))
    if nb:
        gb = where((a == 0) * (b >= 0), 0.0, g * out * a.log())
    return (ga, gb)


def _maximum(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    # 1 to the winner, 0.5 to each on a tie, and (PyTorch's rule) 1 to both where a NaN is involved
    tie = (a == b).cast(g.dtype) * 0.5
    ga = g * (1 - (a < b).cast(g.dtype) - tie) if na else None
    gb = g * (1 - (a > b).cast(g.dtype) - tie) if nb else None
    return (ga, gb)


def _where(node, out, g):
    from .tensor import where
    cond = node.inputs[0]
    _, na, nb = _needs(node)
    return (None, where(cond, g, 0.0) if na else None, where(cond, 0.0, g) if nb else None)


def _keepdims(g, node):
    """g reshaped so the reduced axes are kept as size 1 (ready to broadcast against the input)."""
    if node.attrs["keepdims"]:
        return g
    x = node.inputs[0]
    return g.reshape(tuple(1 if i in node.attrs["axes"] else n for i, n in enumerate(x.shape)))


def _sum(node, out, g):
    shape = node.inputs[0].shape
    axes = node.attrs["axes"]
    if not node.attrs["keepdims"] and axes != tuple(range(len(axes))):
        g = _keepdims(g, node)  # reduced axes not leading: put them back as size 1 first
    return (g if g.shape == shape else apply(Op.EXPAND, (g,), {"shape": shape}),)


def _max(node, out, g):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    o = _keepdims(out, node)
    # the maximal elements; where the max is NaN, the NaN elements (torch's evenly_distribute)
    mask = (x == o).cast(g.dtype) + (x != x).cast(g.dtype) * (o != o).cast(g.dtype)
    count = mask.sum(axis=axes, keepdims=True)
    return (_keepdims(g, node) * mask / count,)


def _reshape(node, out, g):
    return (g.reshape(node.inputs[0].shape),)


def _permute(node, out, g):
    perm = node.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (g.permute(*inverse),)


def _expand(node, out, g):
    return (g,)  # autodiff's unbroadcast sums the expanded axes


def _getitem(node, out, g):
    from .tensor import index_add
    x = node.inputs[0]
    return (index_add(g, node.attrs["index"], x.shape),)


def _index_add(node, out, g):
    return (g[node.attrs["index"]],)


def _concat(node, out, g):
    axis = node.attrs["axis"]
    grads, start = [], 0
    for t in node.inputs:
        stop = start + t.shape[axis]
        grads.append(g[(slice(None),) * axis + (slice(start, stop),)] if t.requires_grad else None)
        start = stop
    return tuple(grads)


def _matmul(node, out, g):
    a, b = node.inputs
    na, nb = _needs(node)
    a2 = a if a.ndim > 1 else a.reshape(1, a.shape[0])
    b2 = b if b.ndim > 1 else b.reshape(b.shape[0], 1)
    g2 = g
    if a.ndim == 1:
        g2 = g2.unsqueeze(-2 if b.ndim > 1 else -1)
    if b.ndim == 1:
        g2 = g2.unsqueeze(-1)
    ga = gb = None
    if na:
        ga = _mm(g2, _swap_last(b2))
        if a.ndim == 1:
            ga = ga.reshape(ga.shape[:-2] + (a.shape[0],))
    if nb:
        gb = _mm(_swap_last(a2), g2)
        if b.ndim == 1:
            gb = gb.reshape(gb.shape[:-2] + (b.shape[0],))
    return (ga, gb)


def _spmm(node, out, g):
    from .tensor import sddmm, spmm
    values, x = node.inputs
    nv, nx = _needs(node)
    pattern = node.attrs["pattern"]
    dvalues = dx = None
    if nv:  # dA only at A's nonzeros: an SDDMM, never an n x m matrix
        if x.ndim == 1:
            dvalues = sddmm(g.reshape(g.shape[0], 1), x.reshape(x.shape[0], 1), pattern)
        else:
            dvalues = sddmm(g, x, pattern)
    if nx:  # dX = A^T dY through the cached transpose
        t_pattern, perm = pattern.transpose()
        dx = spmm(values[perm], g, t_pattern)
    return (dvalues, dx)


def _sddmm(node, out, g):
    from .tensor import spmm
    p, q = node.inputs
    npp, nq = _needs(node)
    pattern = node.attrs["pattern"]
    dp = spmm(g, q, pattern) if npp else None
    dq = None
    if nq:
        t_pattern, perm = pattern.transpose()
        dq = spmm(g[perm], p, t_pattern)
    return (dp, dq)


def _segment_sum(node, out, g):
    return (g[node.attrs["pattern"].rows],)


RULES: dict[Op, Rule] = {
    Op.NEG: _neg, Op.EXP: _exp, Op.LOG: _log, Op.RELU: _relu, Op.TANH: _tanh,
    Op.RECIPROCAL: _reciprocal, Op.CAST: _cast,
    Op.ADD: _add, Op.MUL: _mul, Op.POW: _pow, Op.MAXIMUM: _maximum, Op.WHERE: _where,
    Op.SUM: _sum, Op.MAX: _max,
    Op.RESHAPE: _reshape, Op.PERMUTE: _permute, Op.EXPAND: _expand, Op.GETITEM: _getitem,
    Op.INDEX_ADD: _index_add, Op.CONCAT: _concat, Op.MATMUL: _matmul,
    Op.SPMM: _spmm, Op.SDDMM: _sddmm, Op.SEGMENT_SUM: _segment_sum,
}


def vjp(node, out: "Tensor", g: "Tensor") -> tuple:
    rule = RULES.get(node.op)
    if rule is None:
        raise GraphError(f"op '{node.op}' is not differentiable")
    return rule(node, out, g)
