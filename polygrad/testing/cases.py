"""The catalogue of test cases for every primitive op: small float64 inputs, valid and invalid.

One place that says "here is how to exercise op X": the conformance kit runs every case on a
backend, and other tests (fuzzing, fallback, fault injection) can reuse them::

    from polygrad.testing.cases import cases, bad_cases
    for case in cases(op="spmm", layout="csr"):
        out = case.run(backend="numpy")          # the primitive, through dispatch

Inputs are plain numpy arrays (float64 unless the op needs ints or bools) chosen so central
differences are well defined: no relu input near 0, no near-ties in maximum/max, positive bases
for pow and log.  They cover broadcasting, size-1 dims, 0-d tensors and empty tensors where the
op allows them.  Sparse ops get a :class:`~polygrad.sparse.pattern.Pattern` built from a small random
CSR matrix that has an empty row (the kit depends on nothing else of the sparse API).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..engine.dispatch import apply
from ..ir.errors import DTypeError, IndexOutOfRangeError, PolygradError, ShapeError
from ..ir.ops import BINARY, COMPARE, FLOAT_UNARY, NON_DIFFERENTIABLE, Op
from ..sparse.pattern import Pattern
from ..tensor import tensor

#: the layouts the catalogue knows how to build cases for
LAYOUTS = ("dense", "csr", "coo")
_SPARSE_LAYOUTS = ("csr", "coo")


@dataclass(eq=False)
class Case:
    """One valid application of a primitive op.

    ``grad[i]`` says whether input ``i`` is differentiated in gradient checks (only floating
    inputs can be; the default, ``()``, is every floating input of a differentiable op).
    ``float32``: whether a float32 variant (floating inputs cast to float32) is meaningful.
    """
    op: Op
    name: str
    inputs: tuple[np.ndarray, ...]
    attrs: dict = field(default_factory=dict)
    layout: str = "dense"
    grad: tuple[bool, ...] = ()
    float32: bool = True
    #: a long-row sparse case: the float32 check bounds each output by the error a float32 sum of
    #: its row may make, ``(nnz of the row + 2) * eps32 * sum |terms|``, against float64
    accumulate: bool = False

    def __post_init__(self) -> None:
        self.inputs = tuple(np.asarray(a) for a in self.inputs)
        if not self.grad:  # a case always has inputs: empty means the default
            diff = self.op not in NON_DIFFERENTIABLE
            self.grad = tuple(diff and a.dtype.kind == "f" for a in self.inputs)

    @property
    def id(self) -> str:
        """Stable, readable identifier, e.g. ``spmm[csr]-vector``."""
        return f"{self.op.value}[{self.layout}]-{self.name}"

    @property
    def differentiable(self) -> bool:
        return any(self.grad)

    def with_dtype(self, dtype: Any) -> "Case":
        """The same case with every floating input cast to ``dtype``."""
        inputs = tuple(a.astype(dtype) if a.dtype.kind == "f" else a for a in self.inputs)
        return Case(self.op, f"{self.name}-{np.dtype(dtype).name}", inputs, self.attrs, self.layout,
                    self.grad, self.float32, self.accumulate)

    def tensors(self, backend: Any = None, requires_grad: bool = False) -> tuple:
        """The inputs as polygrad tensors on ``backend`` (``requires_grad`` per ``self.grad``)."""
        return tuple(tensor(a, backend=backend, requires_grad=requires_grad and g)
                     for a, g in zip(self.inputs, self.grad))

    def run(self, backend: Any = None, requires_grad: bool = False):
        """Apply the primitive to the inputs on ``backend`` through dispatch; returns the tensor."""
        return apply(self.op, self.tensors(backend, requires_grad), self.attrs, self.layout)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a.shape}:{a.dtype}" for a in self.inputs)
        return f"Case({self.id}: {shapes})"


@dataclass(eq=False)
class BadCase:
    """An invalid application: inference must raise ``error`` before any kernel runs."""
    op: Op
    name: str
    inputs: tuple[np.ndarray, ...]
    attrs: dict = field(default_factory=dict)
    layout: str = "dense"
    error: type[PolygradError] = ShapeError

    def __post_init__(self) -> None:
        self.inputs = tuple(np.asarray(a) for a in self.inputs)

    @property
    def id(self) -> str:
        return f"{self.op.value}[{self.layout}]-{self.name}"

    def __repr__(self) -> str:
        shapes = ", ".join(f"{a.shape}:{a.dtype}" for a in self.inputs)
        return f"BadCase({self.id}: {shapes} -> {self.error.__name__})"


# -- input generators (deterministic: one seed per call site) -------------------------------------

def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(shape: tuple, seed: int) -> np.ndarray:
    return _rng(seed).normal(size=shape)


def _unit_interval(shape: tuple, seed: int) -> np.ndarray:
    return _rng(seed).uniform(0.2, 0.9, size=shape)


def _positive(shape: tuple, seed: int) -> np.ndarray:
    return _rng(seed).uniform(0.5, 2.0, size=shape)


def _away_from_zero(shape: tuple, seed: int) -> np.ndarray:
    """Values with |x| in [0.2, 1.5]: relu and friends are smooth within finite-difference reach."""
    r = _rng(seed)
    return r.choice([-1.0, 1.0], size=shape) * r.uniform(0.2, 1.5, size=shape)


def _distinct(shape: tuple, seed: int) -> np.ndarray:
    """Values at least 0.05 apart (a shuffled grid plus small jitter): no ties, no near-ties."""
    n = int(np.prod(shape, dtype=np.int64))
    r = _rng(seed)
    grid = np.linspace(-2.0, 2.0, max(n, 1))[:n] + r.uniform(-0.01, 0.01, size=n)
    return r.permutation(grid).reshape(shape)


def _separated_pair(sa: tuple, sb: tuple, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays whose broadcast elementwise differences are all at least 0.05 in magnitude."""
    for s in range(seed, seed + 1000):
        a, b = _normal(sa, s), _normal(sb, s + 7919)
        diff = np.abs(np.subtract(a, b)) if a.size and b.size else np.ones(1)
        if diff.size == 0 or diff.min() >= 0.05:
            return a, b
    raise RuntimeError("could not draw separated inputs")  # pragma: no cover - 1000 draws suffice


