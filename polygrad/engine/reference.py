"""The scalar reference: every primitive op written element by element over :class:`Value`.

This one definition per op serves three purposes:
  * it *is* the ``scalar`` backend (elements are plain Python numbers there, float64 math);
  * it is the fallback path: elements are Values, so ``Value.backward`` over the decomposition
    gives the gradient without trusting any backend kernel or VJP rule;
  * it is the oracle the conformance kit tests every backend against.

Elements are polymorphic: a Python number or a Value; the helpers below pick the Value method or
the IEEE-safe float function.  Index bookkeeping (which input element feeds which output
element: broadcasting, permutations, fancy indexing) is computed on numpy *integer* arrays of
positions; every arithmetic on values happens here in pure Python.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from . import scalar_math as sm
from .cross_entropy import mean_scale
from ..ir.ops import FLOAT_UNARY, Op
from .value import Value

Flat = tuple[list, tuple]  # (row-major elements, shape)


# -- elements --------------------------------------------------------------------------------------

def leaves_of(array: np.ndarray, requires_grad: bool) -> list:
    """Elements of a numpy array: Value leaves when a gradient is wanted, else Python numbers."""
    items = np.asarray(array).ravel().tolist()
    if requires_grad:
        return [Value(float(x)) for x in items]
    return items


def data_of(items: Sequence) -> list:
    return [x.data if isinstance(x, Value) else x for x in items]


def _val(x):
    return x.data if isinstance(x, Value) else x


def _float_unary(op: Op) -> Callable:
    """A floating unary op's scalar meaning, by its name: ``Value.<name>`` on Values, and on plain
    numbers ``scalar_math.<name>`` where that module gives the op IEEE results Python's math lacks
    (exp overflow, log(0)), else the same Value method on a throwaway Value -- so a new op needs
    no entry here, nor in scalar_math unless Python's math raises where numpy does not."""
    name = op.value

    def f(x):  # looked up when called: a new op's Value method never breaks `import polygrad`
        if isinstance(x, Value):
            return getattr(x, name)()
        on_number = getattr(sm, name, None)
        return on_number(x) if on_number is not None else getattr(Value(x), name)().data
    return f


def _relu(x):
    # 0 of x's type below zero (0 * x would be -0.0, or NaN at -inf); x itself at +-0 and NaN,
    # as numpy's maximum(x, 0) and PyTorch's relu
    return x.relu() if isinstance(x, Value) else (type(x)(0) if x < 0 else x)


def _neg(x):
    return -x


def _pow(a, b):
    if isinstance(a, Value) or isinstance(b, Value):
        return (a if isinstance(a, Value) else Value(float(a))) ** b
    return float(sm.pow(a, b))


def _maximum(a, b):
    """Ties split the gradient evenly (the documented subgradient convention)."""
    va, vb = _val(a), _val(b)
    if va > vb or vb != vb:
        return a if vb == vb else b  # nan propagates like numpy.maximum
    if vb > va or va != va:
        return b if va == va else a
    if isinstance(a, Value) or isinstance(b, Value):
        return (a + b) * 0.5
    return a


def _sum(items: list):
    if any(isinstance(x, Value) for x in items):
        return Value.sum_of(items)
    total = 0
    for x in items:
        total = total + x
    return total


def _max(items: list):
    """Max of a group; ties share the gradient evenly (same convention as the MAX VJP rule)."""
    vals = [_val(x) for x in items]
    if any(v != v for v in vals):  # a NaN max: its gradient is shared by the NaN elements
        tied = [x for x, v in zip(items, vals) if v != v]
    else:
        m = max(vals)
        tied = [x for x, v in zip(items, vals) if v == m]
    if len(tied) == 1 or not any(isinstance(x, Value) for x in tied):
        return tied[0]
    return Value.sum_of(tied) * (1.0 / len(tied))


def _cast(x, dtype: np.dtype):
    v = _val(x)
    if dtype.kind == "f":
        return x if isinstance(x, Value) else float(v)
    if dtype.kind == "b":
        return bool(v)
    if isinstance(v, float):
        info = np.iinfo(dtype)
        if not info.min <= v <= info.max:  # nan, inf, out of range: numpy's (platform) result
            with np.errstate(invalid="ignore"):
                return int(np.array(v).astype(dtype))
    return int(v)


# -- index bookkeeping ------------------------------------------------------------------------------

def _positions(shape: tuple) -> np.ndarray:
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def _broadcast_map(shape: tuple, out_shape: tuple) -> list[int]:
    return np.broadcast_to(_positions(shape), out_shape).ravel().tolist()


def _take(items: list, positions: np.ndarray) -> list:
    return [items[i] for i in positions.ravel().tolist()]


