"""polygrad-jax: the kit on the jax backend, zero-copy tensors, and steps compiled by jax.jit.

Skipped when jax is not installed.  The plugin is registered from this checkout when it is not
installed, so ``python -m pytest plugins/polygrad-jax/tests`` works either way."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.compile import Call  # noqa: E402
from polygrad.compile.backend_compile import CompiledStep  # noqa: E402
from polygrad.runtime.registry import registry, resolve  # noqa: E402
from polygrad.testing.conformance import run_conformance  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def jax_backend():
    registry.load()
    if "jax" not in [b.name for b in pg.list_backends()]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import polygrad_jax
        pg.register_plugin(polygrad_jax, "polygrad-jax-from-checkout")
    yield


# the sparse kernels (with the kit's inf/NaN and long-row cases) and the dense ops whose JAX form
# differs most from numpy's; `polygrad check jax` runs the whole kit (708 checks, minutes)
KIT_OPS = ["spmm", "sddmm", "segment_sum", "segment_max", "index_add", "getitem", "matmul", "sum", "cast"]


def test_the_kit_passes_on_the_jax_backend() -> None:
    report = run_conformance("jax", ops=KIT_OPS)
    assert report.ok, [r.message for r in report.failures[:5]]
    assert {r.case for r in report.results} >= {"long_rows", "nonfinite_values"}


def test_a_jax_array_becomes_a_tensor_without_a_copy() -> None:
    a = jax.numpy.arange(6.0).reshape(2, 3)
    t = pg.tensor(a)
    assert t.backend == "jax" and t._data is a
    assert pg.tensor(a, requires_grad=True).requires_grad


def _moons_step(backend: str):
    from polygrad import data as pdata
    pg.manual_seed(0)
    X_np, y01 = pdata.make_moons(64, 0.1, seed=1)
    with pg.use_backend(backend):
        X = pg.tensor(X_np, dtype=pg.float64)
        y = pg.tensor((y01 * 2 - 1).astype(np.float64))
        model = nn.MLP(2, [16, 1], init="micrograd", dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.05)

    def step():
        opt.zero_grad()
        loss = nn.max_margin(model(X), y)
        loss.backward()
        opt.step()
        return loss
    return model, step


def test_a_compiled_step_runs_as_one_jit_and_matches_numpy() -> None:
    _, numpy_step = _moons_step("numpy")
    want = [numpy_step().item() for _ in range(10)]
    model, step = _moons_step("jax")
    compiled = pg.compile(step, pure=True)
    with pg.use_backend("jax"):
        got = [compiled().item() for _ in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)   # float64; XLA may reassociate
    (entry,) = compiled._cache.values()
    assert isinstance(entry.capture.fast, CompiledStep) and entry.capture.fast.calls == compiled.stats["replays"] > 0
    assert all(isinstance(p._data, jax.Array) for p in model.parameters())   # updates stayed on device


def test_dropout_masks_are_drawn_by_jax_from_the_seed_the_same_under_jit() -> None:
    from polygrad.nn.layers import DROPOUT_LEVELS
    with pg.use_backend("jax"):
        pg.manual_seed(5)
        a = nn.dropout(pg.ones((50, 40)), 0.3).numpy()
        pg.manual_seed(5)
        b = nn.dropout(pg.ones((50, 40)), 0.3).numpy()
    np.testing.assert_array_equal(a, b)
    assert abs((a == 0).mean() - 0.3) < 0.05 and set(np.unique(a).tolist()) == {0.0, float(np.float32(1 / 0.7))}
    be = resolve("jax")
    attrs = {"shape": (50, 40), "dtype": np.dtype(np.float32), "drop_below": round(0.3 * DROPOUT_LEVELS),
             "scale": 1 / 0.7}
    eager = be.random_mask(7, 11, **attrs)
    jitted = jax.jit(lambda k0, k1: be.random_mask(k0, k1, **attrs))(7, 11)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


@pytest.mark.parametrize("shape", [(1,), (5,), (7, 3), (40001,)])
def test_16_bit_draws_are_slices_of_whole_threefry_words_with_the_shape_asked(shape) -> None:
    from polygrad_jax.backend import X64, draw_uint16
    key = jax.random.key(3)
    bits = np.asarray(draw_uint16(key, shape))
    assert bits.shape == shape and bits.dtype == np.uint16
    word = np.uint64 if X64 else np.uint32   # the words JAX draws, cut into 16-bit pieces in order
    n = int(np.prod(shape))
    words = np.asarray(jax.random.bits(key, (-(-n // (np.dtype(word).itemsize // 2)),), word))
    np.testing.assert_array_equal(bits.reshape(-1), words.view(np.uint16)[:n])


def test_16_bit_draws_are_uniform_and_pieces_of_one_word_uncorrelated() -> None:
    from polygrad_jax.backend import draw_uint16
    bits = np.asarray(draw_uint16(jax.random.key(11), (4 * 20000,))).astype(np.float64)
    assert abs(bits.mean() / 65535 - 0.5) < 0.005          # 80000 draws: standard error 0.001
    assert abs((bits >= 32768).mean() - 0.5) < 0.01
    assert abs((bits < 6554).mean() - 0.1) < 0.005
    pieces = bits.reshape(-1, 4)                             # the four 16-bit pieces of one 64-bit word
    for i in range(3):
        assert abs(np.corrcoef(pieces[:, i], pieces[:, i + 1])[0, 1]) < 0.03


def _number_step(arrays, numbers):
    """A step reading host numbers the ways an optimizer and a draw do: number times array, number
    with number (computed at the number's own precision), an int made into an array."""
    (a, b), ((lr, beta), (k,)) = arrays, numbers
    return [a * lr + b * (1.0 - beta), (lr * beta) * b, jax.numpy.asarray(k) + 1]


@given(lr=st.floats(-1e6, 1e6), beta=st.floats(0, 1), k=st.integers(0, 2 ** 31 - 1),
       dtype=st.sampled_from([np.float32, np.float64]))
@settings(max_examples=25, deadline=None)
def test_packed_host_numbers_give_the_bits_and_dtypes_of_numbers_passed_one_by_one(lr, beta, k, dtype) -> None:
    from polygrad_jax.compile import PackedStep
    step = PackedStep(_number_step)
    arrays = [jax.numpy.asarray(np.linspace(-3, 3, 7, dtype=dtype)), jax.numpy.asarray(np.ones(7, dtype))]
    numbers = [(lr, beta), (k,)]
    got = step(*arrays, numbers)
    want = jax.jit(_number_step)(arrays, numbers)
    assert step.packed and all(fn is not step.unpacked for fn in step.packed.values())   # it packed them
    assert got[0].dtype == got[1].dtype == dtype   # weak numbers: the array's dtype, as without packing
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_host_numbers_that_cannot_be_packed_go_in_one_by_one() -> None:
    from polygrad_jax.compile import PackedStep
    step = PackedStep(_number_step)
    arrays = [jax.numpy.ones(3, np.float32), jax.numpy.ones(3, np.float32)]
    for numbers in ([(0.5, True), (3,)], [(0.5, 0.25), (2 ** 70,)]):   # a bool; an int beyond int64
        try:
            want = [np.asarray(a) for a in jax.jit(_number_step)(arrays, numbers)]
        except Exception as exc:  # noqa: BLE001 - then the packed step raises what jax.jit raises
            with pytest.raises(type(exc)):
                step(*arrays, numbers)
            continue
        got = step(*arrays, numbers)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w)
    assert step.packed[((2, 1), (float, bool, int))] is step.unpacked