@lru_cache(maxsize=None)
def sample_pattern(nrows: int = 4, ncols: int = 5, density: float = 0.4, seed: int = 0,
                   empty_row: int | None = 1) -> Pattern:
    """A small random canonical CSR pattern (row ``empty_row`` forced empty), ``layout="csr"``.

    Cached so every case of a run shares one Pattern object (and its cached transpose).
    """
    r = _rng(seed)
    mask = r.random((nrows, ncols)) < density
    if empty_row is not None and nrows:
        mask[empty_row % nrows] = False
    rows, cols = np.nonzero(mask)  # row-major: canonical order
    return Pattern.from_sorted((nrows, ncols), rows, cols)


def _patterns() -> dict[str, Pattern]:
    return {"small": sample_pattern(), "wide": sample_pattern(3, 7, 0.5, seed=3, empty_row=None),
            "empty": sample_pattern(3, 2, 0.0, seed=0, empty_row=None)}


# -- the catalogue -----------------------------------------------------------------------------------

def _ix(*items) -> tuple:
    """An index tuple as tensor.getitem normalises it (integer arrays as int64)."""
    return tuple(np.asarray(i, dtype=np.int64) if isinstance(i, list) else i for i in items)


def _dense_cases() -> list[Case]:
    C: list[Case] = []
    add = C.append
    # unary: every floating unary op (its group, so a new one is covered without an edit here) on
    # inputs inside any usual domain (0.2 .. 0.9 suits log, sqrt, reciprocal, asin, atanh ...);
    # an op defined on a narrower domain adds its own cases below
    for i, op in enumerate(sorted(FLOAT_UNARY, key=str)):
        add(Case(op, "matrix", (_unit_interval((3, 4), 10 + i),)))
        add(Case(op, "scalar", (np.array(0.55),)))
        add(Case(op, "empty", (np.zeros((0, 3)),)))
        add(Case(op, "size1", (_unit_interval((1, 5), 20 + i),)))
    # ... then the signed and larger inputs of those defined on the whole line
    for i, op in enumerate((Op.NEG, Op.EXP, Op.TANH)):
        add(Case(op, "signed", (_normal((3, 4), 30 + i),)))
        add(Case(op, "scalar_signed", (np.array(-1.3 + i),)))
    add(Case(Op.NEG, "empty", (np.zeros((0, 3)),)))
    for i, op in enumerate((Op.LOG, Op.RECIPROCAL)):
        add(Case(op, "above_one", (_positive((3, 4), 40 + i),)))
    add(Case(Op.RECIPROCAL, "negative", (-_positive((2, 3), 33),)))
    add(Case(Op.RELU, "matrix", (_away_from_zero((3, 4), 40),)))
    add(Case(Op.RELU, "vector", (_away_from_zero((7,), 41),)))
    add(Case(Op.RELU, "empty", (np.zeros((0,)),)))
    add(Case(Op.NEG, "int", (np.array([[1, -2, 3]], dtype=np.int64),), float32=False))
    # cast: gradients only where finite differences make sense (float64 -> float64)
    add(Case(Op.CAST, "f64_to_f64", (_normal((2, 3), 50),), {"dtype": np.dtype(np.float64)}))
    add(Case(Op.CAST, "f64_to_f32", (_normal((2, 3), 51),), {"dtype": np.dtype(np.float32)}, grad=(False,)))
    add(Case(Op.CAST, "f64_to_i64", (np.array([1.7, -2.3, 0.0, 5.9]),), {"dtype": np.dtype(np.int64)},
             grad=(False,)))
    add(Case(Op.CAST, "i64_to_f64", (np.array([[3, -1], [0, 7]], dtype=np.int64),),
             {"dtype": np.dtype(np.float64)}, float32=False))
    add(Case(Op.CAST, "bool_to_f64", (np.array([True, False, True]),), {"dtype": np.dtype(np.float64)},
             float32=False))
    # binary, with broadcasting / size-1 dims / 0-d / empty
    shapes = {"same": ((3, 4), (3, 4)), "col_row": ((3, 1), (1, 4)), "row": ((2, 3), (3,)),
              "scalar": ((), (2, 2)), "empty": ((0, 3), (1, 3)), "rank3": ((2, 1, 3), (4, 1))}
    for i, (name, (sa, sb)) in enumerate(shapes.items()):
        add(Case(Op.ADD, name, (_normal(sa, 60 + i), _normal(sb, 70 + i))))
        add(Case(Op.MUL, name, (_normal(sa, 80 + i), _normal(sb, 90 + i))))
        add(Case(Op.MAXIMUM, name, _separated_pair(sa, sb, 100 + 10 * i)))
        add(Case(Op.POW, name, (_positive(sa, 200 + i), _normal(sb, 210 + i))))
    add(Case(Op.ADD, "int", (np.array([1, 2, 3], dtype=np.int64), np.array([[10], [20]], dtype=np.int64)),
             float32=False))
    add(Case(Op.MUL, "mixed_int_float", (np.array([1, -2, 3], dtype=np.int64), _normal((2, 3), 220))))
    # negative bases: d/db is undefined (log of a negative), so only the base is differentiated
    add(Case(Op.POW, "integer_exponent", (_normal((2, 3), 221), np.array(2.0)), grad=(True, False)))
    # comparisons (no gradient): include exact ties
    cmp_a = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, -3.0]])
    cmp_b = np.array([0.5, 0.0, 2.5])
    for op in (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE):
        add(Case(op, "ties_broadcast", (cmp_a, cmp_b)))
        add(Case(op, "int_scalar", (np.array([1, 2, 3], dtype=np.int64), np.array(2, dtype=np.int64)),
                 float32=False))
        add(Case(op, "empty", (np.zeros((0, 2)), np.zeros((2,)))))
    # where
    cond = np.array([[True, False, True], [False, False, True]])
    add(Case(Op.WHERE, "same", (cond, _normal((2, 3), 300), _normal((2, 3), 301))))
    add(Case(Op.WHERE, "broadcast", (cond[:, :1], _normal((1, 3), 302), _normal((), 303))))
    add(Case(Op.WHERE, "empty", (np.zeros((0, 3), dtype=bool), _normal((0, 3), 304), _normal((3,), 305))))
    # reductions
    x = _normal((3, 4), 400)
    for name, axes, keep in (("all", (0, 1), False), ("axis0", (0,), False), ("axis1_keep", (1,), True),
                             ("none", (), False)):
        add(Case(Op.SUM, name, (x,), {"axes": axes, "keepdims": keep}))
    add(Case(Op.SUM, "rank3_mid", (_normal((2, 3, 4), 401),), {"axes": (1,), "keepdims": False}))
    add(Case(Op.SUM, "empty_axis", (np.zeros((0, 3)),), {"axes": (0,), "keepdims": False}))
    add(Case(Op.SUM, "scalar", (np.array(1.25),), {"axes": (), "keepdims": False}))
    add(Case(Op.SUM, "int", (np.array([[1, 2], [3, 4]], dtype=np.int64),), {"axes": (1,), "keepdims": False},
             float32=False))
    add(Case(Op.SUM, "bool", (np.array([True, False, True]),), {"axes": (0,), "keepdims": False},
             float32=False))
    d = _distinct((3, 4), 410)
    for name, axes, keep in (("all", (0, 1), False), ("axis0", (0,), False), ("axis1_keep", (1,), True)):
        add(Case(Op.MAX, name, (d,), {"axes": axes, "keepdims": keep}))
    add(Case(Op.MAX, "rank3", (_distinct((2, 3, 2), 411),), {"axes": (0, 2), "keepdims": False}))
    # movement
    add(Case(Op.RESHAPE, "matrix", (_normal((2, 3), 500),), {"shape": (3, 2)}))
    add(Case(Op.RESHAPE, "add_unit_dims", (_normal((6,), 501),), {"shape": (1, 6, 1)}))
    add(Case(Op.RESHAPE, "scalar", (np.array(2.5),), {"shape": (1,)}))
    add(Case(Op.RESHAPE, "empty", (np.zeros((0, 4)),), {"shape": (2, 0)}))
    add(Case(Op.PERMUTE, "rank3", (_normal((2, 3, 4), 510),), {"perm": (2, 0, 1)}))
    add(Case(Op.PERMUTE, "transpose", (_normal((3, 1), 511),), {"perm": (1, 0)}))
    add(Case(Op.EXPAND, "rank_up", (_normal((3, 1), 520),), {"shape": (2, 3, 4)}))
    add(Case(Op.EXPAND, "scalar", (np.array(0.7),), {"shape": (2, 2)}))
    add(Case(Op.EXPAND, "to_empty", (_normal((1, 3), 521),), {"shape": (0, 3)}))
    g = _normal((4, 3), 530)
    add(Case(Op.GETITEM, "slice", (g,), {"index": _ix(slice(1, 3), slice(None, None, -1))}))
    add(Case(Op.GETITEM, "int_and_slice", (g,), {"index": _ix(2, slice(0, 2))}))
    add(Case(Op.GETITEM, "gather_rows_repeat", (g,), {"index": _ix([2, 0, 2, 3])}))
    add(Case(Op.GETITEM, "fancy_pairs", (g,), {"index": _ix([0, 3, 1], [2, 2, 0])}))
    add(Case(Op.GETITEM, "newaxis", (g,), {"index": _ix(None, slice(None), -1)}))
    add(Case(Op.GETITEM, "empty_selection", (g,), {"index": _ix(slice(2, 2))}))
    add(Case(Op.INDEX_ADD, "rows_repeat", (_normal((4, 2), 540),), {"index": _ix([0, 2, 0, 3]), "shape": (5, 2)}))
    add(Case(Op.INDEX_ADD, "slice_broadcast", (_normal((2,), 541),),
             {"index": _ix(slice(1, 3), slice(None)), "shape": (4, 2)}))
    add(Case(Op.INDEX_ADD, "pairs", (_normal((3,), 542),), {"index": _ix([1, 1, 0], [0, 0, 2]), "shape": (2, 3)}))
    add(Case(Op.CONCAT, "axis0", (_normal((2, 3), 550), _normal((1, 3), 551)), {"axis": 0}))
    add(Case(Op.CONCAT, "axis1_three", (_normal((2, 1), 552), _normal((2, 3), 553), _normal((2, 2), 554)),
             {"axis": 1}))
    add(Case(Op.CONCAT, "with_empty", (_normal((0, 2), 555), _normal((3, 2), 556)), {"axis": 0}))
    # matmul: 2-D, 1-D on either side, batched with broadcasting, empty inner dimension
    for i, (name, sa, sb) in enumerate((("mm", (3, 4), (4, 2)), ("vec_mat", (4,), (4, 2)),
                                        ("mat_vec", (3, 4), (4,)), ("dot", (4,), (4,)),
                                        ("batched", (2, 3, 4), (4, 5)), ("batch_bcast", (1, 3, 2), (2, 2, 4)),
                                        ("inner0", (3, 0), (0, 2)), ("rows0", (0, 3), (3, 2)))):
        add(Case(Op.MATMUL, name, (_normal(sa, 600 + i), _normal(sb, 620 + i))))
    # addmm: a bias row, a column, a full matrix, a 0-d input, no rows, an empty inner dimension
    for i, (name, si, sa, sb) in enumerate((("bias_row", (2,), (3, 4), (4, 2)), ("column", (3, 1), (3, 4), (4, 2)),
                                            ("full", (3, 2), (3, 4), (4, 2)), ("scalar", (), (3, 4), (4, 2)),
                                            ("rows0", (2,), (0, 3), (3, 2)), ("inner0", (2,), (3, 0), (0, 2)))):
        add(Case(Op.ADDMM, name, (_normal(si, 660 + i), _normal(sa, 670 + i), _normal(sb, 680 + i))))
    # addcmul: the product of the output's shape; the input and a factor broadcast
    for i, (name, si, sa, sb) in enumerate((("same", (3, 2), (3, 2), (3, 2)), ("scale_1", (3, 2), (3, 2), (1,)),
                                            ("bias_row", (2,), (3, 2), (3, 2)), ("scalar_input", (), (3, 2), (2,)),
                                            ("empty", (0, 2), (0, 2), (1,)))):
        add(Case(Op.ADDCMUL, name, (_normal(si, 700 + i), _normal(sa, 710 + i), _normal(sb, 720 + i))))
    # cross-entropy: each reduction, one class, no rows (mean: NaN, as the composite)
    classes = np.array([0, 2, 1, 2], dtype=np.int64)
    for i, reduction in enumerate(("mean", "sum", "none")):
        add(Case(Op.CROSS_ENTROPY, reduction, (_normal((4, 3), 640 + i),), {"target": classes, "reduction": reduction}))
    add(Case(Op.CROSS_ENTROPY, "one_class", (_normal((3, 1), 643),),
             {"target": np.zeros(3, dtype=np.int64), "reduction": "mean"}))
    # soft cross-entropy: probabilities (rows summing to one), each reduction, one class, no rows
    def probabilities(shape: tuple, seed: int) -> np.ndarray:
        e = np.exp(_normal(shape, seed))
        return e / e.sum(-1, keepdims=True)

    for i, reduction in enumerate(("mean", "sum", "none")):
        add(Case(Op.SOFT_CROSS_ENTROPY, reduction, (_normal((4, 3), 650 + i), probabilities((4, 3), 660 + i)),
                 {"reduction": reduction}))
    add(Case(Op.SOFT_CROSS_ENTROPY, "one_class", (_normal((3, 1), 653), probabilities((3, 1), 663)),
             {"reduction": "mean"}))
    add(Case(Op.SOFT_CROSS_ENTROPY, "no_rows", (_normal((0, 2), 654), _normal((0, 2), 664)), {"reduction": "sum"}))
    add(Case(Op.CROSS_ENTROPY, "no_rows", (_normal((0, 2), 644),),
             {"target": np.zeros(0, dtype=np.int64), "reduction": "sum"}))
    return C


