"""Property-based fuzzing: malformed input gets a polygrad error, never anything else.

Hypothesis feeds constructors and ops bad shapes and dtypes, NaN/Inf, out-of-range and negative
indices, wrong index types, ragged lists, mixed backends, empty tensors and huge sizes.  The one
property: the call returns, or raises a :class:`polygrad.errors.PolygradError` (which may also be a
ValueError/TypeError/IndexError...).  Any other exception type fails the test with a minimal
example; a call that does not return within ``HANG_SECONDS`` fails as a hang.

Budget: about 1,500 examples in all (see ``EXAMPLES``), well under a minute on one core.
"""
from __future__ import annotations

import math
import os
import signal
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.errors import PolygradError
from polygrad.sparse.pattern import Pattern
from polygrad.tensor import index_add, sddmm, segment_max, segment_sum, spmm

HANG_SECONDS = 10
#: examples per test (>= 1,000 in all); POLYGRAD_FUZZ_SCALE=10 runs a deeper fuzz by hand
_SCALE = float(os.environ.get("POLYGRAD_FUZZ_SCALE", "1"))
EXAMPLES = {name: max(1, int(n * _SCALE)) for name, n in
            {"tensor": 300, "filled": 150, "unary": 350, "binary": 350, "sparse": 200, "backward": 150}.items()}

FUZZ = settings(deadline=None, database=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@pytest.fixture(autouse=True, scope="module")
def small_memory_budget():
    """Fuzzed sizes either fit easily or must be refused: a budget of ~0.5% of free memory makes
    every large allocation a MemoryBudgetError (checked) instead of a real multi-GB allocation."""
    before = pg.config.memory_fraction
    pg.config.memory_fraction = 0.005
    try:
        yield
    finally:
        pg.config.memory_fraction = before


class Hang(Exception):
    """A fuzzed call ran longer than HANG_SECONDS (not a PolygradError: fails the property)."""


@contextmanager
def hang_guard():
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"call did not return within {HANG_SECONDS}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def only_polygrad_errors(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a PolygradError is an accepted outcome, anything else propagates."""
    with hang_guard(), warnings.catch_warnings():
        # numpy's RuntimeWarnings (overflow, invalid value) are fine: NaN/Inf are documented
        # outcomes.  A FallbackWarning is not: no fuzzed input may be mistaken for a kernel fault.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("error", pg.FallbackWarning)
        try:
            return fn()
        except PolygradError:
            return None


# -- strategies ---------------------------------------------------------------------------------------

SPECIAL_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, -1e308, 5e-324])
scalars = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), SPECIAL_FLOATS,
    st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.booleans(),
    st.none(), st.text(max_size=3), st.complex_numbers(max_magnitude=10),
)
# nested lists, ragged on purpose
ragged = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


