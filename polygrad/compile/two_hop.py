"""The two-hop row restriction of a captured GCN step: a program-to-program pass run after the row
gather (``rewrite._push_row_gathers``) that pushes "only these rows are read" back through the
first layer, with eager's bits.

After the row gather, the step's last propagation ``T = Â[train] @ Z`` reads ``Z = H1d @ W2`` only
at the columns of ``Â[train]``: the 1-hop neighbourhood ``N1`` of the training rows.  The first
layer ``H1d = dropout(relu(Â @ (Xd @ W1) + b1))`` then needs ``Â @ S0`` only at the rows ``N1``,
which read ``S0 = Xd @ W1`` only at the 2-hop neighbourhood ``N2``.  On Cora: 140 training rows,
|N1| = 644, |N2| = 1664 of 2708 nodes, 62% of the features' nonzeros.  This pass makes

- ``S0`` the product of the rows ``N2`` of ``Xd`` only (``Pattern.take_rows``: ``|N2| x F``
  nonzeros gathered from ``Xd``'s values), and its weight gradient ``W1' = Xdᵀ dS0`` a sum over
  those rows only;
- ``S1 = Â @ S0`` a product over ``Â``'s rows ``N1`` only, its other rows empty (so zero), its
  columns renumbered into ``N2`` (``Pattern.restrict``), and its backward ``dS0 = Âᵀ g`` the
  ``|N2|`` rows that ``W1'`` reads;
- everything between (bias, ReLU, dropout, ``H1d @ W2`` and its fused backward) unchanged, at
  full shape, so a dense product runs on the shapes eager's does.

Why the bits are eager's:
- A kept row of a row-restricted CSR product sums its nonzeros in the same order.  A dense
  product of the same shapes computes each output row from that row alone, so ``Z``'s rows ``N1``
  (the only ones read) are eager's.
- Each skipped term of a backward sum is an exact zero: ``dZ`` is zero outside ``N1`` (no entry of
  ``Â[train]`` there), hence so are ``dH1d = dZ W2ᵀ`` (``W2`` finite), ``dH1 = dH1d * mask`` (a
  mask finite and without a sign bit: ``+0``) and ``g = where(H1 <= 0, +0, dH1)`` -- the same
  ``+0`` whichever branch, so the skipped rows of ``H1`` do not matter -- and ``dS0 = Âᵀ g``
  outside ``N2`` (``Â`` finite).  An accumulator that starts at ``+0`` never becomes ``-0`` under
  round-to-nearest, so adding ``±0`` never changes it -- unless the other factor is infinite or
  NaN (``inf * 0``).  ``W2' = H1dᵀ dZ`` runs on the full ``H1d``, whose skipped rows now differ
  from eager's: their terms are zeros on both sides only if eager's ``H1d`` is finite everywhere.
- So a check runs each replay before the backward (:func:`_two_hop_bound`): the values of ``Xd``,
  ``W1``, ``Â``, ``b1``, the mask and ``W2`` are finite, the mask has no sign bit, the ``where``'s
  constant is ``+0``, and ``(rows(Xd) · |Xd| · |W1| · rows(Â) · |Â| + |b1|) · |mask|`` is below a
  quarter of the dtype's largest value, where ``|a|`` bounds ``a``'s largest magnitude (its
  2-norm on numpy: one BLAS dot per array; the mask's largest value, which one pass over its bits
  also finds a sign bit with; taken >= 1, so nothing underflows) and the row counts
  are the patterns' longest rows.  That bounds every partial sum of every row of ``S0``, ``S1``,
  ``H1`` and ``H1d`` (no overflow to infinity; the factor 4 covers rounding).  On Cora the check
  costs ~20 us of the ~200 us saved.  A failed check makes the replay a fault: the call runs
  eagerly, with the generator's state restored.

Anything else -- another op in the chain, another reader of a slot whose skipped rows change, a
slot the step returns, gradients into ``Xd``'s or ``Â``'s values, an optimizer step before the
backward, a dtype other than float32/float64, a neighbourhood that is not smaller -- leaves the
program unchanged.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.ops import Op
from ..sparse.pattern import Pattern
from .program import (ASSERT_FINITE, CALL, FRESH, FUSED, HOST, KERNEL, LOAD, AssertFinite, Call, Fused, Kernel,
                      _dataflow, _result_slots)

#: apply only when the 2-hop rows hold at most this share of the first product's nonzeros: below
#: it the saved work outweighs the replay's check and gathers (on Cora: 62%)
MAX_SHARE = 0.85

#: a longest row beyond this share of the dtype's precision (rows x eps) is refused: the bound's
#: factor of 4 covers the rounding of partial sums of up to ~rows * eps relative growth
MAX_ROWS_EPS = 1e-3

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_SAME_WIDTH_UINT: dict[np.dtype, np.dtype] = {np.dtype(np.float32): np.dtype(np.uint32),
                                           np.dtype(np.float64): np.dtype(np.uint64)}


def _no_numbers() -> tuple:
    return ()


def _namespace(a: Any) -> Any:
    return a.__array_namespace__() if hasattr(a, "__array_namespace__") else np


def _two_hop_bound(*arrays: Any, rx: int, ra: int, bias: bool, mask: bool, limit: float) -> tuple:
    """``(0,)`` (a 0-d array of ``W1``'s dtype) when eager's skipped rows are provably finite (see
    the module docstring), ``(inf,)`` otherwise: the replay's AssertFinite faults on it.
    ``arrays``: Xd's values, W1, Â's values, [b1], [mask], W2, the ReLU backward's constant.

    Each array's largest magnitude is bounded by its 2-norm (one BLAS dot: NaN or infinite when a
    value is, or when a square overflows -- a false alarm only for values beyond ~1e19 in
    float32, which then run eagerly), taken >= 1 so that nothing underflows."""
    xd, w1, av, *rest = arrays
    b1 = rest.pop(0) if bias else None
    m2 = rest.pop(0) if mask else None
    w2, zero = rest
    if not all(isinstance(a, np.ndarray) for a in arrays):
        return _two_hop_bound_generic(xd, w1, av, b1, m2, w2, zero, rx=rx, ra=ra, limit=limit)

    def norm(a: np.ndarray) -> float:  # >= max |a| (up to rounding, covered by the factor 4); NaN if a NaN
        flat = a.ravel(order="K")
        return max(math.sqrt(float(np.dot(flat, flat))), 1.0) if flat.size else 1.0

    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing square is an answer, not a warning
        bound = norm(xd) * norm(w1) * max(rx, 1) * norm(av) * max(ra, 1)
        if b1 is not None:
            bound += norm(b1)
        w2_finite = math.isfinite(norm(w2))
        if m2 is not None:
            bound *= _mask_bound(m2)
    z = float(zero) if zero.shape == () else math.nan
    ok = bound * 4.0 < limit and w2_finite and z == 0.0 and math.copysign(1.0, z) > 0
    return (np.asarray(0.0 if ok else np.inf, dtype=w1.dtype),)


def _mask_bound(m: np.ndarray) -> float:
    """``max |m|`` (>= 1) of a mask that has no sign bit anywhere, else infinity (NaN: a NaN in it).

    One pass: the mask's largest bit pattern read as an unsigned integer.  A sign bit anywhere
    (``-0``, a negative value or NaN) makes it at least the sign bit's value; without one, integer
    order is float order, so it is the largest value exactly (inf or NaN when one is).  Half the
    passes of a norm and a separate sign test (the mask has N x hidden values)."""
    if m.size == 0:
        return 1.0
    uints = _SAME_WIDTH_UINT.get(m.dtype)
    if uints is None or not (m.flags.c_contiguous or m.flags.f_contiguous):
        return math.inf if bool(np.signbit(m).any()) else max(float(np.max(m)), 1.0)
    top = m.ravel(order="K").view(uints).max()  # a view: the array is contiguous in one order
    if int(top) >> (8 * m.dtype.itemsize - 1):
        return math.inf
    return max(float(top.view(m.dtype)), 1.0)


def _two_hop_bound_generic(xd: Any, w1: Any, av: Any, b1: Any, m2: Any, w2: Any, zero: Any, *, rx: int, ra: int,
                           limit: float) -> tuple:
    """:func:`_two_hop_bound` written against the arrays' namespace (a backend that traces it)."""
    xp = _namespace(w1)
    f64 = xp.float64

    def biggest(a: Any) -> Any:  # max |a| in float64, inf unless all finite; >= 1 (nothing underflows)
        if a.size == 0:
            return xp.asarray(1.0, dtype=f64)
        m = xp.asarray(xp.maximum(xp.max(a), -xp.min(a)), dtype=f64)
        m = xp.where(xp.all(xp.isfinite(a)), m, xp.asarray(np.inf, dtype=f64))  # max may skip NaN
        return xp.maximum(m, xp.asarray(1.0, dtype=f64))

    bound = biggest(xd) * biggest(w1) * float(max(rx, 1)) * biggest(av) * float(max(ra, 1))
    if b1 is not None:
        bound = bound + biggest(b1)
    ok = xp.isfinite(biggest(w2))
    if m2 is not None:
        bound = bound * biggest(m2)
        ok = ok & ~xp.any(xp.signbit(m2))
    ok = ok & (bound * 4.0 < limit) & xp.all(zero == 0) & ~xp.any(xp.signbit(zero))
    return (xp.where(ok, xp.asarray(0.0, dtype=w1.dtype), xp.asarray(np.inf, dtype=w1.dtype)),)