def _sparse_cases(layout: str) -> list[Case]:
    P = {name: p.with_layout(layout) for name, p in _patterns().items()}
    C: list[Case] = []
    add = C.append
    for i, (name, p) in enumerate(P.items()):
        add(Case(Op.SPMM, f"{name}_matrix", (_normal((p.nnz,), 700 + i), _normal((p.shape[1], 3), 710 + i)),
                 {"pattern": p}, layout))
        add(Case(Op.SDDMM, name, (_normal((p.shape[0], 3), 720 + i), _normal((p.shape[1], 3), 730 + i)),
                 {"pattern": p}, layout))
        add(Case(Op.SEGMENT_SUM, name, (_normal((p.nnz,), 740 + i),), {"pattern": p}, layout))
        add(Case(Op.SEGMENT_MAX, name, (_distinct((p.nnz,), 750 + i),), {"pattern": p}, layout))
    p = P["small"]
    add(Case(Op.SPMM, "small_vector", (_normal((p.nnz,), 760), _normal((p.shape[1],), 761)), {"pattern": p}, layout))
    add(Case(Op.SPMM, "small_width0", (_normal((p.nnz,), 762), np.zeros((p.shape[1], 0))), {"pattern": p}, layout))
    add(Case(Op.SPMM, "small_values_only", (_normal((p.nnz,), 763), _normal((p.shape[1], 2), 764)),
             {"pattern": p}, layout, grad=(True, False)))
    add(Case(Op.SDDMM, "small_width1", (_normal((p.shape[0], 1), 765), _normal((p.shape[1], 1), 766)),
             {"pattern": p}, layout))
    C.extend(_nonfinite_cases(p, layout))
    C.extend(_long_row_cases(layout))
    return C