def _dropout_gcn_step():
    """A sparse two-layer step with input and hidden dropout and Adam, on the jax backend."""
    rng = np.random.default_rng(0)
    n, f = 40, 12
    edges = rng.integers(0, n, size=(2, 160))
    with pg.use_backend("jax"):
        pg.manual_seed(1)
        a = pg.from_edge_index(edges, n)
        x = pg.tensor(rng.normal(size=(n, f)))
        lin1, lin2 = nn.Linear(f, 8, dtype=pg.float64), nn.Linear(8, 3, dtype=pg.float64)
        y = pg.tensor(rng.integers(0, 3, size=n))
        opt = optim.Adam([*lin1.parameters(), *lin2.parameters()], lr=0.02, weight_decay=5e-4)

    def step():
        opt.zero_grad()
        h = nn.dropout((a @ lin1(nn.dropout(x, 0.5))).relu(), 0.5)
        loss = nn.cross_entropy(a @ lin2(h), y)
        loss.backward()
        opt.step()
        return loss
    return [*lin1.parameters(), *lin2.parameters()], opt, step


def test_a_compiled_step_draws_and_updates_on_device_and_equals_its_eager_run() -> None:
    params, opt, step = _dropout_gcn_step()
    with pg.use_backend("jax"):
        eager = [step().item() for _ in range(6)]
    eager_params = [p.numpy() for p in params]
    params, opt, step = _dropout_gcn_step()
    compiled = pg.compile(step, pure=True)
    with pg.use_backend("jax"):
        got = [compiled().item() for _ in range(6)]
    np.testing.assert_allclose(got, eager, rtol=1e-9, atol=1e-12)   # float64; XLA may reassociate
    for a, b in zip(eager_params, params):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-12)
    (entry,) = compiled._cache.values()
    fast = entry.capture.fast
    assert isinstance(fast, CompiledStep) and fast.calls == compiled.stats["replays"] == 3
    calls = [e for e in fast.program.entries if isinstance(e, Call)]   # all inside the jit:
    assert sum(getattr(e.fn, "fn", None) == resolve("jax").random_mask for e in calls) == 2   # two draws
    assert len(calls) == 6   # and four parameter updates
    assert opt.step_count == 6 and all(isinstance(v, jax.Array) for st in opt.state.values()
                                       for v in st.values() if not isinstance(v, int))
    from polygrad_jax.compile import _transposed_products   # the backward's A^T @ g, both of them,
    assert len(_transposed_products(fast.program.entries, pg.kernel_table("jax"))) == 2   # ran untransposed