def _push_two_hops(program: list, meta: list, spec: tuple) -> tuple[list, list]:
    """The program with the first layer restricted to the 2-hop rows (module docstring), or
    ``(program, meta)`` unchanged when its shape is not exactly the one recognised."""
    results = _result_slots(spec)
    readers, producer = _dataflow(program)
    for t, e in enumerate(program):
        if e[0] == KERNEL and e[2] == (Op.SPMM, "csr"):
            plan = _plan(program, meta, readers, producer, results, t)
            if plan is not None:
                return _apply(list(program), list(meta), plan)
    return program, meta


def _kernel(program: list, n: int | None, key: tuple) -> tuple | None:
    if n is None:
        return None
    e = program[n]
    return e if e[0] == KERNEL and e[2] == key else None


def _made_by(program: list, producer: dict, slot: int, kind: int) -> bool:
    n = producer.get(slot)
    return n is not None and program[n][0] == kind


def _fused_spmm(program: list, n: int, pattern: Pattern, x: int) -> bool:
    """Entry ``n`` is the fused SpMM backward over ``pattern`` reading ``x`` (for its dtype only:
    no gradient of the values asked, which would read ``x``)."""
    e = program[n]
    return (e[0] == FUSED and e[2] == (Op.SPMM, "csr") and e[4].get("pattern") is pattern and e[3][2] == x
            and tuple(e[4].get("needs", ())) == (False, True) and len(e[5]) == 2 and e[5][0] == -1)