def _with_nonfinite(values: np.ndarray, p: Pattern) -> np.ndarray:
    """``values`` with +inf in the first nonzero of row 0 and NaN in the first of the last nonempty
    row: every other row must stay finite (IEEE, like numpy), whatever order the kernel sums in."""
    out = values.copy()
    starts = p.indptr[:-1][np.diff(p.indptr) > 0]
    out[starts[0]] = np.inf
    out[starts[-1]] = np.nan
    return out


def _nonfinite_cases(p: Pattern, layout: str) -> list[Case]:
    """inf and NaN in sparse inputs (no gradients: central differences are undefined there)."""
    x = _normal((p.shape[1], 3), 770)
    x_inf = x.copy()
    x_inf[1, 0] = -np.inf
    vals = _with_nonfinite(_normal((p.nnz,), 771), p)
    off = {"pattern": p}
    return [Case(Op.SPMM, "nonfinite_values", (vals, x), off, layout, grad=(False, False)),
            Case(Op.SPMM, "nonfinite_x", (_normal((p.nnz,), 772), x_inf), off, layout, grad=(False, False)),
            Case(Op.SEGMENT_SUM, "nonfinite", (vals,), off, layout, grad=(False,)),
            Case(Op.SDDMM, "nonfinite", (_normal((p.shape[0], 3), 773), x_inf), off, layout,
                 grad=(False, False))]