# -- the ops ---------------------------------------------------------------------------------------

_UNARY: dict[Op, Callable] = {Op.NEG: _neg, Op.RELU: _relu, **{op: _float_unary(op) for op in FLOAT_UNARY}}
_BINARY: dict[Op, Callable] = {
    Op.ADD: lambda a, b: a + b, Op.MUL: lambda a, b: a * b, Op.POW: _pow, Op.MAXIMUM: _maximum,
    Op.LT: lambda a, b: _val(a) < _val(b), Op.LE: lambda a, b: _val(a) <= _val(b),
    Op.GT: lambda a, b: _val(a) > _val(b), Op.GE: lambda a, b: _val(a) >= _val(b),
    Op.EQ: lambda a, b: _val(a) == _val(b), Op.NE: lambda a, b: _val(a) != _val(b),
}


def _reduce(flat: Flat, axes: tuple, keepdims: bool, combine: Callable) -> Flat:
    items, shape = flat
    kept = [i for i in range(len(shape)) if i not in axes]
    groups = np.transpose(_positions(shape), kept + list(axes)).reshape(
        int(np.prod([shape[i] for i in kept], dtype=np.int64)), int(np.prod([shape[i] for i in axes], dtype=np.int64)))
    out = [combine(_take(items, row)) if row.size else combine([]) for row in groups]
    out_shape = tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)
    return out, out_shape


def _matmul(a: Flat, b: Flat) -> Flat:
    (ai, ash), (bi, bsh) = a, b
    a2 = ash if len(ash) > 1 else (1,) + ash
    b2 = bsh if len(bsh) > 1 else bsh + (1,)
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    n, k, m = a2[-2], a2[-1], b2[-1]
    pa = np.broadcast_to(_positions(ash).reshape(a2), batch + (n, k))
    pb = np.broadcast_to(_positions(bsh).reshape(b2), batch + (k, m))
    out = []
    for bidx in np.ndindex(*batch):
        A, B = pa[bidx].tolist(), pb[bidx].tolist()
        for i in range(n):
            for j in range(m):
                out.append(_sum([ai[A[i][t]] * bi[B[t][j]] for t in range(k)]) if k else 0.0)
    shape = batch + ((n,) if len(ash) > 1 else ()) + ((m,) if len(bsh) > 1 else ())
    return out, shape


def _index_add(src: Flat, shape: tuple, index: tuple) -> Flat:
    target = _positions(shape)[index]
    src_map = _broadcast_map(src[1], target.shape)
    acc: list[list] = [[] for _ in range(int(np.prod(shape, dtype=np.int64)))]
    for pos, s in zip(target.ravel().tolist(), src_map):
        acc[pos].append(src[0][s])
    return [_sum(group) if group else 0.0 for group in acc], shape


def _concat(flats: Sequence[Flat], axis: int) -> Flat:
    items, offset, blocks = [], 0, []
    for it, sh in flats:
        blocks.append(_positions(sh) + offset)
        offset += len(it)
        items.extend(it)
    order = np.concatenate(blocks, axis=axis)
    return _take(items, order), order.shape


def _spmm(values: Flat, x: Flat, pattern) -> Flat:
    vals, (xi, xsh) = values[0], x
    f = xsh[1] if len(xsh) == 2 else 1
    out = []
    for r in range(pattern.shape[0]):
        lo, hi = int(pattern.indptr[r]), int(pattern.indptr[r + 1])
        cols = pattern.cols[lo:hi].tolist()
        for j in range(f):
            out.append(_sum([vals[lo + t] * xi[c * f + j] for t, c in enumerate(cols)]) if cols else 0.0)
    return out, (pattern.shape[0],) + xsh[1:]


def _sddmm(p: Flat, q: Flat, pattern) -> Flat:
    (pi, psh), (qi, _) = p, q
    f = psh[1]
    out = [_sum([pi[r * f + j] * qi[c * f + j] for j in range(f)]) if f else 0.0
           for r, c in zip(pattern.rows.tolist(), pattern.cols.tolist())]
    return out, (pattern.nnz,)


def _segment(values: Flat, pattern, combine: Callable) -> Flat:
    vals = values[0]
    ptr = pattern.indptr.tolist()
    return [combine(vals[ptr[r]:ptr[r + 1]]) if ptr[r + 1] > ptr[r] else 0.0
            for r in range(pattern.shape[0])], (pattern.shape[0],)


def _log_softmax_row(row: list) -> list:
    """``x_j - m - log sum_k exp(x_k - m)`` of one row, ``m`` its max taken as a constant (NaN
    when the row has one; a non-finite max makes the row NaN)."""
    exp, log = _UNARY[Op.EXP], _UNARY[Op.LOG]
    vals = [_val(v) for v in row]
    m = float("nan") if any(v != v for v in vals) else max(vals)
    shifted = [v - m for v in row]
    log_sum = log(_sum([exp(v) for v in shifted]))
    return [v - log_sum for v in shifted]


