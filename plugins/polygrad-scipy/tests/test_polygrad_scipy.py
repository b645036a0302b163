"""polygrad-scipy: registration, correctness, conformance; and that it no longer overrides numpy."""
from __future__ import annotations

from importlib.metadata import entry_points

import numpy as np
import pytest
from conftest import installed

import polygrad as pg
from polygrad.errors import ShapeError
from polygrad.sparse.pattern import Pattern
from polygrad.runtime.registry import registry
from polygrad.tensor import spmm
from polygrad.testing import check_grads
from polygrad.testing.conformance import run_conformance
from polygrad.testing.temporary import temporary_plugin


def random_pattern(n: int, m: int, density: float, seed: int) -> Pattern:
    mask = np.random.default_rng(seed).random((n, m)) < density
    rows, cols = np.nonzero(mask)
    return Pattern.from_sorted((n, m), rows, cols)


def dense_of(values: np.ndarray, p: Pattern) -> np.ndarray:
    a = np.zeros(p.shape, dtype=np.float64)
    np.add.at(a, (p.rows, p.cols), values)
    return a


def test_entry_point_declared_with_distribution_name():
    if not installed():
        pytest.skip("polygrad-scipy is not installed (pip install plugins/polygrad-scipy)")
    (ep,) = [ep for ep in entry_points(group="polygrad") if ep.name == "scipy"]
    assert ep.value == "polygrad_scipy" and ep.dist.name == "polygrad-scipy"
    info = {b.name: b for b in pg.list_backends()}["scipy"]
    assert info.available and info.origin == "polygrad-scipy" and info.status == "ok"


def test_registers_backend_and_leaves_numpy_kernels_alone(scipy_plugin):
    # the numpy backend keeps int32 index copies itself now: an override would gain nothing
    import polygrad.backends.numpy as numpy_backend

    assert "scipy" in [b.name for b in pg.list_backends() if b.available]
    spmm_kernel = registry.tables["numpy"][(pg.Op.SPMM, "csr")]
    assert spmm_kernel is not scipy_plugin.kernels.spmm
    assert spmm_kernel.__module__ == numpy_backend.__name__
    assert registry.tables["scipy"][(pg.Op.SPMM, "csr")] is scipy_plugin.kernels.spmm
    assert registry.vjp_tables["scipy"][(pg.Op.SPMM, "csr")] is scipy_plugin.kernels.spmm_vjp


def test_highest_priority_override_wins(scipy_plugin):
    def winner_kernel(*a, **k):
        return None

    class Winner:
        @pg.hookimpl
        def polygrad_kernels(self):
            return [pg.KernelOverride("scipy", "spmm", "csr", winner_kernel, priority=10)]

    class Loser:
        @pg.hookimpl
        def polygrad_kernels(self):
            return [pg.KernelOverride("scipy", "spmm", "csr", lambda *a, **k: None, priority=5)]

    with temporary_plugin(Winner()), temporary_plugin(Loser()):
        assert registry.tables["scipy"][(pg.Op.SPMM, "csr")] is winner_kernel
    assert registry.tables["scipy"][(pg.Op.SPMM, "csr")] is scipy_plugin.kernels.spmm


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("width", [None, 0, 1, 5])
def test_spmm_matches_dense_product(scipy_plugin, dtype, width):
    p = random_pattern(30, 20, 0.15, seed=width or 0)
    rng = np.random.default_rng(1)
    values = (rng.normal(size=p.nnz) * 10).astype(dtype)
    x = (rng.normal(size=(20,) if width is None else (20, width)) * 10).astype(dtype)
    got = scipy_plugin.kernels.spmm(values, x, pattern=p)
    want = dense_of(values.astype(np.float64), p) @ x.astype(np.float64)
    assert got.dtype == np.result_type(values.dtype, x.dtype) and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-3)


def test_spmm_on_strided_and_broadcast_operands(scipy_plugin):
    p = random_pattern(6, 8, 0.4, seed=3)
    values = np.random.default_rng(2).normal(size=p.nnz)
    x = np.random.default_rng(3).normal(size=(4, 8)).T                # non-contiguous
    b = np.broadcast_to(np.arange(8.0)[:, None], (8, 3))              # read-only, zero strides
    for operand in (x, b):
        np.testing.assert_allclose(scipy_plugin.kernels.spmm(values, operand, pattern=p),
                                   dense_of(values, p) @ operand, rtol=1e-12)


def test_spmm_empty_pattern_and_empty_rows(scipy_plugin):
    p = random_pattern(4, 3, 0.0, seed=0)
    out = scipy_plugin.kernels.spmm(np.zeros(0), np.ones((3, 2), dtype=np.float32), pattern=p)
    assert out.shape == (4, 2) and out.dtype == np.float64 and not out.any()


def test_index_arrays_converted_once_per_pattern(scipy_plugin):
    p = random_pattern(10, 10, 0.3, seed=4)
    v = np.ones(p.nnz)
    a = scipy_plugin.kernels.as_csr(v, p)
    b = scipy_plugin.kernels.as_csr(v, p)
    # no per-call copy of the index arrays: both matrices view the cached int32 arrays
    assert np.shares_memory(a.indices, b.indices) and np.shares_memory(a.indptr, b.indptr)
    assert a.indices.dtype == np.int32


def test_gradients_on_both_backends_are_right(scipy_plugin):
    p = random_pattern(7, 5, 0.35, seed=5)
    rng = np.random.default_rng(6)
    check_grads(lambda v, x: spmm(v, x, p).tanh(), [rng.normal(size=p.nnz), rng.normal(size=(5, 3))],
                backend="numpy")
    check_grads(lambda v, x: spmm(v, x, p.with_layout("coo")), [rng.normal(size=p.nnz), rng.normal(size=5)],
                backend="scipy")


def test_fused_backward_kernel_is_the_one_used(scipy_plugin, monkeypatch):
    calls = []
    original = registry.vjp_tables["scipy"][(pg.Op.SPMM, "csr")]

    def counting(*args, **kwargs):
        calls.append(kwargs["needs"])
        return original(*args, **kwargs)

    monkeypatch.setitem(registry.vjp_tables["scipy"], (pg.Op.SPMM, "csr"), counting)
    p = random_pattern(5, 4, 0.5, seed=7)
    v = pg.tensor(np.ones(p.nnz), backend="scipy")
    x = pg.tensor(np.ones((4, 2)), requires_grad=True, backend="scipy")
    spmm(v, x, p).sum().backward()
    assert calls == [(False, True)]          # dA skipped: the values need no gradient
    np.testing.assert_allclose(x.grad.numpy(), dense_of(np.ones(p.nnz), p).T @ np.ones((5, 2)))


def test_shape_errors_raised_before_the_kernel(scipy_plugin):
    p = random_pattern(4, 3, 0.5, seed=8)
    with pytest.raises(ShapeError, match="spmm"):
        spmm(pg.tensor(np.ones(p.nnz), backend="scipy"), pg.tensor(np.ones((4, 2)), backend="scipy"), p)


@pytest.mark.parametrize("backend", ["scipy", "numpy"])
def test_conformance_kit_passes(scipy_plugin, backend):
    report = run_conformance(backend)
    assert report.ok, "\n".join(r.message for r in report.failures)
    assert report.cell(pg.Op.SPMM, "csr") == "pass"
    assert any(r.check == "fused-vjp" and r.status == "pass" for r in report.results)