#: nonzeros of the long rows of :func:`long_row_pattern`
LONG_ROW = 20_000


@lru_cache(maxsize=None)
def long_row_pattern() -> Pattern:
    """Row 0: LONG_ROW nonzeros; rows 1-3: four each; row 4: LONG_ROW again; row 5 empty."""
    n = LONG_ROW
    rows = np.concatenate([np.zeros(n, np.int64), np.repeat(np.arange(1, 4), 4), np.full(n, 4)])
    short = np.array([0, 7, 11, 19])
    cols = np.concatenate([np.arange(n), short, short + 1, short + 2, np.arange(n)])
    return Pattern.from_sorted((6, n), rows, cols)


def _long_row_cases(layout: str) -> list[Case]:
    """Long rows of large positive terms before short rows of tiny ones, then a long row of mixed
    signs: a kernel that sums across rows (a prefix sum over all nonzeros, then differences) or
    accumulates far worse than a float32 sum of the row is caught by the float32 bound."""
    p = long_row_pattern().with_layout(layout)
    r = _rng(780)
    n = LONG_ROW
    values = np.concatenate([r.uniform(500.0, 1000.0, n), r.normal(size=12) * 1e-3, r.normal(size=n)])
    x = r.uniform(0.5, 2.0, (n, 2))
    off = {"pattern": p}
    return [Case(Op.SPMM, "long_rows", (values, x), off, layout, grad=(False, False), accumulate=True),
            Case(Op.SEGMENT_SUM, "long_rows", (values,), off, layout, grad=(False,), accumulate=True)]


