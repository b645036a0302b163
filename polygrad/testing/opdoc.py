"""The op reference for backend authors, ``docs/ops.md``, generated from the op table.

    python -m polygrad.testing.opdoc            # rewrite docs/ops.md
    python -m polygrad.testing.opdoc --check    # exit 1 when docs/ops.md is stale

For every primitive in :class:`polygrad.ir.ops.Op` the page gives what a kernel receives (its array
inputs and its keyword attributes, with their Python types), what it must return (the output
shape and dtype rule, which dispatch checks), and the edge cases the conformance kit tests.  The
prose lives in :data:`SPECS` below, one entry per op (rendering refuses an op without one, so a
new op cannot go undocumented); the groups, differentiability and layouts come
from ``polygrad.ir.ops``; and every worked example is *computed* by the scalar reference -- the
definition of each op -- with its output shape and dtype from ``polygrad.engine.inference``, so the
examples cannot drift from what polygrad does.  ``tests/unit/test_opdoc.py`` fails when the
committed page differs from what this module renders.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from polygrad.engine import reference
from polygrad.engine.inference import infer
from polygrad.ir.ops import BINARY, COMPARE, MOVEMENT, NON_DIFFERENTIABLE, REDUCE, SPARSE, UNARY, Op, list_ops
from polygrad.sparse.pattern import Pattern

__all__ = ["SPECS", "OpSpec", "Example", "render", "main", "undocumented"]

DOC_PATH = Path("docs") / "ops.md"


@dataclass(frozen=True)
class Example:
    """A worked example: array inputs and attrs; the output is computed when the page renders."""
    note: str
    inputs: tuple
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpSpec:
    summary: str
    inputs: str                      # the positional array inputs of the kernel
    attrs: tuple = ()                # (name, python type, meaning)
    output: str = ""                 # shape and dtype rule
    edges: tuple = ()                # edge cases, one sentence each
    examples: tuple = ()


def _pattern(shape: tuple[int, int], rows: Sequence[Sequence[int]]) -> Pattern:
    """A canonical pattern from the sorted column lists of each row (as the constructors make)."""
    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    cols = np.array([c for r in rows for c in r], dtype=np.int64)
    indptr.flags.writeable = cols.flags.writeable = False
    return Pattern(shape, indptr, cols, "csr")


_A = _pattern((3, 3), [[0, 2], [], [1]])  # row 1 is empty
_F = np.float64
_ELEMENTWISE_EDGES = ("Operands of different shapes broadcast with numpy's rules; the kernel receives "
                      "them un-broadcast.",)
_PATTERN_ATTR = ("pattern", "polygrad.sparse.pattern.Pattern",
                 "the sparse structure: `shape` (rows, cols), `indptr` int64[rows+1], `rows` and `cols` "
                 "int64[nnz] in canonical row-major order (sorted, no duplicates), `layout` ('csr' or 'coo', "
                 "a label: both share this storage), `pattern.on(key, convert)` caches converted copies per "
                 "backend. The arrays are read-only and shared: never write into them, and copy before "
                 "handing them to a library that requires writeable memory")

SPECS: dict[Op, OpSpec] = {
    Op.NEG: OpSpec("`-x`", "x", output="shape and dtype of x",
                   edges=("Not defined for bool (DTypeError before any kernel).", "-0.0 for 0.0 (IEEE)."),
                   examples=(Example("ints stay ints", (np.array([1, -2, 0]),)),)),
    Op.EXP: OpSpec("`e ** x`", "x (floating)", output="shape and dtype of x",
                   edges=("Integer inputs are cast to the default float before the op (by Tensor.exp).",
                          "Overflow gives inf, never an exception."),
                   examples=(Example("overflow and -inf", (np.array([0.0, 1000.0, -np.inf]),)),)),
    Op.EXPM1: OpSpec("`e ** x - 1`, without the cancellation of `exp(x) - 1` near 0", "x (floating)",
                     output="shape and dtype of x",
                     edges=("expm1(-0.0) = -0.0 and expm1(-inf) = -1; overflow gives inf, never an exception.",
                            "Gradient `exp(x)`: PyTorch's is `expm1(x) + 1`, which rounds where exp(x) does not."),
                     examples=(Example("tiny, signed zero, overflow and -inf",
                                       (np.array([-1e-10, -0.0, 1000.0, -np.inf]),)),)),
    Op.LOG: OpSpec("Natural logarithm", "x (floating)", output="shape and dtype of x",
                   edges=("log(0) = -inf and log(x < 0) = nan, as IEEE/numpy; never an exception.",),
                   examples=(Example("0 and negatives", (np.array([1.0, 0.0, -1.0]),)),)),
    Op.RELU: OpSpec("`max(x, 0)`", "x", output="shape and dtype of x",
                    edges=("Gradient at exactly 0 is 0 (micrograd's and PyTorch's convention).",
                           "Not defined for bool.",
                           "0.0 for a negative input, -inf included; NaN passes through. -0.0 gives -0.0 on the "
                           "reference and in PyTorch, +0.0 from numpy's maximum (the sign of zero is "
                           "backend-defined)."),
                    examples=(Example("negative, zero, positive", (np.array([-1.5, 0.0, 2.0]),)),)),
    Op.TANH: OpSpec("Hyperbolic tangent", "x (floating)", output="shape and dtype of x",
                    examples=(Example("saturates without overflow", (np.array([0.0, 1000.0, -1000.0]),)),)),
    Op.RECIPROCAL: OpSpec("`1 / x`", "x (floating)", output="shape and dtype of x",
                          edges=("1/0 = inf, 1/-0.0 = -inf (IEEE), never ZeroDivisionError.",),
                          examples=(Example("signed zeros", (np.array([2.0, 0.0, -0.0]),)),)),
    Op.CAST: OpSpec("Convert to another dtype", "x",
                    attrs=(("dtype", "numpy.dtype", "the target dtype (float32, float64, int32, int64, bool)"),),
                    output="shape of x, dtype `dtype`",
                    edges=("Float to int truncates toward zero (numpy's astype); to bool is `x != 0`.",),
                    examples=(Example("float to int64 truncates", (np.array([1.7, -1.7, 0.0]),),
                                      {"dtype": np.dtype("int64")}),
                              Example("to bool", (np.array([0.0, -2.0]),), {"dtype": np.dtype("bool")}))),
    Op.ADD: OpSpec("`a + b`", "a, b", output="broadcast shape; promoted dtype (numpy's rules on the two dtypes)",
                   edges=_ELEMENTWISE_EDGES + ("bool + bool is a DTypeError.",),
                   examples=(Example("broadcasting a row", (np.array([[1.0], [2.0]]), np.array([10.0, 20.0]))),)),
    Op.MUL: OpSpec("`a * b`", "a, b", output="broadcast shape; promoted dtype (bool * bool is allowed: logical and)",
                   edges=_ELEMENTWISE_EDGES + ("0 * inf = nan.",),
                   examples=(Example("0 * inf", (np.array([0.0, 2.0]), np.array([np.inf, 3.0]))),)),
    Op.POW: OpSpec("`a ** b`", "a, b",
                   output="broadcast shape; promoted dtype, which must be floating (two int operands are "
                          "cast to float by the Tensor API first)",
                   edges=_ELEMENTWISE_EDGES + (
                       "0 ** -1 = inf; a negative base with a fractional exponent gives nan (not complex).",
                       "The gradient w.r.t. b is `a**b * log(a)`: defined for a > 0, 0 for a == 0 and b > 0, "
                       "nan otherwise."),
                   examples=(Example("IEEE results", (np.array([0.0, -8.0, 2.0]), np.array([-1.0, 0.5, 10.0]))),)),
    Op.MAXIMUM: OpSpec("Elementwise `max(a, b)`", "a, b", output="broadcast shape; promoted dtype",
                       edges=_ELEMENTWISE_EDGES + (
                           "NaN in either operand gives NaN (numpy's maximum, not fmax).",
                           "On a tie the gradient is split 0.5 / 0.5 between a and b."),
                       examples=(Example("NaN propagates",
                                         (np.array([1.0, np.nan, 3.0]), np.array([2.0, 0.0, 3.0]))),)),
    **{op: OpSpec(f"Elementwise comparison `{sym}`", "a, b", output="broadcast shape; dtype bool",
                  edges=_ELEMENTWISE_EDGES + ("No gradient: the output never requires grad.",
                                              "Comparisons with NaN are False, except `ne` which is True."),
                  examples=(Example("with NaN", (np.array([1.0, np.nan]), np.array([1.0, np.nan]))),))
       for op, sym in ((Op.LT, "<"), (Op.LE, "<="), (Op.GT, ">"), (Op.GE, ">="), (Op.EQ, "=="), (Op.NE, "!="))},
    Op.WHERE: OpSpec("Elementwise `a if cond else b`", "cond (bool), a, b",
                     output="broadcast shape of all three; promoted dtype of a and b",
                     edges=("cond must be bool (DTypeError otherwise).",
                            "Gradient flows to a where cond is True and to b where it is False; none to cond."),
                     examples=(Example("broadcast scalar branch", (np.array([True, False, True]),
                                                                   np.array([1.0, 2.0, 3.0]), np.array(0.0))),)),
    Op.SUM: OpSpec("Sum over axes", "x",
                   attrs=(("axes", "tuple[int, ...]", "the axes to reduce: sorted, non-negative, distinct; may be "
                           "empty, which means *no* reduction (not 'all axes')"),
                          ("keepdims", "bool", "keep reduced axes as size 1")),
                   output="x's shape without the reduced axes (or with them as 1 when keepdims); dtype of x "
                          "for floats, int64 for bool and signed ints, uint64 for unsigned",
                   edges=("A sum over an empty axis is 0.",
                          "`axes=()` returns x unchanged (a copy is not required)."),
                   examples=(Example("axes=() is no reduction", (np.array([[1, 2], [3, 4]]),),
                                     {"axes": (), "keepdims": False}),
                             Example("empty axis sums to 0", (np.zeros((2, 0)),), {"axes": (1,), "keepdims": True}),
                             Example("bool counts as int64", (np.array([True, True, False]),),
                                     {"axes": (0,), "keepdims": False}))),
    Op.MAX: OpSpec("Maximum over axes", "x",
                   attrs=(("axes", "tuple[int, ...]", "as for sum; empty means no reduction"),
                          ("keepdims", "bool", "keep reduced axes as size 1")),
                   output="as sum's shape; dtype of x",
                   edges=("A max over an empty axis has no identity: ShapeError before any kernel.",
                          "NaN anywhere in a group gives NaN.",
                          "Ties share the gradient equally among the maximal elements."),
                   examples=(Example("per row", (np.array([[1.0, 5.0], [7.0, -1.0]]),),
                                     {"axes": (1,), "keepdims": False}),
                             Example("empty axis is an error", (np.zeros((2, 0)),),
                                     {"axes": (1,), "keepdims": False}))),
    Op.RESHAPE: OpSpec("Same elements, row-major, new shape", "x",
                       attrs=(("shape", "tuple[int, ...]", "the target shape, fully resolved (no -1)"),),
                       output="`shape`; dtype of x",
                       edges=("The element count must match (ShapeError otherwise).",
                              "Zero-size shapes are valid: (0, 3) to (3, 0)."),
                       examples=(Example("to a column", (np.array([1, 2, 3]),), {"shape": (3, 1)}),)),
    Op.PERMUTE: OpSpec("Reorder axes (numpy transpose)", "x",
                       attrs=(("perm", "tuple[int, ...]", "a permutation of range(x.ndim), non-negative"),),
                       output="x.shape permuted; dtype of x",
                       examples=(Example("transpose", (np.array([[1, 2, 3], [4, 5, 6]]),), {"perm": (1, 0)}),)),
    Op.EXPAND: OpSpec("Broadcast to a larger shape", "x",
                      attrs=(("shape", "tuple[int, ...]", "the target; x must broadcast to it"),),
                      output="`shape`; dtype of x",
                      edges=("The result may be a read-only broadcast view; the gradient sums over the "
                             "broadcast axes.",),
                      examples=(Example("row to matrix", (np.array([1.0, 2.0]),), {"shape": (2, 2)}),)),
    Op.GETITEM: OpSpec("Numpy basic and advanced indexing, `x[index]`", "x",
                       attrs=(("index", "tuple", "already normalised by polygrad; each item is one of: an int "
                               "(may be negative: counts from the end), a slice (any start/stop/step, negative "
                               "step reverses), None (new axis), Ellipsis, or an int64 numpy array (may hold "
                               "negative indices; boolean masks arrive converted to such arrays by "
                               "np.nonzero). Index arrays may be the user's own or read-only: never write "
                               "into them"),),
                       output="the shape numpy gives for `x[index]`; dtype of x",
                       edges=("Out-of-range indices are an IndexOutOfRangeError before any kernel.",
                              "Repeated indices gather repeatedly; their gradients accumulate."),
                       examples=(Example("negative int", (np.array([10, 20, 30]),), {"index": (-1,)}),
                                 Example("reversed slice", (np.array([10, 20, 30]),),
                                         {"index": (slice(None, None, -1),)}),
                                 Example("int64 array with a negative and a repeat", (np.array([10, 20, 30]),),
                                         {"index": (np.array([-1, 0, 0]),)}),
                                 Example("None and Ellipsis", (np.array([[1, 2], [3, 4]]),),
                                         {"index": (Ellipsis, None, 0)}))),
    Op.INDEX_ADD: OpSpec("`zeros(shape)` with `src` added at `index` (scatter-add)", "src",
                         attrs=(("index", "tuple", "the same forms as getitem's index, selecting positions of "
                                 "the *target*"),
                                ("shape", "tuple[int, ...]", "the shape of the output (the target)")),
                         output="`shape`; dtype of src",
                         edges=("Repeated positions accumulate (unlike numpy's `a[idx] += src`): use "
                                "np.add.at or an equivalent.",
                                "src broadcasts to the selection's shape (`zeros(shape)[index].shape`).",
                                "Positions no index reaches are 0."),
                         examples=(Example("repeats accumulate", (np.array([1.0, 2.0, 3.0]),),
                                           {"index": (np.array([0, 2, 0]),), "shape": (4,)}),)),
    Op.CONCAT: OpSpec("Join along an existing axis", "x0, x1, ... (two or more)",
                      attrs=(("axis", "int", "non-negative axis to join along"),),
                      output="shapes equal except on `axis`, whose sizes add; dtype promoted over all inputs",
                      edges=("Zero-size inputs are valid and contribute nothing.",
                             "A single input never reaches the kernel (returned as is)."),
                      examples=(Example("with an empty part", (np.array([[1, 2]]), np.zeros((0, 2), dtype=np.int64),
                                                               np.array([[3, 4]])), {"axis": 0}),)),
    Op.MATMUL: OpSpec("Matrix product (numpy matmul)", "a, b",
                      output="numpy matmul's shape (1-D operands are promoted and the added axis removed; "
                             "batch axes broadcast); promoted dtype; not defined for bool",
                      edges=("An inner dimension of 0 gives zeros.", "Both operands are at least 1-D."),
                      examples=(Example("vector @ matrix", (np.array([1.0, 2.0]), np.array([[1.0, 0.0], [0.0, 3.0]]))),
                                Example("inner dimension 0", (np.zeros((2, 0)), np.zeros((0, 2)))))),
    Op.ADDMM: OpSpec("`mat1 @ mat2 + input` (PyTorch's addmm; nn.Linear's `x @ W + b`)", "input, mat1, mat2",
                     output="the product's shape (input broadcasts to it); the operands' one dtype",
                     edges=("Must give the bits of `add(matmul(mat1, mat2), input)`, the composite it fuses: "
                            "`backends/addmm_kernels.py` builds such a kernel from a backend's own.",
                            "Operands of different dtypes are a DTypeError (the front end runs the composite)."),
                     examples=(Example("bias row", (np.array([1.0, -1.0]), np.array([[1.0, 2.0]]),
                                                    np.array([[1.0, 0.0], [0.0, 1.0]]))),)),
    Op.ADDCMUL: OpSpec("`input + tensor1 * tensor2` (PyTorch's addcmul; GINConv's `out + x * (1 + eps)`)",
                       "input, tensor1, tensor2",
                       output="the product's shape (the factors broadcast; input broadcasts to the product); "
                              "the operands' one dtype",
                       edges=("Must give the bits of `add(input, mul(tensor1, tensor2))`, the composite it fuses: "
                              "`backends/addcmul_kernels.py` builds such a kernel from a backend's own.",
                              "Operands of different dtypes are a DTypeError (the front end runs the composite)."),
                       examples=(Example("scale by a one-element factor", (np.array([1.0, 2.0]), np.array([3.0, 4.0]),
                                                                           np.array([0.5]))),)),
    Op.CROSS_ENTROPY: OpSpec(
        "Softmax cross-entropy at integer classes: `-log_softmax(x)[i, target[i]]`, reduced", "x (floating, [N, C])",
        attrs=(("target", "int64 numpy array [N]",
                "each row's class, in [0, C); the user's array: never write into it"),
               ("reduction", "str", '"mean", "sum" or "none"')),
        output='() for "mean" and "sum", [N] for "none"; dtype of x',
        edges=("Must give the bits of pg.cross_entropy's composite: each row shifted by its max (0 where the max "
               "is not finite), `shifted - log(sum(exp(shifted)))` gathered and negated, then summed (times "
               "1/N for mean). `backends/cross_entropy_kernels.py` builds such a kernel from a backend's own.",
               "A kernel that serves only some arrays with those bits (a distributed backend's logits in "
               "its own blocks) sets `kernel.accepts = predicate`: pg.cross_entropy runs the composite "
               "for the arrays it refuses.",
               "No rows: mean is NaN, sum is 0."),
        examples=(Example("mean over two rows", (np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]),),
                          {"target": np.array([1, 0]), "reduction": "mean"}),)),
    Op.SOFT_CROSS_ENTROPY: OpSpec(
        "Softmax cross-entropy at class probabilities: `-sum_j log_softmax(x)[i, j] * probs[i, j]`, reduced",
        "x (floating, [N, C]), probs (x's shape and dtype)",
        attrs=(("reduction", "str", '"mean", "sum" or "none"'),),
        output='() for "mean" and "sum", [N] for "none"; dtype of x',
        edges=("Must give the bits of pg.cross_entropy's composite at probability targets: `log_softmax(x)` "
               "(each row shifted by its max), times probs, each row's sum negated, then summed (times 1/N for "
               "mean); gradients for both inputs. `backends/cross_entropy_kernels.py` builds such a kernel from "
               "a backend's own.",
               "A kernel that serves only some arrays with those bits sets `kernel.accepts = predicate` "
               "(called with the logits and the probabilities), as for cross_entropy.",
               "Probabilities are taken as given (rows need not sum to one, as in PyTorch). No rows: mean is NaN, "
               "sum is 0."),
        examples=(Example("mean over two rows", (np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]),
                                                 np.array([[0.0, 1.0, 0.0], [0.5, 0.25, 0.25]])),
                          {"reduction": "mean"}),)),
    Op.SPMM: OpSpec("Sparse @ dense: `A @ X` with `A = (pattern, values)`", "values (1-D, nnz), x (1-D or 2-D)",
                    attrs=(_PATTERN_ATTR,),
                    output="(pattern rows,) + x.shape[1:]; promoted dtype of values and x",
                    edges=("Rows with no nonzeros give 0.", "x has pattern-cols rows.",
                           "The gradient w.r.t. values is an SDDMM (nnz numbers), never a dense matrix."),
                    examples=(Example("row 1 empty", (np.array([1.0, 2.0, 3.0]), np.array([[1.0], [10.0], [100.0]])),
                                      {"pattern": _A}),)),
    Op.SDDMM: OpSpec("`P @ Q.T` sampled at the pattern's nonzeros", "p (rows x F), q (cols x F)",
                     attrs=(_PATTERN_ATTR,),
                     output="(nnz,) in the pattern's canonical order; promoted dtype of p and q",
                     edges=("F = 0 gives zeros.", "Never forms the dense rows x cols product."),
                     examples=(Example("three nonzeros", (np.array([[1.0], [2.0], [3.0]]),
                                                          np.array([[10.0], [20.0], [30.0]])), {"pattern": _A}),)),
    Op.SEGMENT_SUM: OpSpec("Row sums of the sparse matrix `(pattern, values)`", "values (1-D, nnz)",
                           attrs=(_PATTERN_ATTR,), output="(pattern rows,); dtype of values",
                           edges=("Empty rows give 0.", "Deterministic: rows are reduced in order (no atomics)."),
                           examples=(Example("row 1 empty", (np.array([1.0, 2.0, 3.0]),), {"pattern": _A}),)),
    Op.SEGMENT_MAX: OpSpec("Row maxima over the stored entries", "values (1-D, nnz)",
                           attrs=(_PATTERN_ATTR,), output="(pattern rows,); dtype of values",
                           edges=("Empty rows give 0 (not -inf).", "No gradient (used as a detached shift)."),
                           examples=(Example("row 1 empty", (np.array([-1.0, -2.0, -3.0]),), {"pattern": _A}),)),
}



def undocumented() -> list[str]:
    """The ops without a SPECS entry (rendering the page refuses them; importing this module does
    not, so a new op under construction never breaks test collection)."""
    return sorted(op.value for op in set(Op) - set(SPECS))


def _group(op: Op) -> str:
    for name, members in (("unary elementwise", UNARY), ("binary elementwise", BINARY),
                          ("comparison", COMPARE), ("reduction", REDUCE), ("movement", MOVEMENT),
                          ("sparse", SPARSE)):
        if op in members:
            return name
    if op in (Op.CROSS_ENTROPY, Op.SOFT_CROSS_ENTROPY):
        return "loss"
    if op == Op.ADDMM:
        return "linear algebra (fused)"
    if op == Op.ADDCMUL:
        return "ternary elementwise (fused)"
    return "ternary elementwise" if op == Op.WHERE else "linear algebra"


def _fmt(x: Any) -> str:
    """An attribute value as the kernel receives it, readably."""
    if isinstance(x, np.ndarray):
        return _array_text(x)
    if isinstance(x, Pattern):
        return f"Pattern{x.shape} rows {[x.cols[x.indptr[r]:x.indptr[r + 1]].tolist() for r in range(x.shape[0])]}"
    if isinstance(x, np.dtype):
        return f"numpy.dtype('{x}')"
    if isinstance(x, tuple):
        return "(" + ", ".join(_fmt(v) for v in x) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, slice):
        return "slice(" + ", ".join(repr(v) for v in (x.start, x.stop, x.step)) + ")"
    if x is Ellipsis:
        return "Ellipsis"
    return repr(x)


def _array_text(a: np.ndarray) -> str:
    """Nested lists of Python scalars (``repr`` is stable across numpy versions, array2string is not)."""
    if a.size == 0:
        return f"[] (shape {a.shape})"
    return repr(a.tolist())


def _example_line(op: Op, ex: Example) -> str:
    args = ", ".join(_array_text(np.asarray(a)) for a in ex.inputs)
    attrs = ", ".join(f"{k}={_fmt(v)}" for k, v in ex.attrs.items())
    call = f"{op.value}({args}{', ' if attrs else ''}{attrs})"
    arrays = [np.asarray(a) for a in ex.inputs]
    try:
        shape, dtype = infer(op, tuple(a.shape for a in arrays), tuple(a.dtype for a in arrays), ex.attrs)
    except Exception as exc:  # noqa: BLE001 - documented: the error polygrad raises before any kernel
        return f"- {ex.note}: `{call}` raises `{type(exc).__name__}`: {exc}"
    flats = [(a.ravel().tolist(), a.shape) for a in arrays]
    items, out_shape = reference.run(op, flats, ex.attrs)
    with np.errstate(all="ignore"):
        out = np.array(reference.data_of(items), dtype=dtype).reshape(out_shape)
    assert tuple(out.shape) == tuple(shape), (op, out.shape, shape)
    return f"- {ex.note}: `{call}` → `{_array_text(out)}` ({dtype}, shape {tuple(shape)})"


def render() -> str:
    """The whole page, deterministic."""
    if undocumented():  # a new op must be documented before the page can be rendered
        raise KeyError(f"polygrad.testing.opdoc: no SPECS entry for ops {undocumented()}: add one to SPECS")
    ops = [Op(name) for name in list_ops()]
    out = [
        "# Op reference for backend authors",
        "",
        "<!-- generated by `python -m polygrad.testing.opdoc` from polygrad/testing/opdoc.py and the op "
        "table; do not edit by hand (tests/unit/test_opdoc.py fails when this page is stale) -->",
        "",
        "A backend supplies *forward kernels* keyed by `(op, layout)` (see "
        "[writing-a-backend.md](writing-a-backend.md)). A kernel is called as "
        "`kernel(*input_arrays, **attrs)` with the backend's own arrays and the attributes listed here, "
        "and returns one array. polygrad validates shapes and dtypes *before* calling it (so a kernel "
        "never sees operands the op rejects) and checks the result's shape and dtype *after* it against "
        "the rule given for each op. Gradients need no kernel: every op's VJP is written in polygrad ops.",
        "",
        "Every example below is computed by the scalar reference (`polygrad/engine/reference.py`), the "
        "definition the conformance kit (`polygrad check NAME`) compares a backend with.",
        "",
        "Conventions for all ops: float math follows IEEE-754 (inf and nan results, never exceptions); "
        "dtypes are numpy dtypes (`Backend.dtype()` must return a `numpy.dtype`); attributes are plain "
        "Python or numpy values and never backend arrays; a kernel must not modify its inputs or attrs.",
        "",
        "| op | group | inputs | attrs | layouts | gradient |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for op in ops:
        spec = SPECS[op]
        attrs = ", ".join(f"`{a[0]}`" for a in spec.attrs) or "-"
        layouts = "csr, coo" if op in SPARSE else "dense"
        grad = "none" if op in NON_DIFFERENTIABLE else "yes"
        out.append(f"| [`{op.value}`](#{op.value}) | {_group(op)} | {spec.inputs} | {attrs} | {layouts} | {grad} |")
    for op in ops:
        spec = SPECS[op]
        out += ["", f"## {op.value}", "", f"{spec.summary}.", "",
                f"- **inputs**: {spec.inputs}"]
        for name, typ, meaning in spec.attrs:
            out.append(f"- **attr `{name}`** (`{typ}`): {meaning}")
        out.append(f"- **output**: {spec.output}")
        layouts = "csr and coo (the same canonical pattern; `layout` is a label)" if op in SPARSE else "dense"
        out.append(f"- **layouts**: {layouts}")
        out.append("- **gradient**: " + ("none (the output never requires grad)" if op in NON_DIFFERENTIABLE
                                         else "from the rule in `polygrad/engine/grad_rules.py`; no kernel needed"))
        if spec.edges:
            out += ["", "Edge cases:", ""] + [f"- {e}" for e in spec.edges]
        if spec.examples:
            out += ["", "Examples:", ""] + [_example_line(op, ex) for ex in spec.examples]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polygrad.testing.opdoc", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs instead of writing it")
    p.add_argument("--path", type=Path, default=DOC_PATH, help=f"the page (default {DOC_PATH})")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            print(f"{args.path} is stale: run `python -m polygrad.testing.opdoc`", file=sys.stderr)
            return 1
        return 0
    if not args.path.parent.is_dir():
        print(f"{args.path.parent}/ does not exist: run this from the source checkout's root", file=sys.stderr)
        return 2
    args.path.write_text(text, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
