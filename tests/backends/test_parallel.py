"""The numpy backend's parallel kernels give the same bits at 1, 2, 3 and 7 threads.

The size thresholds below which kernels stay serial are set to zero here (``force_parallel``), so
the small generated inputs go through the blocked, multi-threaded code; a spy checks that the
kernels really hand out more than one block.  Patterns: power-law (Graph500's R-MAT), uniform,
with empty rows, with one row holding most of the nonzeros.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.sparse import _sparsetools

import polygrad as pg
from polygrad.backends import parallel
from polygrad.ir.ops import Op
from polygrad.sparse.pattern import Pattern
from polygrad.runtime.registry import registry
from tests.helpers import count_block_runs

THREAD_COUNTS = (1, 2, 3, 7)


@pytest.fixture
def force_parallel(monkeypatch):
    monkeypatch.setattr(parallel, "SPARSE_PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "DENSE_PARALLEL_MIN", 0)
    monkeypatch.setattr(parallel, "COLUMN_SUM_ROWS", 7)
    blocks = count_block_runs(monkeypatch, parallel)
    before = pg.get_num_threads()
    yield blocks
    pg.set_num_threads(before)


def _numpy():
    return registry.get("numpy")


def rmat_edges(rng: np.random.Generator, scale: int, edges: int, probs=(0.57, 0.19, 0.19, 0.05)):
    """Graph500's R-MAT generator: each edge picks a quadrant per bit of its endpoints."""
    rows = np.zeros(edges, dtype=np.int64)
    cols = np.zeros(edges, dtype=np.int64)
    cum = np.cumsum(probs)
    for bit in range(scale):
        q = np.searchsorted(cum, rng.random(edges), side="right")
        rows |= (q >> 1).astype(np.int64) << bit
        cols |= (q & 1).astype(np.int64) << bit
    return rows, cols