def _dense_bad_cases() -> list[BadCase]:
    B: list[BadCase] = []
    add = B.append
    f = np.ones((2, 3))
    ints = np.ones((2, 3), dtype=np.int64)
    for op in sorted(FLOAT_UNARY, key=str):
        add(BadCase(op, "int_input", (ints,), error=DTypeError))
    for op in (Op.NEG, Op.RELU):
        add(BadCase(op, "bool_input", (np.ones(3, dtype=bool),), error=DTypeError))
    for op in sorted(BINARY | COMPARE, key=str):
        add(BadCase(op, "shape_mismatch", (f, np.ones((4,)))))
    add(BadCase(Op.ADD, "bool_operands", (np.ones(2, dtype=bool), np.ones(2, dtype=bool)), error=DTypeError))
    add(BadCase(Op.WHERE, "float_condition", (f, f, f), error=DTypeError))
    add(BadCase(Op.WHERE, "shape_mismatch", (np.ones((2, 3), dtype=bool), f, np.ones((3, 2)))))
    add(BadCase(Op.MAX, "empty_axis", (np.zeros((0, 3)),), {"axes": (0,), "keepdims": False}))
    add(BadCase(Op.RESHAPE, "wrong_size", (f,), {"shape": (4, 2)}))
    add(BadCase(Op.PERMUTE, "not_a_permutation", (f,), {"perm": (0, 0)}))
    add(BadCase(Op.EXPAND, "incompatible", (f,), {"shape": (2, 4)}))
    add(BadCase(Op.GETITEM, "out_of_range", (f,), {"index": _ix(5)}, error=IndexOutOfRangeError))
    add(BadCase(Op.GETITEM, "too_many_indices", (f,), {"index": _ix(0, 0, 0)}, error=IndexOutOfRangeError))
    add(BadCase(Op.INDEX_ADD, "source_mismatch", (np.ones((3, 3)),), {"index": _ix([0, 1]), "shape": (4, 3)}))
    add(BadCase(Op.CONCAT, "mismatch_off_axis", (f, np.ones((3, 3))), {"axis": 1}))
    add(BadCase(Op.MATMUL, "inner_mismatch", (f, np.ones((4, 2)))))
    add(BadCase(Op.MATMUL, "zero_dim", (np.array(1.0), f)))
    add(BadCase(Op.MATMUL, "bool", (np.ones((2, 2), dtype=bool), np.ones((2, 2), dtype=bool)), error=DTypeError))
    add(BadCase(Op.ADDMM, "inner_mismatch", (np.ones(2), f, np.ones((2, 2)))))
    add(BadCase(Op.ADDMM, "input_too_big", (np.ones((4, 2)), f, np.ones((3, 2)))))
    add(BadCase(Op.ADDMM, "mixed_dtypes", (np.ones(2, dtype=np.float32), f, np.ones((3, 2))), error=DTypeError))
    add(BadCase(Op.ADDCMUL, "factors_mismatch", (f, f, np.ones((3, 2)))))
    add(BadCase(Op.ADDCMUL, "input_too_big", (np.ones((4, 2, 3)), f, f)))
    add(BadCase(Op.ADDCMUL, "mixed_dtypes", (f, f.astype(np.float32), f), error=DTypeError))
    mean = {"reduction": "mean"}
    add(BadCase(Op.CROSS_ENTROPY, "class_out_of_range", (f,), {"target": np.array([0, 3]), **mean},
                error=IndexOutOfRangeError))
    add(BadCase(Op.CROSS_ENTROPY, "target_rows", (f,), {"target": np.array([0, 1, 2]), **mean}))
    add(BadCase(Op.CROSS_ENTROPY, "vector_logits", (np.ones(3),), {"target": np.array([0, 1, 2]), **mean}))
    add(BadCase(Op.CROSS_ENTROPY, "reduction", (f,), {"target": np.array([0, 1]), "reduction": "max"}))
    add(BadCase(Op.SOFT_CROSS_ENTROPY, "probs_shape", (f, np.ones((3, 2))), mean))
    add(BadCase(Op.SOFT_CROSS_ENTROPY, "probs_dtype", (f, f.astype(np.float32)), mean, error=DTypeError))
    add(BadCase(Op.SOFT_CROSS_ENTROPY, "vector_logits", (np.ones(3), np.ones(3)), mean))
    add(BadCase(Op.SOFT_CROSS_ENTROPY, "reduction", (f, f), {"reduction": "max"}))
    return B