def _reduced(losses: list, reduction: str) -> Flat:
    if reduction == "none":
        return losses, (len(losses),)
    total = _sum(losses)
    return [total * mean_scale(len(losses)) if reduction == "mean" else total], ()


def _cross_entropy(x: Flat, target: np.ndarray, reduction: str) -> Flat:
    """Each row's ``-log_softmax(row)[t]``, then the reduction: the composite's meaning, element
    by element."""
    items, (n, c) = x
    return _reduced([-_log_softmax_row(items[i * c:(i + 1) * c])[t] for i, t in enumerate(target.tolist())],
                    reduction)


def _soft_cross_entropy(x: Flat, probs: Flat, reduction: str) -> Flat:
    """Each row's ``-sum_j log_softmax(row)_j * p_j``, then the reduction (the composite's meaning)."""
    (items, (n, c)), p = x, probs[0]
    return _reduced([-_sum([lp * p[i * c + j] for j, lp in enumerate(_log_softmax_row(items[i * c:(i + 1) * c]))])
                     for i in range(n)], reduction)


def run(op: Op, flats: Sequence[Flat], attrs: dict) -> Flat:
    """Apply primitive ``op`` to flat operands; returns (elements, shape)."""
    if op in _UNARY:
        f = _UNARY[op]
        return [f(x) for x in flats[0][0]], flats[0][1]
    if op == Op.CAST:
        return [_cast(x, attrs["dtype"]) for x in flats[0][0]], flats[0][1]
    if op in _BINARY:
        (ai, ash), (bi, bsh) = flats
        shape = tuple(np.broadcast_shapes(ash, bsh))
        f = _BINARY[op]
        return [f(ai[i], bi[j]) for i, j in zip(_broadcast_map(ash, shape), _broadcast_map(bsh, shape))], shape
    if op == Op.WHERE:
        shape = tuple(np.broadcast_shapes(*(s for _, s in flats)))
        maps = [_broadcast_map(s, shape) for _, s in flats]
        (ci, _), (ai, _), (bi, _) = flats
        return [ai[i] if _val(ci[c]) else bi[j] for c, i, j in zip(*maps)], shape
    if op == Op.SUM:
        return _reduce(flats[0], attrs["axes"], attrs["keepdims"], _sum)
    if op == Op.MAX:
        return _reduce(flats[0], attrs["axes"], attrs["keepdims"], _max)
    if op == Op.RESHAPE:
        return list(flats[0][0]), tuple(attrs["shape"])
    if op == Op.PERMUTE:
        order = np.transpose(_positions(flats[0][1]), attrs["perm"])
        return _take(flats[0][0], order), order.shape
    if op == Op.EXPAND:
        items, shape = flats[0]
        return [items[i] for i in _broadcast_map(shape, tuple(attrs["shape"]))], tuple(attrs["shape"])
    if op == Op.GETITEM:
        order = _positions(flats[0][1])[attrs["index"]]
        return _take(flats[0][0], order), order.shape
    if op == Op.INDEX_ADD:
        return _index_add(flats[0], tuple(attrs["shape"]), attrs["index"])
    if op == Op.CONCAT:
        return _concat(flats, attrs["axis"])
    if op == Op.MATMUL:
        return _matmul(flats[0], flats[1])
    if op == Op.ADDMM:  # the product, then the input added with broadcasting (as the composite)
        items, shape = _matmul(flats[1], flats[2])
        return run(Op.ADD, [(items, shape), flats[0]], {})
    if op == Op.ADDCMUL:  # the product first, then the input added (as the composite)
        return run(Op.ADD, [flats[0], run(Op.MUL, [flats[1], flats[2]], {})], {})
    if op == Op.CROSS_ENTROPY:
        return _cross_entropy(flats[0], attrs["target"], attrs["reduction"])
    if op == Op.SOFT_CROSS_ENTROPY:
        return _soft_cross_entropy(flats[0], flats[1], attrs["reduction"])
    if op == Op.SPMM:
        return _spmm(flats[0], flats[1], attrs["pattern"])
    if op == Op.SDDMM:
        return _sddmm(flats[0], flats[1], attrs["pattern"])
    if op == Op.SEGMENT_SUM:
        return _segment(flats[0], attrs["pattern"], _sum)
    if op == Op.SEGMENT_MAX:
        return _segment(flats[0], attrs["pattern"], _max)
    raise NotImplementedError(f"no scalar reference for op '{op}'")