@st.composite
def patterns(draw):
    kind = draw(st.sampled_from(["rmat", "uniform", "empty_rows", "huge_row"]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    if kind == "rmat":
        scale = draw(st.integers(3, 9))
        n = m = 1 << scale
        rows, cols = rmat_edges(rng, scale, draw(st.integers(0, 8 * n)))
    else:
        n = draw(st.integers(1, 300))
        m = draw(st.integers(1, 300))
        nnz = draw(st.integers(0, 6 * max(n, m)))
        rows, cols = rng.integers(0, n, nnz), rng.integers(0, m, nnz)
        if kind == "empty_rows":
            keep = rows % 3 != 0  # every third row empty
            rows, cols = rows[keep], cols[keep]
        elif kind == "huge_row":
            extra = draw(st.integers(0, 20 * m))
            rows = np.concatenate([rows, np.full(extra, n // 2)])
            cols = np.concatenate([cols, rng.integers(0, m, extra)])
    pattern, _, _ = Pattern.from_coo((n, m), rows, cols)
    return pattern, rng


def _same_bits(results: list) -> bool:
    first = results[0]
    return all(np.array_equal(np.asarray(r).view(np.uint8), np.asarray(first).view(np.uint8)) and
               np.asarray(r).shape == np.asarray(first).shape for r in results)


def _at_each_count(fn) -> list:
    out = []
    for n in THREAD_COUNTS:
        pg.set_num_threads(n)
        out.append(np.array(fn(), copy=True))
    return out


FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(patterns(), st.sampled_from([np.float32, np.float64]), st.sampled_from([0, 1, 3, 16]))
def test_spmm_forward_and_fused_backward_are_bit_identical(force_parallel, case, dtype, f):
    pattern, rng = case
    n, m = pattern.shape
    values = rng.standard_normal(pattern.nnz).astype(dtype)
    x = rng.standard_normal((m, f) if f else m).astype(dtype)      # f = 0: a vector
    g = rng.standard_normal((n, f) if f else n).astype(dtype)
    be = _numpy()
    spmm = be.kernels[(Op.SPMM, "csr")]
    vjp = be.vjp_kernels[(Op.SPMM, "csr")]
    assert _same_bits(_at_each_count(lambda: spmm(values, x, pattern=pattern)))
    assert _same_bits(_at_each_count(lambda: vjp(g, values, x, needs=(False, True), pattern=pattern)[1]))
    assert _same_bits(_at_each_count(lambda: vjp(g, values, x, needs=(True, False), pattern=pattern)[0]))
    # and they are the right numbers
    dense = np.zeros((n, m))
    dense[pattern.rows, pattern.cols] = values
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(spmm(values, x, pattern=pattern), dense @ x, rtol=tol, atol=tol)
    np.testing.assert_allclose(vjp(g, values, x, needs=(False, True), pattern=pattern)[1], dense.T @ g,
                               rtol=tol, atol=tol)


@FAST
@given(patterns(), st.sampled_from([(), (3,), (2, 5)]))
def test_sddmm_and_segment_reductions_are_bit_identical(force_parallel, case, trailing):
    pattern, rng = case
    n, m = pattern.shape
    be = _numpy()
    p = rng.standard_normal((n, 8)).astype(np.float32)
    q = rng.standard_normal((m, 8)).astype(np.float32)
    assert _same_bits(_at_each_count(lambda: be.kernels[(Op.SDDMM, "csr")](p, q, pattern=pattern)))
    values = rng.standard_normal((pattern.nnz,) + trailing)
    for op in (Op.SEGMENT_SUM, Op.SEGMENT_MAX):
        results = _at_each_count(lambda: be.kernels[(op, "csr")](values, pattern=pattern))
        assert _same_bits(results)
    sums = be.kernels[(Op.SEGMENT_SUM, "csr")](values, pattern=pattern)
    want = np.zeros((n,) + trailing)
    np.add.at(want, pattern.rows, values)
    np.testing.assert_allclose(sums, want, rtol=1e-12, atol=1e-12)


@FAST
@given(st.integers(0, 2**31), st.integers(1, 300), st.integers(0, 3000), st.sampled_from([(), (3,), (2, 2)]),
       st.sampled_from(["uniform", "one_hot_key", "sorted_runs"]))
def test_index_add_bincount_is_bit_identical(force_parallel, seed, n, entries, trailing, kind):
    # the duplicate-summing of construction and the gather-rows backward: bins in ranges, each
    # range summing its entries in input order, as the serial bincount does
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, entries)
    if kind == "one_hot_key":
        rows[: entries // 2] = n // 2  # one bin gets half of everything
    elif kind == "sorted_runs":
        rows = np.sort(rows)  # repeats in runs (not strictly increasing: the bincount path)
    src = (rng.standard_normal((entries,) + trailing) * 10.0 ** rng.integers(-3, 4, entries).reshape(
        (-1,) + (1,) * len(trailing))).astype(np.float32)
    kernel = _numpy().kernels[(Op.INDEX_ADD, "dense")]
    force_parallel.clear()
    results = _at_each_count(lambda: kernel(src, index=(rows,), shape=(n,) + trailing))
    assert _same_bits(results)
    width = int(np.prod(trailing))
    keys = (rows[:, None] * width + np.arange(width)).ravel()  # the serial kernel's linearised bins
    serial = np.bincount(keys, weights=src.reshape(-1).astype(np.float64), minlength=n * width)
    assert _same_bits([results[0], serial.astype(np.float32).reshape((n,) + trailing)])
    if n > 1 and entries > 1 and not (np.diff(rows) > 0).all():  # repeated rows: the bincount path
        assert max(force_parallel) > 1


def test_the_kernels_really_hand_out_blocks(force_parallel):
    rng = np.random.default_rng(0)
    pattern, _, _ = Pattern.from_coo((200, 200), rng.integers(0, 200, 2000), rng.integers(0, 200, 2000))
    be = _numpy()
    pg.set_num_threads(2)
    force_parallel.clear()
    be.kernels[(Op.SPMM, "csr")](np.ones(pattern.nnz), np.ones((200, 4)), pattern=pattern)
    be.vjp_kernels[(Op.SPMM, "csr")](np.ones((200, 4)), np.ones(pattern.nnz), np.ones((200, 4)),
                                     needs=(True, True), pattern=pattern)
    assert len(force_parallel) == 3 and min(force_parallel) > 1


ELEMENTWISE_N = 1 << 20  # the pooled (and so parallel) kernels start at the array pool's threshold


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_kernels_are_bit_identical(force_parallel, dtype):
    rng = np.random.default_rng(1)
    rows = ELEMENTWISE_N // 64
    a = rng.standard_normal((rows, 64)).astype(dtype)
    b = rng.standard_normal((rows, 64)).astype(dtype)
    bias = rng.standard_normal(64).astype(dtype)
    cond = rng.random((rows, 64)) < 0.5
    k = _numpy().kernels
    cases = {
        "add": lambda: k[(Op.ADD, "dense")](a, b),
        "add_broadcast": lambda: k[(Op.ADD, "dense")](a, bias),
        "mul": lambda: k[(Op.MUL, "dense")](a, b),
        "exp": lambda: k[(Op.EXP, "dense")](a),
        "relu": lambda: k[(Op.RELU, "dense")](a),
        "where_zero": lambda: k[(Op.WHERE, "dense")](cond, np.zeros((), dtype), b),
        "where": lambda: k[(Op.WHERE, "dense")](cond, a, b),
        "sum_rows": lambda: k[(Op.SUM, "dense")](a, axes=(1,), keepdims=True),
        "max_rows": lambda: k[(Op.MAX, "dense")](a, axes=(1,), keepdims=False),
        "sum_columns": lambda: k[(Op.SUM, "dense")](a, axes=(0,), keepdims=False),
    }
    for name, fn in cases.items():
        results = _at_each_count(fn)
        assert _same_bits(results), name
    np.testing.assert_array_equal(cases["where"](), np.where(cond, a, b))
    np.testing.assert_allclose(cases["sum_rows"](), a.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(cases["max_rows"](), a.max(axis=1))
    np.testing.assert_allclose(cases["sum_columns"](), a.sum(axis=0, dtype=np.float64), rtol=1e-4)


@pytest.mark.parametrize("shape", [(2708, 16), (3000, 7), (40_000, 8)])
def test_bias_gradient_sum_is_bit_identical_below_the_parallel_size(shape):
    # the two-row GEMM path (BLAS threads follow pg.set_num_threads): same bits at any count
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    before = pg.get_num_threads()
    try:
        got = _at_each_count(lambda: _numpy().kernels[(Op.SUM, "dense")](x, axes=(0,), keepdims=False))
    finally:
        pg.set_num_threads(before)
    assert _same_bits(got)
    np.testing.assert_allclose(got[0], x.sum(axis=0, dtype=np.float64), rtol=1e-4, atol=1e-4)


def _train_gcn(counts: list[int]) -> list[float]:
    """A small GCN trained one step per thread count in ``counts`` (the count changes between steps)."""
    import polygrad.nn as nn
    import polygrad.optim as optim

    rng = np.random.default_rng(3)
    n = 400
    rows, cols = rmat_edges(rng, 9, 3000)
    keep = (rows < n) & (cols < n)
    edge_index = np.stack([rows[keep], cols[keep]])
    x = pg.tensor(rng.standard_normal((n, 32)).astype(np.float32))
    y = rng.integers(0, 4, n)
    pg.manual_seed(0)
    model = nn.GCN(32, 16, 4, dropout=0.5)
    opt = optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for count in counts:
        pg.set_num_threads(count)
        loss = pg.cross_entropy(model(x, edge_index), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gcn_training_is_bit_identical_at_any_thread_count_even_when_it_changes(force_parallel):
    one = _train_gcn([1] * 4)
    assert _train_gcn([2] * 4) == one
    assert _train_gcn([1, 2, 7, 3]) == one
    assert min(force_parallel) >= 1 and max(force_parallel) > 1  # parallel blocks were used


@FAST
@given(st.integers(0, 2**31), st.sampled_from(["rmat", "uniform", "huge_row", "empty_rows", "repeats"]),
       st.integers(1, 3000))
def test_construction_is_identical_at_any_thread_count(seed, kind, edges):
    # a patch of its own per example: the monkeypatch fixture undoes only at the end of the test,
    # so each example would wrap the previous one's spy (a RecursionError at ~1,000 examples)
    with pytest.MonkeyPatch.context() as monkeypatch:
        from polygrad.sparse import pattern as pattern_module

        monkeypatch.setattr(pattern_module, "SORT_PARALLEL_MIN", 0)
        blocks = count_block_runs(monkeypatch, pattern_module)
        rng = np.random.default_rng(seed)
        n = 256
        if kind == "rmat":
            rows, cols = rmat_edges(rng, 8, edges)
        else:
            rows, cols = rng.integers(0, n, edges), rng.integers(0, n, edges)
            if kind == "huge_row":
                rows[: edges // 2] = 7
            elif kind == "empty_rows":
                rows = rows - rows % 3  # two rows in three empty
            elif kind == "repeats":
                rows, cols = rows % 5, cols % 4  # at most 20 distinct entries: mostly duplicates
        # the serial definition: scipy's stable counting sort by row, then each row's columns sorted
        indptr = np.empty(n + 1, dtype=np.int64)
        sorted_cols, perm = np.empty(edges, dtype=np.int64), np.empty(edges, dtype=np.int64)
        _sparsetools.coo_tocsr(n, n, edges, rows, cols, np.arange(edges, dtype=np.int64), indptr, sorted_cols, perm)
        _sparsetools.csr_sort_indices(n, indptr, sorted_cols, perm)
        before = pg.get_num_threads()
        try:
            built = []
            for count in THREAD_COUNTS:
                pg.set_num_threads(count)
                p, perm_got, slot = Pattern.from_coo((n, n), rows, cols)
                built.append((p.indptr, p.cols, perm_got, slot))
                got = pattern_module.sort_by_row(n, n, rows, cols)
                pattern_module.sort_row_indices(n, got[0], got[1], got[2])
                assert all(np.array_equal(a, b) for a, b in zip(got, (indptr, sorted_cols, perm)))
        finally:
            pg.set_num_threads(before)
        for other in built[1:]:
            for a, b in zip(built[0], other):
                assert (a is None and b is None) or np.array_equal(a, b)
        assert edges < 50 or max(blocks) > 1  # the parallel forms really ran (on unordered input)
        # canonical: sorted by (row, col), no repeats; with repeats, each entry's slot holds its key
        p, _, slot = Pattern.from_coo((n, n), rows, cols)
        keys = p.rows * n + p.cols
        assert (np.diff(keys) > 0).all() and set(keys.tolist()) == set((rows * n + cols).tolist())
        if slot is not None:
            assert np.array_equal(keys[slot], rows * n + cols)


def _serial_dropout_mask(size: int, p: float, chunk: int, dtype) -> np.ndarray:
    """The definition a parallel draw must match: dropout's mask drawn in one thread, chunk by
    chunk, from ``pg.rng()`` (16 bits per entry, four per 64-bit word)."""
    from polygrad.nn.layers import DROPOUT_LEVELS

    drop_below = np.uint16(min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1))
    scale = dtype(1.0 / (1.0 - p))
    generator = pg.rng().bit_generator
    mask = np.empty(size, dtype=dtype)
    for lo in range(0, size, chunk):
        n = min(chunk, size - lo)
        bits = generator.random_raw((n + 3) // 4).view(np.uint16)[:n]
        np.multiply(bits >= drop_below, scale, out=mask[lo:lo + n])
    return mask


@FAST
@given(st.lists(st.integers(0, 40), min_size=1, max_size=3), st.sampled_from([0.1, 0.5, 0.9]),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31), st.booleans())
def test_dropout_masks_are_the_serial_draw_at_any_thread_count(monkeypatch, shape, p, dtype, seed, sparse):
    from polygrad.nn import layers
    from polygrad.runtime import random_blocks

    monkeypatch.setattr(random_blocks, "PARALLEL_MIN_WORDS", 0)
    monkeypatch.setattr(layers, "DROPOUT_CHUNK", 8)  # many blocks of 2 words each
    if sparse:
        rng = np.random.default_rng(seed)
        n = max(1, shape[0])
        at = rng.choice(n * n, size=min(30, n * n), replace=False)  # distinct: every stored value is 1
        x = pg.sparse_coo(np.stack(np.divmod(at, n)), np.ones(at.shape[0], dtype), (n, n))
        size = x.nnz
    else:
        x = pg.ones(*shape, dtype=dtype)
        size = int(np.prod(shape))
    pg.manual_seed(seed)
    want = _serial_dropout_mask(size, p, 8, dtype) * np.float64(1)  # the kept entries are 1 x scale
    after = pg.rng().random(3)
    before = pg.get_num_threads()
    try:
        for threads in THREAD_COUNTS:
            pg.set_num_threads(threads)
            pg.manual_seed(seed)
            y = layers.dropout(x, p)
            got = (y.values if sparse else y).numpy().reshape(-1)
            assert got.astype(np.float64).tobytes() == want.tobytes(), threads
            assert pg.rng().random(3).tobytes() == after.tobytes()  # the generator moved as far
    finally:
        pg.set_num_threads(before)