def _sparse_bad_cases(layout: str) -> list[BadCase]:
    p = sample_pattern().with_layout(layout)
    n, m = p.shape
    vals = np.ones(p.nnz)
    return [
        BadCase(Op.SPMM, "values_length", (np.ones(p.nnz + 1), np.ones((m, 2))), {"pattern": p}, layout),
        BadCase(Op.SPMM, "dense_rows", (vals, np.ones((m + 1, 2))), {"pattern": p}, layout),
        BadCase(Op.SPMM, "dense_rank3", (vals, np.ones((m, 2, 2))), {"pattern": p}, layout),
        BadCase(Op.SDDMM, "width_mismatch", (np.ones((n, 2)), np.ones((m, 3))), {"pattern": p}, layout),
        BadCase(Op.SDDMM, "rows_mismatch", (np.ones((n + 1, 2)), np.ones((m, 2))), {"pattern": p}, layout),
        BadCase(Op.SEGMENT_SUM, "values_length", (np.ones(p.nnz + 2),), {"pattern": p}, layout),
        BadCase(Op.SEGMENT_MAX, "values_rank", (np.ones((p.nnz, 1)),), {"pattern": p}, layout),
    ]


@lru_cache(maxsize=1)
def _all_cases() -> tuple[Case, ...]:
    out = _dense_cases()
    for layout in _SPARSE_LAYOUTS:
        out += _sparse_cases(layout)
    return tuple(out)


@lru_cache(maxsize=1)
def _all_bad_cases() -> tuple[BadCase, ...]:
    out = _dense_bad_cases()
    for layout in _SPARSE_LAYOUTS:
        out += _sparse_bad_cases(layout)
    return tuple(out)


def _select(items: Sequence, op: Any, layout: str | None) -> list:
    wanted = None if op is None else Op(op)
    return [c for c in items if (wanted is None or c.op == wanted) and (layout is None or c.layout == layout)]


def cases(op: Op | str | None = None, layout: str | None = None) -> list[Case]:
    """Valid cases, optionally for one op (``Op`` or its name) and/or one layout."""
    return _select(_all_cases(), op, layout)


def bad_cases(op: Op | str | None = None, layout: str | None = None) -> list[BadCase]:
    """Invalid cases (each names the polygrad error inference must raise)."""
    return _select(_all_bad_cases(), op, layout)


def covered() -> set[tuple[Op, str]]:
    """Every (op, layout) pair the catalogue has at least one valid case for."""
    return {(c.op, c.layout) for c in _all_cases()}