def _plan(program: list, meta: list, readers: dict, producer: dict, results: set, t: int) -> dict | None:
    """What :func:`_apply` needs, when the SpMM at entry ``t`` ends the recognised chain."""
    last = program[t]
    p_t = last[4].get("pattern")
    z = last[3][1]
    if not isinstance(p_t, Pattern) or len(meta[z][1]) != 2 or p_t.shape[1] != meta[z][1][0]:
        return None
    n = meta[z][1][0]
    # Z: the dense product H1d @ W2, read by this SpMM and by its fused backward only
    mm = _kernel(program, producer.get(z), (Op.MATMUL, "dense"))
    z_readers = readers.get(z, [])
    if mm is None or len(z_readers) != 2 or z in results:
        return None
    fz = [r for r in z_readers if r != t]
    if len(fz) != 1 or not _fused_spmm(program, fz[0], p_t, z):
        return None
    dz = program[fz[0]][5][1]
    h1d, w2 = mm[3]
    if len(meta[h1d][1]) != 2 or meta[h1d][1][0] != n or h1d in results:
        return None
    # the fused backward of H1d @ W2: (dH1d, dW2) from dZ, both asked
    fm = [r for r in readers.get(h1d, []) if program[r][0] == FUSED and program[r][2] == (Op.MATMUL, "dense")
          and program[r][3] == (dz, h1d, w2) and len(program[r][5]) == 2 and min(program[r][5]) >= 0]
    if len(fm) != 1:
        return None
    fme = program[fm[0]]
    dh1d = fme[5][0]
    # H1d = H1 * mask (a fresh draw of the same shape), or H1 itself
    m2 = None
    h1 = h1d
    drop = _kernel(program, producer.get(h1d), (Op.MUL, "dense"))
    if drop is not None:
        a, b = drop[3]
        for h, m in ((a, b), (b, a)):
            if _made_by(program, producer, m, FRESH) and meta[m][1] == meta[h1d][1] == meta[h][1]:
                h1, m2 = h, m
                break
        else:
            return None
        if sorted(readers.get(h1d, [])) != sorted([producer[z], fm[0]]):
            return None
    relu = _kernel(program, producer.get(h1), (Op.RELU, "dense"))
    if relu is None or h1 in results:
        return None
    # the ReLU backward: g = where(H1 <= c, zero, dH1), dH1 = dH1d * mask (or dH1d)
    h1_readers = readers.get(h1, [])
    fwd_reader = producer[h1d] if m2 is not None else producer[z]
    le = [r for r in h1_readers if r != fwd_reader]
    expected = 2 if m2 is not None else 3  # H1 itself: the matmul and its fused backward read it too
    if len(h1_readers) != expected or len(le) != expected - 1:
        return None
    le = [r for r in le if r != fm[0]]
    if len(le) != 1 or _kernel(program, le[0], (Op.LE, "dense")) is None or program[le[0]][3][0] != h1:
        return None
    c = program[le[0]][5]
    where = readers.get(c, [])
    if len(where) != 1 or c in results or _kernel(program, where[0], (Op.WHERE, "dense")) is None:
        return None
    cond, zero, dh1 = program[where[0]][3]
    if cond != c:
        return None
    if not _made_by(program, producer, zero, LOAD) or meta[zero][1] != ():
        return None
    if m2 is not None:
        back = _kernel(program, producer.get(dh1), (Op.MUL, "dense"))
        if back is None or sorted(back[3]) != sorted((dh1d, m2)):
            return None
    elif dh1 != dh1d:
        return None
    g = program[where[0]][5]
    # H1 = relu(S1 + b1) or relu(S1)
    p1 = relu[3][0]
    if len(readers.get(p1, [])) != 1 or p1 in results:
        return None
    s1, b1 = p1, None
    add = _kernel(program, producer.get(p1), (Op.ADD, "dense"))
    if add is not None:
        s1, b1 = add[3]
        if meta[b1][1] != (meta[p1][1][1],) or meta[s1][1] != meta[p1][1]:
            return None
        if len(readers.get(s1, [])) != 1 or s1 in results:
            return None
    spmm1 = producer.get(s1)
    e1 = _kernel(program, spmm1, (Op.SPMM, "csr"))
    if e1 is None or meta[s1][1] != (n, meta[h1d][1][1]):
        return None
    p_a, (av, s0) = e1[4].get("pattern"), e1[3]
    # S0 = Xd @ W1 (an SpMM), read by S1's product and by the fused backward of S1
    spmm0 = producer.get(s0)
    e0 = _kernel(program, spmm0, (Op.SPMM, "csr"))
    if e0 is None or not isinstance(p_a, Pattern) or s0 in results or len(readers.get(s0, [])) != 2:
        return None
    f1 = [r for r in readers[s0] if r != spmm1]
    if len(f1) != 1 or not _fused_spmm(program, f1[0], p_a, s0) or program[f1[0]][3][:2] != (g, av):
        return None
    ds0 = program[f1[0]][5][1]
    p_x, (xd, w1) = e0[4].get("pattern"), e0[3]
    f0 = readers.get(ds0, [])
    if (not isinstance(p_x, Pattern) or ds0 in results or len(f0) != 1
            or not _fused_spmm(program, f0[0], p_x, w1) or program[f0[0]][3][:2] != (ds0, xd)):
        return None
    # the check runs once its inputs exist, before anything a re-run could not undo (an optimizer step)
    inputs = [xd, w1, av, *([b1] if b1 is not None else []), *([m2] if m2 is not None else []), w2, zero]
    if any(producer.get(s) is None for s in inputs):
        return None
    check_at = max(producer[s] for s in inputs) + 1
    if any(p[0] == HOST and not p[2] for p in program[:check_at]):
        return None
    dtype = meta[w1][2]
    slots = [xd, w1, av, s0, s1, h1d, w2, z] + ([b1] if b1 is not None else [])
    if np.dtype(dtype) not in _FLOATS or any(np.dtype(meta[s][2]) != np.dtype(dtype) for s in slots):
        return None
    if (p_a.shape != (n, meta[s0][1][0]) or p_x.shape[0] != meta[s0][1][0] or len(meta[xd][1]) != 1
            or len(meta[av][1]) != 1):
        return None
    eps = float(np.finfo(dtype).eps)
    rx, ra = p_x.max_row_nnz(), p_a.max_row_nnz()
    if max(rx, ra) * eps > MAX_ROWS_EPS:
        return None
    n1 = np.unique(p_t.cols)
    if n1.shape[0] >= n:
        return None
    sub_a, _ = p_a.take_rows(n1)
    n2 = np.unique(sub_a.cols)
    sub_x, _ = p_x.take_rows(n2)
    if sub_x.nnz > MAX_SHARE * p_x.nnz:
        return None
    return {"n1": n1, "n2": n2, "xd": xd, "w1": w1, "av": av, "b1": b1, "m2": m2, "w2": w2, "zero": zero,
            "s0": s0, "ds0": ds0, "spmm0": spmm0, "spmm1": spmm1, "f1": f1[0], "f0": f0[0], "check_at": check_at,
            "inputs": tuple(inputs),
            "p_a": p_a, "p_x": p_x, "rx": rx, "ra": ra, "dtype": np.dtype(dtype)}