def _as_array(data: Any) -> np.ndarray:
    """numpy's view of ``data`` (an object array when numpy refuses a ragged list)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return np.array(data)
        except (ValueError, TypeError, OverflowError):
            out = np.empty(1, dtype=object)
            out[0] = data
            return out


ragged_arrays = st.builds(_as_array, ragged)

DIMS = st.sampled_from([0, 1, 2, 3, -1, -2, 2 ** 40, 2 ** 62, 2 ** 70])
weird_shapes = st.one_of(
    st.lists(DIMS, max_size=4).map(tuple),
    st.lists(st.one_of(DIMS, st.floats(-3, 3), st.text(max_size=2), st.none()), max_size=3).map(tuple),
)
DTYPES = st.sampled_from([None, "float32", "float64", "int64", "int32", "bool", "float", "double", "long",
                          "int8", "uint8", "uint64", "float16", "complex64", "float33", "object", "U3",
                          "datetime64[s]", object, complex, float, int, bool, str, 3, np.float64,
                          pg.float32, pg.int64, pg.bool_])
BACKENDS = st.sampled_from(["numpy", "scalar", None, "nope", 3, "cupy"])

SMALL_SHAPES = st.lists(st.integers(0, 3), max_size=3).map(tuple)
GOOD_DTYPES = st.sampled_from([np.float64, np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_])
ELEMENTS = st.one_of(st.floats(-4, 4, allow_nan=False), SPECIAL_FLOATS,
                     st.integers(-3, 3).map(float))


@st.composite
def arrays(draw, shape=None, dtype=None) -> np.ndarray:
    shape = draw(SMALL_SHAPES) if shape is None else shape
    dtype = draw(GOOD_DTYPES) if dtype is None else dtype
    n = int(np.prod(shape, dtype=np.int64))
    vals = np.array(draw(st.lists(ELEMENTS, min_size=n, max_size=n)), dtype=np.float64).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        if np.dtype(dtype).kind in "iu":
            vals = np.nan_to_num(vals, nan=0, posinf=7, neginf=-7)
        return vals.astype(dtype)


@st.composite
def tensors(draw, backend=None) -> pg.Tensor:
    a = draw(arrays())
    be = backend or draw(st.sampled_from(["numpy", "numpy", "numpy", "scalar"]))
    t = pg.tensor(a, backend=be)
    if a.dtype.kind == "f" and draw(st.booleans()):
        t.requires_grad_(True)
    return t


index_items = st.one_of(
    st.integers(-6, 6), st.integers(-2 ** 70, 2 ** 70), st.none(), st.just(Ellipsis),
    st.builds(slice, st.one_of(st.none(), st.integers(-5, 5)), st.one_of(st.none(), st.integers(-5, 5)),
              st.one_of(st.none(), st.integers(-3, 3))),
    st.lists(st.integers(-6, 6), max_size=4), st.lists(st.booleans(), max_size=4),
    ragged, st.floats(), st.text(max_size=2), st.booleans(),
    st.lists(st.integers(-6, 6), max_size=4).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(-3, 3), max_size=3).map(np.array),
    st.lists(st.booleans(), max_size=4).map(lambda v: pg.tensor(np.array(v, dtype=bool))),
    st.lists(st.integers(-4, 4), max_size=4).map(lambda v: pg.tensor(np.array(v, dtype=np.int64))),
)
indices = st.one_of(index_items, st.lists(index_items, max_size=4).map(tuple))
axes = st.one_of(st.none(), st.integers(-5, 5), st.lists(st.integers(-5, 5), max_size=3).map(tuple),
                 st.floats(-2, 2), st.text(max_size=1))
anything = st.one_of(scalars, ragged, weird_shapes, axes, DTYPES)


# -- constructors -------------------------------------------------------------------------------------

@settings(FUZZ, max_examples=EXAMPLES["tensor"])
@given(data=st.one_of(ragged, ragged_arrays), dtype=DTYPES, requires_grad=st.booleans(),
       backend=BACKENDS, layout=st.sampled_from(["dense", "dense", "csr", "coo", "auto"]))
def test_tensor_constructor(data, dtype, requires_grad, backend, layout):
    def make():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # np.array(ragged) may warn; the input is what it is
            return pg.tensor(data, dtype=dtype, requires_grad=requires_grad, backend=backend, layout=layout)
    t = only_polygrad_errors(make)
    if t is not None:
        assert isinstance(t, pg.Tensor)
        assert t.numpy().shape == t.shape
        assert not (requires_grad and t.dtype.kind != "f")  # only floats can require grad


@settings(FUZZ, max_examples=EXAMPLES["filled"])
@given(which=st.sampled_from(["zeros", "ones", "full", "rand", "randn", "arange", "reshape_empty"]),
       shape=weird_shapes, dtype=DTYPES, backend=BACKENDS, fill=scalars)
def test_filled_constructors(which, shape, dtype, backend, fill):
    def make():
        if which == "full":
            return pg.full(shape, fill, dtype=dtype, backend=backend)
        if which == "arange":
            return pg.arange(*(shape[:3] or (0,)), dtype=dtype, backend=backend)
        if which == "reshape_empty":
            return pg.zeros(0).reshape(*shape)
        return getattr(pg, which)(*shape, dtype=dtype, backend=backend)
    t = only_polygrad_errors(make)
    if t is not None:
        assert t.numpy().shape == t.shape


# -- dense ops ------------------------------------------------------------------------------------------

UNARY: dict[str, Callable[[pg.Tensor, Any], Any]] = {
    "reshape": lambda x, a: x.reshape(a),
    "reshape_splat": lambda x, a: x.reshape(*a) if isinstance(a, tuple) else x.reshape(a),
    "permute": lambda x, a: x.permute(a),
    "transpose": lambda x, a: x.transpose(*a[:2]) if isinstance(a, tuple) else x.transpose(a),
    "expand": lambda x, a: x.expand(a),
    "getitem": lambda x, a: x[a],
    "index_add": lambda x, a: index_add(x, a, (3, 3)),
    "index_add_shape": lambda x, a: index_add(x, (slice(None),), a),
    "sum": lambda x, a: x.sum(axis=a),
    "mean": lambda x, a: x.mean(axis=a, keepdims=True),
    "max": lambda x, a: x.max(axis=a),
    "min": lambda x, a: x.min(axis=a),
    "argmax": lambda x, a: x.argmax(axis=a),
    "softmax": lambda x, a: x.softmax(axis=a),
    "log_softmax": lambda x, a: x.log_softmax(axis=a),
    "logsumexp": lambda x, a: x.logsumexp(axis=a),
    "unsqueeze": lambda x, a: x.unsqueeze(a),
    "squeeze": lambda x, a: x.squeeze(a),
    "flatten": lambda x, a: x.flatten(*a[:2]) if isinstance(a, tuple) else x.flatten(a),
    "cast": lambda x, a: x.cast(a),
    "to": lambda x, a: x.to(a),
    "exp_log_tanh": lambda x, a: x.exp().log().tanh().reciprocal().relu().sigmoid(),
    "sqrt_abs_neg": lambda x, a: -abs(x).sqrt(),
    "clip": lambda x, a: x.clip(a, None),
    "pow_scalar": lambda x, a: x ** a,
    "rpow_scalar": lambda x, a: a ** x,
    "add_scalar": lambda x, a: x + a,
    "rsub_scalar": lambda x, a: a - x,
    "mul_scalar": lambda x, a: x * a,
    "div_scalar": lambda x, a: x / a,
    "rdiv_scalar": lambda x, a: a / x,
    "compare_scalar": lambda x, a: x < a,
    "where_scalar": lambda x, a: pg.where(x > 0, x, a),
    "where_cond": lambda x, a: pg.where(a, x, 0.0),
    "cross_entropy": lambda x, a: pg.cross_entropy(x, a),
    "cross_entropy_mask": lambda x, a: pg.cross_entropy(x, np.zeros(x.shape[0] if x.ndim else 0, np.int64), mask=a),
    "mse": lambda x, a: pg.mse(x, a),
    "item": lambda x, a: x.item(),
    "float": lambda x, a: float(x),
    "bool": lambda x, a: bool(x),
    # len() of a 0-d tensor is a TypeError by Python's protocol (as numpy's), not fuzzed here
    "len_iter": lambda x, a: [len(x), list(x)] if x.ndim else None,
    "tolist_repr": lambda x, a: (x.tolist(), repr(x)),
    "backward": lambda x, a: x.backward(),
    "backward_grad": lambda x, a: x.backward(a),
    "requires_grad_": lambda x, a: x.requires_grad_(a is not None),
    "matmul_self": lambda x, a: x @ x,
    "stack_self": lambda x, a: pg.stack([x, x], axis=a if isinstance(a, int) else 0),
}


@settings(FUZZ, max_examples=EXAMPLES["unary"])
@given(name=st.sampled_from(sorted(UNARY)), x=tensors(), arg=st.one_of(indices, anything))
def test_unary_ops(name, x, arg):
    only_polygrad_errors(lambda: UNARY[name](x, arg))


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": pg.add, "sub": pg.sub, "mul": pg.mul, "div": pg.div, "pow": pg.pow,
    "maximum": pg.maximum, "minimum": pg.minimum, "matmul": pg.matmul,
    "lt": lambda a, b: a < b, "eq": lambda a, b: a == b,
    "where": lambda a, b: pg.where(a, a, b), "where_bool": lambda a, b: pg.where(a > 0, a, b),
    "concat0": lambda a, b: pg.concat([a, b], axis=0), "concat_last": lambda a, b: pg.concat([a, b], axis=-1),
    "stack": lambda a, b: pg.stack([a, b]),
    "cross_entropy": pg.cross_entropy, "mse": pg.mse,
    "index_add_like": lambda a, b: index_add(a, b, b.shape) if isinstance(b, pg.Tensor) else a,
    "getitem_tensor": lambda a, b: a[b],
    "data_assign": lambda a, b: setattr(a, "data", b),
    "grad_fn": lambda a, b: pg.grad((a * b).sum(), [a, b]),
}


@settings(FUZZ, max_examples=EXAMPLES["binary"])
@given(name=st.sampled_from(sorted(BINARY)), a=tensors(), b=st.one_of(tensors(), tensors(), ragged),
       swap=st.booleans())
def test_binary_ops_and_mixed_backends(name, a, b, swap):
    if swap and isinstance(b, pg.Tensor):
        a, b = b, a
    only_polygrad_errors(lambda: BINARY[name](a, b))


# -- sparse primitives with a valid pattern and malformed operands ----------------------------------------

def _pattern(nrows: int, ncols: int, seed: int, layout: str) -> Pattern:
    rng = np.random.default_rng(seed)
    mask = rng.random((nrows, ncols)) < 0.4
    rows, cols = np.nonzero(mask)
    return Pattern.from_sorted((nrows, ncols), rows, cols, layout)


SPARSE_OPS = {
    "spmm": lambda p, a, b: spmm(a, b, p),
    "sddmm": lambda p, a, b: sddmm(a, b, p),
    "segment_sum": lambda p, a, b: segment_sum(a, p),
    "segment_max": lambda p, a, b: segment_max(a, p),
}


@settings(FUZZ, max_examples=EXAMPLES["sparse"])
@given(name=st.sampled_from(sorted(SPARSE_OPS)), rows=st.integers(0, 4), cols=st.integers(0, 4),
       seed=st.integers(0, 3), layout=st.sampled_from(["csr", "coo"]), a=tensors(), b=tensors(),
       fit=st.booleans())
def test_sparse_primitives(name, rows, cols, seed, layout, a, b, fit):
    p = _pattern(rows, cols, seed, layout)
    if fit:  # operands of the right size but arbitrary dtype / values / backend
        a = pg.tensor(np.resize(a.numpy(), (p.nnz,)), backend=a.backend)
        b = pg.tensor(np.resize(b.numpy(), (cols, 2)), backend=b.backend)
    only_polygrad_errors(lambda: SPARSE_OPS[name](p, a, b))


# plain names (a missing constructor is an AttributeError, not a skipped test)
SPARSE_CONSTRUCTORS = ["sparse_coo", "sparse_csr", "from_edge_index"]
int_lists = st.lists(st.lists(st.integers(-3, 6), max_size=5), max_size=3).map(_as_array)
index_like = st.one_of(ragged, ragged_arrays, int_lists, st.lists(st.integers(-3, 6), max_size=6).map(np.array))
values_like = st.one_of(ragged, ragged_arrays, st.lists(ELEMENTS, max_size=6).map(np.array), tensors())
sparse_shapes = st.one_of(weird_shapes, st.tuples(st.integers(-1, 5), st.integers(-1, 5)), st.integers(-2, 4),
                          st.none())


@settings(FUZZ, max_examples=EXAMPLES["sparse"])
@given(name=st.sampled_from(SPARSE_CONSTRUCTORS), ptr=index_like, idx=index_like, values=values_like,
       shape=sparse_shapes, layout=st.sampled_from(["csr", "coo", "auto"]),
       backend=BACKENDS, allow_nonfinite=st.booleans())
def test_sparse_constructors(name, ptr, idx, values, shape, layout, backend, allow_nonfinite):
    fn = getattr(pg, name)
    kwargs = dict(layout=layout, backend=backend, allow_nonfinite=allow_nonfinite)

    def make():
        if name == "from_edge_index":
            return fn(idx, shape, values if not isinstance(values, list) else None, **kwargs)
        if name == "sparse_coo":
            return fn(idx, values, shape, **kwargs)
        return fn(ptr, idx, values, shape, **kwargs)
    t = only_polygrad_errors(make)
    if t is not None:
        assert t.to_dense().shape == t.shape


# -- backward misuse --------------------------------------------------------------------------------------

@settings(FUZZ, max_examples=EXAMPLES["backward"])
@given(x=tensors(), grad=st.one_of(st.none(), tensors(), ragged), retain=st.booleans(), twice=st.booleans(),
       create=st.booleans())
def test_backward_misuse(x, grad, retain, twice, create):
    def run():
        y = (x * 2.0).tanh() if x.dtype.kind == "f" else x
        y.backward(grad, retain_graph=retain, create_graph=create)
        if twice:
            y.backward(grad)
        return x.grad
    only_polygrad_errors(run)


def fuzz_tests() -> dict:
    """This module's hypothesis tests and the settings hypothesis will run each with."""
    return {name: fn._hypothesis_internal_use_settings for name, fn in sorted(globals().items())
            if name.startswith("test_") and getattr(fn, "is_hypothesis_test", False)}


def test_fuzz_budget_is_at_least_a_thousand_examples():
    """The budget the tests *run with* (hypothesis' settings on each test, not the EXAMPLES table:
    a test that forgets its @settings, or overrides max_examples, lowers it), and FUZZ's
    deadline/database on every test."""
    applied = fuzz_tests()
    assert len(applied) >= 7, sorted(applied)
    assert _SCALE < 1 or sum(s.max_examples for s in applied.values()) >= 1000, \
        {name: s.max_examples for name, s in applied.items()}
    for name, s in applied.items():
        assert s.deadline is None and s.database is None, f"{name} does not run with the FUZZ settings"
        assert s.max_examples >= 100 * min(_SCALE, 1), f"{name} runs only {s.max_examples} examples"
