"""The zero-skipping SpMM rewrite (compile/zero_skip.py) against the path it replaces: the kernels on
the full pattern (generated patterns, values with +-0.0, NaN and infinities, dense operands with or
without non-finite entries, both compiled dtypes), and a pure replay of a dropout-on-sparse-features
step against eager, bit for bit, with the rewrite applied."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.compile.program import Call
from polygrad.compile.zero_skip import (_compact, declared_dtypes, zero_skipping_spmm,
                                        zero_skipping_spmm_dx)
from polygrad.engine.dispatch import registry
from polygrad.sparse.pattern import Pattern
from tests.helpers import assert_bitwise, observed

SPMM = (pg.Op.SPMM, "csr")


def _specials(rng: np.random.Generator, a: np.ndarray, count: int, choices: list[float]) -> None:
    for _ in range(count):
        a.flat[rng.integers(0, a.size)] = choices[rng.integers(0, len(choices))]


kernel_cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "rows": st.integers(1, 30),
    "cols": st.integers(1, 30),
    "width": st.integers(1, 6),
    "density": st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    "zeros": st.sampled_from([0.0, 0.5, 1.0]),
    "float32": st.booleans(),
    "special_values": st.integers(0, 3),  # -0.0 / NaN / inf among the sparse values
    "special_dense": st.integers(0, 2),   # inf / NaN / -0.0 in the dense operand
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernel_cases)
def test_zero_skipping_kernels_equal_the_full_ones_bit_for_bit(c):
    pg.tensor([1.0])  # the numpy backend's tables are registered
    rng = np.random.default_rng(c["seed"])
    dtype = np.float32 if c["float32"] else np.float64
    n, m, f = c["rows"], c["cols"], c["width"]
    dense = rng.random((n, m)) < c["density"]
    rows, cols = np.nonzero(dense)
    pattern = Pattern.from_sorted((n, m), rows, cols)
    values = rng.normal(size=rows.size).astype(dtype)
    values[rng.random(rows.size) < c["zeros"]] = 0.0
    if values.size:
        _specials(rng, values, c["special_values"], [-0.0, np.nan, np.inf, -np.inf])
    x = rng.normal(size=(m, f)).astype(dtype)
    g = rng.normal(size=(n, f)).astype(dtype)
    _specials(rng, x, c["special_dense"], [np.inf, np.nan, -0.0])
    _specials(rng, g, c["special_dense"], [np.inf, np.nan, -0.0])
    fwd, vjp = registry.tables["numpy"][SPMM], registry.vjp_tables["numpy"][SPMM]
    assert np.dtype(dtype) in declared_dtypes(fwd) and np.dtype(dtype) in declared_dtypes(vjp)
    (sub,) = _compact(values, pattern=pattern)
    assert sub is not None and not (sub.values == 0).any() and sub.pattern.nnz == int((values != 0).sum())
    with np.errstate(all="ignore"):
        want = fwd(values, x, pattern=pattern)
        got = zero_skipping_spmm("numpy")(values, x, sub, pattern=pattern)[0]
        assert_bitwise(got, want, "forward")
        want_dx = vjp(g, values, x, needs=(False, True), pattern=pattern)[1]
        got_dx = zero_skipping_spmm_dx("numpy")(g, values, x, sub, needs=(False, True), pattern=pattern)[0]
        assert_bitwise(got_dx, want_dx, "dX")


def test_a_wrapper_that_copied_the_declaration_declares_nothing():
    import functools
    pg.tensor([1.0])
    fwd = registry.tables["numpy"][SPMM]

    @functools.wraps(fwd)
    def wrapped(*args, **kwargs):
        return fwd(*args, **kwargs)

    assert declared_dtypes(fwd) and not declared_dtypes(wrapped)


def _case(c: dict):
    pg.manual_seed(c["seed"])
    rng = np.random.default_rng(c["seed"])
    n, f, h, k = c["nodes"], c["features"], c["hidden"], c["classes"]
    dtype = np.float32 if c["float32"] else np.float64
    dense = rng.random((n, f)) < 0.4
    dense[0, 0] = True
    rows, cols = np.nonzero(dense)
    vals = rng.uniform(0.1, 1.0, rows.size)
    if c["nonfinite_x"]:
        vals[rng.integers(0, rows.size)] = np.inf
    x = pg.sparse_coo(np.stack([rows, cols]), vals, (n, f), dtype=dtype, layout="csr", allow_nonfinite=True)
    w1 = pg.tensor(rng.normal(size=(f, h)).astype(dtype), requires_grad=True)
    w2 = pg.tensor(rng.normal(size=(h, k)).astype(dtype), requires_grad=True)
    y = rng.integers(0, k, n)
    params = [w1, w2]
    opt = optim.Adam(params, lr=0.05)

    def step():  # GCN's first layer: dropout on the sparse features' values, then X @ W
        opt.zero_grad()
        hid = (nn.dropout(x, c["p"]) @ w1).relu()
        out = hid @ w2
        loss = nn.cross_entropy(out, y)
        loss.backward()
        return loss, out

    return step, opt, params


step_cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "nodes": st.integers(2, 40),
    "features": st.integers(1, 30),
    "hidden": st.integers(1, 6),
    "classes": st.integers(2, 5),
    "p": st.sampled_from([0.1, 0.5, 0.9]),
    "float32": st.booleans(),
    "nonfinite_x": st.sampled_from([False, False, True]),
    "nonfinite_w": st.sampled_from([False, False, True]),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_cases)
def test_dropout_spmm_replay_equals_eager_bit_for_bit(c):
    def run(compiled: bool) -> tuple:
        step, opt, params = _case(c)
        fn = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for i in range(5):
                if c["nonfinite_w"] and i == 3:  # a replayed call: its product must take the full pattern
                    w = params[0]._data.copy()
                    w[c["seed"] % w.shape[0], c["seed"] % w.shape[1]] = np.inf
                    params[0]._data = w
                loss, out = fn()
                opt.step()
                seen.append([observed(loss), observed(out), observed(params)])
        return seen, fn

    (want, _), (got, compiled) = run(False), run(True)
    assert_bitwise(got, want)
    fns = {e.fn for entry in compiled._cache.values() if entry.capture is not None
           for e in entry.capture.program if isinstance(e, Call)}
    assert zero_skipping_spmm("numpy") in fns and zero_skipping_spmm_dx("numpy") in fns, fns
