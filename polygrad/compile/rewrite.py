"""Program-to-program rewrites of a capture: each returns a program that gives the same bits."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.ops import Op
from ..sparse.pattern import Pattern
from .program import (ASSERT_FINITE, FUSED, HOST, KERNEL, AssertFinite, Fused, Kernel, _dataflow,
                      _result_slots, _same)


def _push_row_gathers(program: list, meta: list, spec: tuple) -> tuple[list, list]:
    """Compute only the rows a step reads of an SpMM's output.

    Semi-supervised node classification computes ``A @ (H W) + b`` for every node and then reads
    the rows of its training nodes (``logits[mask]``): on Cora 140 of 2708.  Where a captured step
    does exactly that -- an SpMM, optionally a row-vector add, then a gather of sorted, distinct
    rows, with no other use of the intermediates -- the replay multiplies only those rows of ``A``
    (``Pattern.take_rows``, cached per graph and rows) and, in the fused backward, ``dX = Aᵀ dY``
    from those rows' gradients alone instead of the scattered full one (which is zero elsewhere).
    The numbers are bit for bit the eager ones: each kept row is summed in the same order, and the
    skipped terms of the backward are exact zeros (``x + 0.0 == x`` for the accumulators, which
    start at +0.0), unless ``A`` holds an infinity or NaN (``inf * 0``): a check of ``A``'s values
    each replay makes such a replay a fault, and the call runs eagerly.
    """
    results = _result_slots(spec)
    program, meta = list(program), list(meta)
    done: set[int] = set()
    while True:
        readers, producer = _dataflow(program)
        for n, e in enumerate(program):
            if n in done or e[0] != KERNEL or e[2] != (Op.GETITEM, "dense"):
                continue
            plan = _row_gather_plan(program, meta, readers, producer, results, n)
            if plan is not None:
                program, meta, done = _apply_row_gather(program, meta, plan, done)
                break
        else:
            return program, meta


def _row_gather_plan(program: list, meta: list, readers: dict, producer: dict, results: set,
                     n: int) -> dict | None:
    e = program[n]
    index = e[4].get("index")
    if not (isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], np.ndarray)):
        return None
    rows = index[0]
    a = e[3][0]
    be, shape, dtype = meta[a]
    if len(shape) != 2 or rows.ndim != 1 or rows.dtype.kind not in "iu" or not 0 < 2 * rows.shape[0] <= shape[0]:
        return None
    if not (rows[0] >= 0 and rows[-1] < shape[0] and bool((rows[1:] > rows[:-1]).all())):
        return None  # sorted and distinct: each kept row, and the backward, keep eager's order
    if readers.get(a) != [n] or a in results:
        return None
    add = producer.get(a)
    s = a
    bias = None
    if add is not None and program[add][0] == KERNEL and program[add][2] == (Op.ADD, "dense"):
        s, bias = program[add][3]
        if meta[bias][1] != (shape[1],) or meta[s][1] != shape or readers.get(s) != [add] or s in results:
            return None
    else:
        add = None
    mm = producer.get(s)
    if mm is None or program[mm][0] != KERNEL or program[mm][2] != (Op.SPMM, "csr"):
        return None
    pattern = program[mm][4].get("pattern")
    if not isinstance(pattern, Pattern) or pattern.shape[0] != shape[0] or meta[s][1] != shape:
        return None
    values, x = program[mm][3]
    # after an optimizer step a replay cannot re-run eagerly, so the finiteness check the backward
    # rewrite needs could not fall back: there only the forward rows change, and only without a bias
    # (whose check below could not fall back either)
    stepped = any(p[0] == HOST and not p[2] for p in program[:mm])
    if add is not None and any(p[0] == HOST and not p[2] for p in program[:add]):
        return None  # the bias check sits at the add: a step between the SpMM and it counts too
    vjp = None if stepped else _scattered_spmm_backward(program, readers, index, shape, values, x, pattern)
    return {"getitem": n, "add": add, "bias": bias, "spmm": mm, "rows": rows,
            "pattern": pattern, "values": values, "x": x, "s": s, "a": a, "vjp": vjp}


def _scattered_spmm_backward(program: list, readers: dict, index: tuple, shape: tuple, values: int, x: int,
                             pattern: Pattern) -> tuple[int, int] | None:
    """(entry, slot of the gathered rows' gradient) of the fused SpMM backward that reads the
    gradient ``index_add`` scatters back from the gather, when there is one (and dA is not asked)."""
    found = None
    for f in program:
        if (f[0] == KERNEL and f[2] == (Op.INDEX_ADD, "dense") and f[4].get("shape") == shape
                and _same(f[4].get("index"), index)):
            for r in readers.get(f[5], []):
                g = program[r]
                if (g[0] == FUSED and g[2] == (Op.SPMM, "csr") and g[3] == (f[5], values, x)
                        and g[4].get("pattern") is pattern and not g[4].get("needs", (True,))[0]):
                    found = (r, f[3][0])
    return found


def _apply_row_gather(program: list, meta: list, plan: dict, done: set) -> tuple[list, list, set]:
    sub, positions = plan["pattern"].take_rows(plan["rows"])
    k, width = plan["rows"].shape[0], meta[plan["a"]][1][1]
    vbe, _, vdtype = meta[plan["values"]]
    sub_values = len(meta)
    meta.append((vbe, (positions.shape[0],), vdtype))
    mm = program[plan["spmm"]]
    be, _, dtype = meta[plan["s"]]
    meta[plan["s"]] = (be, (k, width), dtype)
    program[plan["spmm"]] = Kernel(KERNEL, mm[1], mm[2], (sub_values, plan["x"]), {**mm[4], "pattern": sub},
                             plan["s"], (k, width))
    if plan["add"] is not None:
        add = program[plan["add"]]
        abe, _, adtype = meta[plan["a"]]  # the sum's own dtype (a float64 bias promotes)
        meta[plan["a"]] = (abe, (k, width), adtype)
        program[plan["add"]] = add._replace(shape=(k, width))
    g = program[plan["getitem"]]  # the gather is now the identity: a view, for the slot's readers
    program[plan["getitem"]] = Kernel(KERNEL, g[1], (Op.RESHAPE, "dense"), (plan["a"],), {"shape": (k, width)},
                                g[5], (k, width))
    before: list[tuple] = [Kernel(KERNEL, vbe, (Op.GETITEM, "dense"), (plan["values"],), {"index": (positions,)},
                            sub_values, (positions.shape[0],))]
    if plan["vjp"] is not None:
        r, grad_rows = plan["vjp"]
        f = program[r]
        program[r] = Fused(FUSED, f[1], f[2], (grad_rows, sub_values, plan["x"]), {**f[4], "pattern": sub}, f[5])
        before.insert(0, AssertFinite(ASSERT_FINITE, plan["values"]))  # inf * 0 in the skipped terms: eager's NaN
    at = plan["spmm"]
    program = program[:at] + before + program[at:]
    shifted = {i + len(before) if i >= at else i for i in done}
    getitem = plan["getitem"] + len(before)
    if plan["bias"] is not None:
        # NaN + NaN keeps one operand's NaN, and which one numpy's add keeps can differ with the
        # array's length (vector body or scalar tail): with a finite bias the sum's NaN is the
        # product's at any length, as in eager's sum over all rows
        add = plan["add"] + len(before)
        program.insert(add, AssertFinite(ASSERT_FINITE, plan["bias"]))
        shifted = {i + 1 if i >= add else i for i in shifted}
        getitem += 1
    return program, meta, shifted | {getitem}


def _all_finite(array: Any) -> bool:
    if type(array) is np.ndarray:  # the common case, without the namespace lookup (a check per replay)
        if array.ndim == 0 and array.dtype.kind == "f":
            return math.isfinite(float(array))
        return bool(np.isfinite(array).all())
    if isinstance(array, np.ndarray) or hasattr(array, "__array_namespace__"):
        xp = array.__array_namespace__() if hasattr(array, "__array_namespace__") else np
        return bool(xp.isfinite(array).all())
    return bool(((array - array) == 0).all())  # any array type: x - x is 0 exactly when x is finite