#: a gather of at least this share of a numpy array's values reads it through a boolean mask: on
#: Cora's features (62% of 49k float32 values, 535 runs) 18 us against 26 us for the positions; at
#: the graph's 34% (4.5k of 13k) the positions are faster (3.9 us against 6.0)
MASK_GATHER_SHARE = 0.5


def _gather_index(be: Any, positions: np.ndarray, size: int) -> np.ndarray:
    """The index that gathers ``positions`` (sorted, distinct) of a vector of ``size`` values on
    backend ``be``: the positions, or on a backend of numpy arrays, when they are many, the boolean
    mask of the same positions (the same values in the same order, read in one streaming pass)."""
    if size == 0 or positions.shape[0] < MASK_GATHER_SHARE * size:
        return positions
    if type(be.from_numpy(np.zeros(1))) is not np.ndarray:
        return positions
    mask = np.zeros(size, dtype=bool)
    mask[positions] = True
    mask.flags.writeable = False
    return mask


def _apply(program: list, meta: list, plan: dict) -> tuple[list, list]:
    p_x, p_a, n1, n2 = plan["p_x"], plan["p_a"], plan["n1"], plan["n2"]
    sub_x, pos_x = p_x.take_rows(n2)
    sub_a, pos_a = p_a.restrict(n1, n2)
    width = meta[plan["s0"]][1][1]

    def new_slot(be: Any, shape: tuple, dtype: Any) -> int:
        meta.append((be, shape, dtype))
        return len(meta) - 1

    xbe, _, xdtype = meta[plan["xd"]]
    abe, _, adtype = meta[plan["av"]]
    xs = new_slot(xbe, (pos_x.shape[0],), xdtype)
    as_ = new_slot(abe, (pos_a.shape[0],), adtype)
    sbe, _, sdtype = meta[plan["s0"]]
    meta[plan["s0"]] = (sbe, (n2.shape[0], width), sdtype)
    dbe, _, ddtype = meta[plan["ds0"]]
    meta[plan["ds0"]] = (dbe, (n2.shape[0], width), ddtype)
    e0 = program[plan["spmm0"]]
    program[plan["spmm0"]] = Kernel(KERNEL, e0[1], e0[2], (xs, plan["w1"]), {**e0[4], "pattern": sub_x}, e0[5],
                                    (n2.shape[0], width))
    e1 = program[plan["spmm1"]]
    program[plan["spmm1"]] = Kernel(KERNEL, e1[1], e1[2], (as_, plan["s0"]), {**e1[4], "pattern": sub_a}, e1[5],
                                    e1[6])
    f1 = program[plan["f1"]]
    program[plan["f1"]] = Fused(FUSED, f1[1], f1[2], (f1[3][0], as_, plan["s0"]), {**f1[4], "pattern": sub_a}, f1[5])
    f0 = program[plan["f0"]]
    program[plan["f0"]] = Fused(FUSED, f0[1], f0[2], (plan["ds0"], xs, plan["w1"]), {**f0[4], "pattern": sub_x},
                                f0[5])
    wbe = meta[plan["w1"]][0]
    bound = new_slot(wbe, (), plan["dtype"])
    inputs = plan["inputs"]
    attrs = {"rx": plan["rx"], "ra": plan["ra"], "bias": plan["b1"] is not None, "mask": plan["m2"] is not None,
             "limit": float(np.finfo(plan["dtype"]).max)}
    check = [Call(CALL, wbe, _two_hop_bound, attrs, _no_numbers, inputs, (bound,)), AssertFinite(ASSERT_FINITE, bound)]
    index_x = _gather_index(xbe, pos_x, meta[plan["xd"]][1][0])
    index_a = _gather_index(abe, pos_a, meta[plan["av"]][1][0])
    gathers = {plan["spmm0"]: Kernel(KERNEL, xbe, (Op.GETITEM, "dense"), (plan["xd"],), {"index": (index_x,)}, xs,
                                     (pos_x.shape[0],)),
               plan["spmm1"]: Kernel(KERNEL, abe, (Op.GETITEM, "dense"), (plan["av"],), {"index": (index_a,)}, as_,
                                     (pos_a.shape[0],))}
    out: list = []
    for k, e in enumerate(program):
        if e[0] == ASSERT_FINITE and e[1] == plan["av"]:
            continue  # the row gather's check of Â's values: the bound checks them too, before any step
        if k in gathers:
            out.append(gathers[k])
        if k == plan["check_at"]:
            out += check
        out.append(e)
    if plan["check_at"] == len(program):
        out += check
    return out, meta