@st.composite
def _sparse_case(draw):
    n, m = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    cells = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, m - 1)), max_size=30, unique=True))
    rows = np.array([c[0] for c in cells], np.int64)
    cols = np.array([c[1] for c in cells], np.int64)
    values = np.array(draw(st.lists(st.floats(-4, 4) | st.sampled_from([np.inf, -np.inf]),
                                    min_size=len(cells), max_size=len(cells))), np.float64)
    width = draw(st.sampled_from([None, 1, 3]))   # x as a vector or a matrix
    x = np.asarray(draw(st.lists(st.floats(-4, 4), min_size=n * (width or 1), max_size=n * (width or 1))))
    return (n, m), rows, cols, values, x.reshape((n,) if width is None else (n, width))


@given(case=_sparse_case())
@settings(max_examples=40, deadline=None)
def test_the_transposed_product_equals_the_gather_and_spmm_over_the_transpose(case) -> None:
    """``spmm_transposed`` (what a compiled step runs for a backward's ``A^T @ g``) against what
    it replaces: the values gathered into the transpose's order, then ``spmm`` over it."""
    from polygrad.sparse.pattern import Pattern
    from polygrad_jax.kernels import getitem, spmm, spmm_transposed
    shape, rows, cols, values, x = case
    pattern, perm, _ = Pattern.from_coo(shape, rows, cols)
    if perm is not None:
        values = values[perm]   # the values in the pattern's own order
    transpose, tperm = pattern.transpose()
    vals, xs = jax.numpy.asarray(values), jax.numpy.asarray(x)
    want = np.asarray(spmm(getitem(vals, index=(tperm,)), xs, pattern=transpose))
    got = np.asarray(spmm_transposed(vals, xs, pattern=pattern))
    assert got.shape == want.shape == (shape[1], *x.shape[1:])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)   # inf and NaN where it has them


def test_without_64_bit_mode_integer_sums_are_int32_and_the_kit_passes() -> None:
    """POLYGRAD_JAX_X64=0 (JAX's default float32/int32): the backend declares no int64, so integer
    sums are int32 (as JAX's own), with no fallback; the kit skips casts to 64-bit dtypes."""
    import os
    import subprocess
    code = ("import warnings, numpy as np, polygrad as pg\n"
            "warnings.simplefilter('error', pg.errors.FallbackWarning)\n"
            "from polygrad.testing.conformance import run_conformance\n"
            "t = pg.tensor(np.array([1, 2, 3], np.int32), backend='jax')\n"
            "assert t.sum().dtype == np.int32 and t.sum().item() == 6\n"
            "r = run_conformance('jax', ops=['sum', 'cast'])\n"
            "assert r.ok, [f.message for f in r.failures[:3]]\n")
    env = {**os.environ, "POLYGRAD_JAX_X64": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-W", "ignore::UserWarning", "-c", code], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
