"""The CuPy backend.

Three kinds of check:

* **Backend-parametrised checks** (forward against numpy / dense references, gradients against
  float64 central differences, determinism, transfers) run on ``numpy``, on ``fake-cupy`` and on
  ``cupy``.  ``cupy`` is the real GPU backend: it runs when a CUDA device is present and is
  skipped otherwise with the backend's own reason ("cupy not installed (...)" / "no CUDA device:
  ...").  ``fake-cupy`` is the real ``CupyBackend`` code on an injected fake ``cupy`` module:
  numpy's namespace plus the few cupy-only attributes the backend uses, a cuSPARSE stand-in that
  checks what cuSPARSE would refuse, and a ``RawKernel`` that compiles polygrad's CUDA sources with the host C++
  compiler and runs them thread by thread -- so the CUDA code, the launch arguments and the
  backend's logic all run in CI on CPU.
* **Availability** logic (lazy, two separate checks, reasons, install hint), through loaders.
* **CuPy-specific paths**: csr_matrix caching and flags, int32/int64 index choice, the
  no-copy transposed operand, out-of-memory -> fallback chain -> numpy, memory reporting.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import polygrad as pg
from polygrad.backends import cupy as cupy_backend
from polygrad.backends.cupy import CupyBackend, CupyModules
from polygrad.errors import BackendError, BackendUnavailableError, SparseIndexError
from polygrad.ir.ops import Op
from polygrad.sparse.pattern import Pattern
from polygrad.runtime.registry import _Entry, registry
from polygrad.tensor import sddmm, segment_max, segment_sum, spmm

from ..helpers import analytic_grads, numerical_grads

REPO = Path(__file__).resolve().parents[2]
CXX = os.environ.get("CXX", "g++")


# ---------------------------------------------------------------------------------------------
# the fake cupy
# ---------------------------------------------------------------------------------------------

_PRELUDE = """
struct polygrad_dim3 { unsigned int x, y, z; };
static polygrad_dim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" void polygrad_set_launch(unsigned int b, unsigned int t, unsigned int nb, unsigned int nt) {
    blockIdx.x = b; threadIdx.x = t; gridDim.x = nb; blockDim.x = nt;
}
#define __global__
"""
_BUILD_DIR = Path(tempfile.gettempdir()) / f"polygrad-hostkernels-{os.getuid()}"
_LIBS: dict[str, ctypes.CDLL] = {}


def _have_compiler() -> bool:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


HAVE_CXX = _have_compiler()


class HostRawKernel:
    """``cupy.RawKernel`` stand-in: compiles the CUDA source with the host C++ compiler and runs
    it block by block, thread by thread (a small grid: every kernel uses a grid-stride loop, so
    any launch size must give the same answer -- which this also checks)."""

    launches: list = []

    def __init__(self, code: str, name: str, **_: object) -> None:
        self.code, self.name = code, name
        src = _PRELUDE + code
        digest = hashlib.sha256(src.encode()).hexdigest()[:16]
        lib = _LIBS.get(digest)
        if lib is None:
            _BUILD_DIR.mkdir(exist_ok=True)
            so = _BUILD_DIR / f"k{digest}.so"
            if not so.exists():
                cpp = _BUILD_DIR / f"k{digest}.cpp"
                cpp.write_text(src)
                tmp = _BUILD_DIR / f"k{digest}.{os.getpid()}.so"
                r = subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(tmp), str(cpp)],
                                   capture_output=True, text=True)
                if r.returncode:
                    raise RuntimeError(f"host compile of {name} failed:\n{r.stderr}")
                os.replace(tmp, so)
            lib = _LIBS[digest] = ctypes.CDLL(str(so))
        self.fn = getattr(lib, name)
        self.fn.restype = None
        self.set_launch = lib.polygrad_set_launch

    @staticmethod
    def _arg(a):
        if isinstance(a, np.ndarray):
            return ctypes.c_void_p(a.ctypes.data)
        if isinstance(a, np.int64):
            return ctypes.c_longlong(int(a))
        if isinstance(a, np.int32):
            return ctypes.c_int(int(a))
        raise TypeError(f"kernel argument of unexpected type {type(a).__name__}: RawKernel args must be "
                        f"arrays or numpy scalars of the exact C type")

    def __call__(self, grid, block, args):
        assert grid[0] >= 1 and block[0] >= 1
        HostRawKernel.launches.append((self.name, grid, block))
        cargs = [self._arg(a) for a in args]
        nb, nt = min(grid[0], 2), min(block[0], 3)
        for b in range(nb):
            for t in range(nt):
                self.set_launch(b, t, nb, nt)
                self.fn(*cargs)


class FakeOutOfMemoryError(MemoryError):
    """Stands in for cupy.cuda.memory.OutOfMemoryError (also a MemoryError)."""


class FakeCUDARuntimeError(RuntimeError):
    pass


FakeCUDARuntimeError.__name__ = "CUDARuntimeError"


def fake_cupy(device_count=1, count_error=None, alloc_error=None, free=3 << 30, pooled=1 << 20):
    """A module named ``cupy`` whose namespace is numpy's plus the cupy-only names the backend uses."""
    mod = types.ModuleType("cupy")
    for k in dir(np):
        if not k.startswith("_"):
            setattr(mod, k, getattr(np, k))
    mod.__version__ = "fake"
    mod.asnumpy = lambda a: np.array(a, copy=True)
    mod.RawKernel = HostRawKernel

    def get_count():
        if count_error is not None:
            raise count_error
        return device_count

    def zeros(*a, **k):
        if alloc_error is not None:
            raise alloc_error
        return np.zeros(*a, **k)

    mod.zeros = zeros
    runtime = SimpleNamespace(getDeviceCount=get_count, deviceSynchronize=lambda: None,
                              memGetInfo=lambda: (free, 8 << 30),
                              getDeviceProperties=lambda i: {"name": b"Fake GPU"})
    mod.cuda = SimpleNamespace(runtime=runtime, Device=lambda: SimpleNamespace(id=0),
                               memory=SimpleNamespace(OutOfMemoryError=FakeOutOfMemoryError))
    mod.get_default_memory_pool = lambda: SimpleNamespace(free_bytes=lambda: pooled)
    return mod


class FakeCusparse:
    """``cupyx.cusparse`` stand-in: checks what real cuSPARSE would refuse
    (a non-canonical matrix, a dense operand that is not column-major) and records each call."""

    def __init__(self, fail_transb=None, raise_exc=None):
        self.calls: list[dict] = []
        self.fail_transb = fail_transb
        self.raise_exc = raise_exc

    def check_availability(self, name):
        return True

    def spmm(self, a, b, c=None, alpha=1, beta=0, transa=False, transb=False):
        if self.raise_exc is not None:
            raise self.raise_exc
        if transb and self.fail_transb is not None:
            raise self.fail_transb
        assert b.flags.f_contiguous, "cuSPARSE needs a column-major dense operand"
        assert a.has_canonical_format and a.has_sorted_indices
        self.calls.append({"a": a, "b": b, "transb": transb})
        dense = b.T if transb else b
        return np.asfortranarray(a @ dense)


class FakeCSR:
    """``cupyx.scipy.sparse.csr_matrix`` stand-in: keeps the arrays it is given (copy=False)."""

    def __init__(self, arg, shape, copy=False):
        assert copy is False
        self.data, self.indices, self.indptr = arg
        self.shape = tuple(shape)
        self.has_canonical_format = self.has_sorted_indices = False

    def __matmul__(self, dense):
        rows = np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))
        out = np.zeros((self.shape[0],) + dense.shape[1:], dtype=np.result_type(self.data, dense))
        np.add.at(out, rows, self.data.reshape((-1,) + (1,) * (dense.ndim - 1)) * dense[self.indices])
        return out


def fake_modules(cusparse=None, **kw) -> CupyModules:
    if cusparse is False:
        return CupyModules(cupy=fake_cupy(**kw), cusparse_error="ImportError: no cuSPARSE on this fake")
    return CupyModules(cupy=fake_cupy(**kw), sparse=SimpleNamespace(csr_matrix=FakeCSR),
                       cusparse=cusparse or FakeCusparse())


def install_as_cupy(monkeypatch, be: CupyBackend) -> CupyBackend:
    """Make ``be`` the registry's "cupy" backend for this test (restored afterwards)."""
    assert be.is_available(), be.unavailable_reason()
    registry.load()
    monkeypatch.setitem(registry.entries, "cupy", _Entry("cupy", "<test>", backend=be, available=True))
    monkeypatch.setitem(registry.tables, "cupy", dict(be.kernels))
    monkeypatch.setitem(registry.vjp_tables, "cupy", {})
    return be


needs_cxx = pytest.mark.skipif(not HAVE_CXX, reason=f"no host C++ compiler ({CXX}) to run the CUDA sources on CPU")


@pytest.fixture
def fake_gpu(monkeypatch):
    if not HAVE_CXX:
        pytest.skip(f"no host C++ compiler ({CXX}) to run the CUDA sources on CPU")
    return install_as_cupy(monkeypatch, CupyBackend(loader=fake_modules))


def real_cupy_reason() -> str:
    """'' when the real cupy backend runs here, else the registry's reason."""
    for info in pg.list_backends():
        if info.name == "cupy":
            return "" if info.available else info.reason
    return "cupy backend not registered (is polygrad installed with its entry points?)"


@pytest.fixture(params=["numpy", "fake-cupy", "cupy"])
def bk(request) -> str:
    """Backend name for the parametrised checks ("cupy" for both the fake and the real GPU)."""
    if request.param == "fake-cupy":
        request.getfixturevalue("fake_gpu")
        return "cupy"
    if request.param == "cupy":
        reason = real_cupy_reason()
        if reason:
            pytest.skip(f"cupy backend unavailable: {reason}")
    return request.param


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def random_pattern(n, m, density, seed=0, empty_rows=()):
    rng = np.random.default_rng(seed)
    mask = rng.random((n, m)) < density
    for r in empty_rows:
        mask[r] = False
    rows, cols = np.nonzero(mask)  # row-major, columns sorted: canonical
    return Pattern.from_sorted((n, m), rows, cols)


def dense_of(pattern, values):
    a = np.zeros(pattern.shape, dtype=np.result_type(values.dtype, np.float64))
    a[pattern.rows, pattern.cols] = values
    return a


def t(a, bk, **kw):
    return pg.tensor(np.asarray(a), backend=bk, **kw)


# ---------------------------------------------------------------------------------------------
# backend-parametrised checks
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("xdim", [1, 2])
def test_spmm_matches_dense(bk, dtype, xdim):
    p = random_pattern(13, 9, 0.3, seed=1, empty_rows=(0, 5))
    rng = np.random.default_rng(2)
    vals = (rng.integers(-3, 4, p.nnz) if dtype == np.int64 else rng.standard_normal(p.nnz)).astype(dtype)
    x = (rng.integers(-3, 4, (9, 4)) if dtype == np.int64 else rng.standard_normal((9, 4))).astype(dtype)
    x = x[:, 0] if xdim == 1 else x
    out = spmm(t(vals, bk), t(x, bk), p)
    assert out.shape == ((13,) if xdim == 1 else (13, 4)) and out.dtype == dtype
    want = dense_of(p, vals) @ x
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


def test_spmm_strided_and_mixed_dtype_operands(bk):
    p = random_pattern(10, 7, 0.4, seed=3)
    rng = np.random.default_rng(4)
    vals = rng.standard_normal(p.nnz).astype(np.float32)
    xt = rng.standard_normal((5, 7))                       # float64
    x_f = t(xt, bk).T                                      # a transposed (column-major) view
    out = spmm(t(vals, bk), x_f, p)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), dense_of(p, vals) @ xt.T, rtol=1e-6)
    x_slice = t(rng.standard_normal((7, 12)), bk)[:, ::3]  # neither C- nor F-contiguous
    np.testing.assert_allclose(spmm(t(vals, bk), x_slice, p).numpy(),
                               dense_of(p, vals) @ x_slice.numpy(), rtol=1e-6)


def test_spmm_empty_pattern_and_zero_width(bk):
    p = random_pattern(4, 3, 0.0)
    assert p.nnz == 0
    out = spmm(t(np.zeros(0, np.float32), bk), t(np.ones((3, 2), np.float32), bk), p)
    np.testing.assert_array_equal(out.numpy(), np.zeros((4, 2)))
    p2 = random_pattern(4, 3, 0.6, seed=1)
    out = spmm(t(np.ones(p2.nnz, np.float64), bk), t(np.ones((3, 0)), bk), p2)
    assert out.shape == (4, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sddmm_matches_dense(bk, dtype):
    p = random_pattern(8, 11, 0.35, seed=5, empty_rows=(2,))
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 5)).astype(dtype)
    b = rng.standard_normal((11, 5)).astype(dtype)
    out = sddmm(t(a, bk), t(b, bk), p)
    assert out.shape == (p.nnz,) and out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), (a @ b.T)[p.rows, p.cols], rtol=1e-5, atol=1e-6)
    # strided operands (a transposed view, a column slice) need no copies and give the same
    bt = t(np.ascontiguousarray(b.T), bk).T
    a_wide = t(np.repeat(a, 2, axis=1), bk)[:, ::2]
    np.testing.assert_allclose(sddmm(a_wide, bt, p).numpy(), out.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_segment_sum_and_max(bk, dtype):
    p = random_pattern(9, 6, 0.4, seed=7, empty_rows=(0, 4, 8))
    rng = np.random.default_rng(8)
    vals = (rng.standard_normal(p.nnz) * 10).astype(dtype)
    s = segment_sum(t(vals, bk), p).numpy()
    m = segment_max(t(vals, bk), p).numpy()
    want_s = np.zeros(9, dtype)
    np.add.at(want_s, p.rows, vals)
    want_m = np.zeros(9, dtype)
    for r in range(9):
        seg = vals[p.indptr[r]:p.indptr[r + 1]]
        if seg.size:
            want_m[r] = seg.max()
    assert s.dtype == dtype and m.dtype == dtype
    np.testing.assert_allclose(s, want_s, rtol=1e-5)
    np.testing.assert_array_equal(m, want_m)


def test_segment_max_propagates_nan(bk):
    p = random_pattern(3, 4, 1.0)
    vals = np.arange(12, dtype=np.float64)
    vals[5] = np.nan
    m = segment_max(t(vals, bk), p).numpy()
    assert np.isnan(m[1]) and m[0] == 3 and m[2] == 11


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_index_add_rows_with_duplicates(bk, dtype):
    rng = np.random.default_rng(9)
    idx = np.array([3, 0, 3, -1, 2, 3, 0, 5], dtype=np.int64)   # -1 is row 5
    src = rng.standard_normal((8, 4)) * 4
    src = (src > 0) if dtype == np.bool_ else src.astype(dtype)
    out = pg.index_add(t(src, bk), t(idx, bk), (6, 4)).numpy()
    want = np.zeros((6, 4), dtype=dtype)
    np.add.at(want, idx, src)
    assert out.dtype == dtype
    if bk == "cupy":
        # the sort-based segment sums add each target's rows in index order, as np.add.at does:
        # bitwise equal, run after run (no atomics)
        np.testing.assert_array_equal(out, want)
    else:  # numpy accumulates in float64 (bincount) and rounds once: close, not identical
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_index_add_general_index(bk):
    rng = np.random.default_rng(10)
    rows = np.array([1, 1, 0, 2, 1])
    cols = np.array([0, 0, 3, 3, 0])
    src = rng.standard_normal(5).astype(np.float32)
    out = pg.index_add(t(src, bk), (t(rows, bk), t(cols, bk)), (3, 4)).numpy()
    want = np.zeros((3, 4), np.float32)
    np.add.at(want, (rows, cols), src)
    np.testing.assert_array_equal(out, want)
    # slices plus an index array, with a broadcast source
    out2 = pg.index_add(t(np.float64(2.0), bk), (slice(None), t(np.array([2, 2, 0]), bk)), (2, 3)).numpy()
    want2 = np.zeros((2, 3))
    np.add.at(want2, (slice(None), np.array([2, 2, 0])), 2.0)
    np.testing.assert_array_equal(out2, want2)


def test_spmm_gradients_match_central_differences(bk):
    p = random_pattern(6, 5, 0.5, seed=11, empty_rows=(3,))
    rng = np.random.default_rng(12)
    vals, x = rng.standard_normal(p.nnz), rng.standard_normal((5, 3))
    w = rng.standard_normal((6, 3))

    def f(v, xx):
        return spmm(v, xx, p).tanh()

    _, got = analytic_grads(f, [vals, x], bk, weights=w)
    want = numerical_grads(f, [vals, x], "numpy", weights=w)
    for g, n in zip(got, want):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-8)


def test_gather_rows_gradient_uses_index_add(bk):
    # x[idx] backward is an INDEX_ADD with repeated rows: the GCN readout path
    rng = np.random.default_rng(13)
    x = rng.standard_normal((5, 3))
    idx = np.array([4, 1, 1, 0, 4, 4])
    w = rng.standard_normal((6, 3))

    def f(xx):
        return (xx[idx] * 1.5).exp()

    _, got = analytic_grads(f, [x], bk, weights=w)
    want = numerical_grads(f, [x], "numpy", weights=w)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-8)


def test_sddmm_gradients_match_central_differences(bk):
    p = random_pattern(4, 6, 0.5, seed=14)
    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((6, 3))
    w = rng.standard_normal(p.nnz)
    _, got = analytic_grads(lambda u, v: sddmm(u, v, p), [a, b], bk, weights=w)
    want = numerical_grads(lambda u, v: sddmm(u, v, p), [a, b], "numpy", weights=w)
    for g, n in zip(got, want):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-8)


def test_dense_ops_forward_and_backward_agree_with_numpy(bk):
    rng = np.random.default_rng(16)
    arrays = [rng.standard_normal((4, 3)), rng.standard_normal((3, 2)), rng.standard_normal(2)]

    def f(x, w, b):
        h = (x @ w + b).relu() * 2 - x.sum(axis=1, keepdims=True)
        return pg.concat([h.sigmoid(), h.max(axis=0, keepdims=True)], axis=0).log_softmax(axis=1)

    out, grads = analytic_grads(f, arrays, bk)
    out_n, grads_n = analytic_grads(f, arrays, "numpy")
    np.testing.assert_allclose(out, out_n, rtol=1e-12)
    for g, n in zip(grads, grads_n):
        np.testing.assert_allclose(g, n, rtol=1e-10, atol=1e-12)


def test_kernels_are_deterministic(bk):
    p = random_pattern(40, 30, 0.3, seed=17)
    rng = np.random.default_rng(18)
    vals = t(rng.standard_normal(p.nnz).astype(np.float32), bk)
    x = t(rng.standard_normal((30, 16)).astype(np.float32), bk)
    idx = t(rng.integers(0, 7, 300), bk)
    src = t(rng.standard_normal((300, 16)).astype(np.float32), bk)
    p2 = random_pattern(20, 30, 0.3, seed=19)

    def run():
        return (spmm(vals, x, p).numpy(), sddmm(x[:20], x, p2).numpy(),
                pg.index_add(src, idx, (7, 16)).numpy(), segment_sum(vals, p).numpy())

    first, second = run(), run()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_])
def test_transfers_round_trip(bk, dtype):
    a = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
    x = pg.tensor(a)                        # numpy
    on = x.to(bk)
    assert on.backend == bk and on.dtype == dtype and on.shape == (3, 4)
    back = on.to("numpy")
    assert back.backend == "numpy" and back.dtype == dtype
    np.testing.assert_array_equal(back.numpy(), a)
    w = pg.tensor(a.astype(np.float32), backend=bk, requires_grad=True)
    assert w.to("numpy").requires_grad  # a leaf stays a leaf


def test_dlpack_round_trip(bk):
    x = pg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), backend=bk)
    y = pg.from_dlpack(x, backend=bk)
    assert y.backend == bk and y.shape == (2, 3) and y.dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    if bk == "numpy":
        assert np.shares_memory(y._data, x._data)


# ---------------------------------------------------------------------------------------------
# availability
# ---------------------------------------------------------------------------------------------

def test_construction_and_registration_touch_no_cupy():
    calls = []

    def loader():
        calls.append(1)
        return fake_modules()

    be = CupyBackend(loader=loader)
    assert (Op.SPMM, "csr") in be.kernels and (Op.ADD, "dense") in be.kernels
    assert not be.owns(np.zeros(2)) and calls == []     # answered without loading cupy
    assert be.is_available() and calls == [1]
    assert be.is_available() and be.unavailable_reason() == "available" and calls == [1]  # cached


def test_not_installed_reason_and_hint():
    def loader():
        raise ModuleNotFoundError("No module named 'cupy'", name="cupy")

    be = CupyBackend(loader=loader)
    assert not be.is_available()
    reason = be.unavailable_reason()
    assert reason.startswith("cupy not installed") and "pip install polygrad-core[cuda]" in reason
    with pytest.raises(BackendUnavailableError) as err:
        be.modules()
    assert str(err.value).count("pip install polygrad-core[cuda]") == 1
    assert be.memory_available() is None


def test_broken_cupy_install_is_not_called_missing():
    def loader():
        raise OSError("libcudart.so.12: cannot open shared object file")

    be = CupyBackend(loader=loader)
    assert be.unavailable_reason().startswith("cupy failed to import (OSError: libcudart.so.12")


@pytest.mark.parametrize("kw, expect", [
    ({"device_count": 0}, "no CUDA device: RuntimeError: the CUDA runtime reports 0 devices"),
    ({"count_error": FakeCUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")},
     "no CUDA device: CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected"),
    ({"alloc_error": FakeCUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")},
     "no CUDA device: CUDARuntimeError: cudaErrorInsufficientDriver"),
])
def test_no_device_reasons(kw, expect):
    be = CupyBackend(loader=lambda: fake_modules(**kw))
    assert not be.is_available()
    assert be.unavailable_reason().startswith(expect)
    assert be.install_hint == "pip install polygrad-core[cuda]"


def test_registry_lists_cupy_and_refuses_selection_with_reason():
    reason = real_cupy_reason()
    if not reason:
        pytest.skip("a usable GPU is present: nothing to refuse")
    info = [b for b in pg.list_backends() if b.name == "cupy"][0]
    assert not info.available and info.status == "unavailable"
    assert info.reason.startswith(("cupy not installed", "no CUDA device", "cupy failed to import"))
    with pytest.raises(BackendUnavailableError) as err:
        pg.set_backend("cupy")
    assert info.reason in str(err.value) and "pip install polygrad-core[cuda]" in str(err.value)
    with pytest.raises(BackendUnavailableError):
        pg.tensor([1.0]).to("cupy")


def _run_py(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)  # PYTHONPATH included: polygrad may be importable only through it
    env.pop("POLYGRAD_BACKEND", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=120)


def test_module_imports_without_cupy_and_reports_it():
    r = _run_py(
        "import sys; sys.modules['cupy'] = None\n"          # makes `import cupy` fail
        "import polygrad as pg\n"
        "info = [b for b in pg.list_backends() if b.name == 'cupy'][0]\n"
        "print(info.available, info.reason)\n"
        "try:\n    pg.use_backend('cupy').__enter__()\n"
        "except pg.errors.BackendUnavailableError as e:\n    print('ERR', e)\n")
    assert r.returncode == 0, r.stderr
    first, err = r.stdout.splitlines()[:2]
    assert first.startswith("False cupy not installed")
    assert err.startswith("ERR backend 'cupy' is not available: cupy not installed")
    assert err.count("pip install polygrad-core[cuda]") == 1


def test_using_polygrad_does_not_import_cupy():
    r = _run_py("import sys, polygrad as pg\n"
                "x = pg.tensor([[1.0, 2.0]], requires_grad=True); (x * x).sum().backward()\n"
                "print('cupy' in sys.modules)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# cupy-specific paths (fake cupy)
# ---------------------------------------------------------------------------------------------

@needs_cxx
def test_csr_matrix_is_built_once_per_pattern_with_flags_and_int32_indices(monkeypatch):
    cus = FakeCusparse()
    be = install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=cus)))
    mods = be.modules()
    built = []
    real_csr = mods.sparse.csr_matrix
    monkeypatch.setattr(mods, "sparse",
                        SimpleNamespace(csr_matrix=lambda *a, **k: built.append(1) or real_csr(*a, **k)))
    p = random_pattern(12, 10, 0.3, seed=20)
    rng = np.random.default_rng(21)
    x = pg.tensor(rng.standard_normal((10, 8)).astype(np.float32), backend="cupy")
    for seed in range(3):
        vals = pg.tensor(np.random.default_rng(seed).standard_normal(p.nnz).astype(np.float32), backend="cupy")
        out = spmm(vals, x, p)
        np.testing.assert_allclose(out.numpy(), dense_of(p, vals.numpy()) @ x.numpy(), rtol=1e-5)
    assert len(built) == 1 and len(cus.calls) == 3
    template = be.csr_matrix(p, np.float32)
    assert template.has_canonical_format and template.has_sorted_indices
    indptr, _, cols = be.device_indices(p)
    assert cols.dtype == np.int32 and indptr.dtype == np.int32
    assert np.shares_memory(template.indices, cols) and np.shares_memory(template.indptr, indptr)
    # each call brought its own values: the template never held them (no shared mutable state)
    assert all(c["a"] is not template for c in cus.calls) and template.data.size == 0
    # row-major X went to cuSPARSE as the column-major view X.T: no copy
    assert all(c["transb"] and np.shares_memory(c["b"], x._data) for c in cus.calls)
    # a float64 product gets its own template; the cache dies with the pattern
    spmm(vals.cast(np.float64), x.cast(np.float64), p)
    assert len(built) == 2 and len(be._csr_cache) == 1
    del p, template
    import gc
    gc.collect()
    assert len(be._csr_cache) == 0


@needs_cxx
def test_column_major_operand_goes_without_transpose(monkeypatch):
    cus = FakeCusparse()
    be = install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=cus)))
    p = random_pattern(6, 5, 0.5, seed=22)
    xt = np.random.default_rng(23).standard_normal((4, 5))
    x_f = pg.tensor(xt, backend="cupy").T
    spmm(pg.tensor(np.ones(p.nnz), backend="cupy"), x_f, p)
    assert cus.calls[-1]["transb"] is False and np.shares_memory(cus.calls[-1]["b"], x_f._data)
    assert be.cusparse_transb


@needs_cxx
def test_cusparse_refusing_transposed_operand_is_remembered(monkeypatch):
    cus = FakeCusparse(fail_transb=ValueError("CUSPARSE_STATUS_NOT_SUPPORTED"))
    be = install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=cus)))
    p = random_pattern(6, 5, 0.5, seed=24)
    vals, x = np.ones(p.nnz), np.random.default_rng(25).standard_normal((5, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # served by cuSPARSE's copying path, not by the fallback
        out = spmm(pg.tensor(vals, backend="cupy"), pg.tensor(x, backend="cupy"), p)
    np.testing.assert_allclose(out.numpy(), dense_of(p, vals) @ x)
    assert not be.cusparse_transb and cus.calls[-1]["transb"] is False


@needs_cxx
def test_int64_indices_when_int32_does_not_fit(monkeypatch):
    cus = FakeCusparse()
    be = install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=cus)))
    monkeypatch.setattr(cupy_backend, "INT32_MAX", 8)  # pretend this small pattern overflows int32
    p = random_pattern(12, 10, 0.3, seed=26)
    assert p.nnz > 8 and cupy_backend.index_dtype_for(p) == np.int64
    rng = np.random.default_rng(27)
    vals, x = rng.standard_normal(p.nnz), rng.standard_normal((10, 4))
    HostRawKernel.launches.clear()
    out = spmm(pg.tensor(vals, backend="cupy"), pg.tensor(x, backend="cupy"), p)
    np.testing.assert_allclose(out.numpy(), dense_of(p, vals) @ x, rtol=1e-12)
    assert cus.calls == [] and HostRawKernel.launches[-1][0] == "polygrad_csr_spmm"
    assert be.device_indices(p)[2].dtype == np.int64
    with pytest.raises(SparseIndexError, match="int64"):
        be.csr_matrix(p, np.float64)
    a = rng.standard_normal((12, 4))
    got = sddmm(pg.tensor(a, backend="cupy"), pg.tensor(x, backend="cupy"), p).numpy()
    np.testing.assert_allclose(got, (a @ x.T)[p.rows, p.cols], rtol=1e-12)
    assert HostRawKernel.launches[-1][0] == "polygrad_sddmm"


@needs_cxx
def test_without_cusparse_spmm_uses_polygrad_kernel(monkeypatch):
    be = install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=False)))
    p = random_pattern(9, 7, 0.4, seed=28)
    rng = np.random.default_rng(29)
    vals, x = rng.standard_normal(p.nnz).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    HostRawKernel.launches.clear()
    out = spmm(pg.tensor(vals, backend="cupy"), pg.tensor(x, backend="cupy"), p)
    np.testing.assert_allclose(out.numpy(), dense_of(p, vals) @ x, rtol=1e-5, atol=1e-6)
    assert HostRawKernel.launches[-1][0] == "polygrad_csr_spmm"
    assert be.info()["cusparse"].startswith("no (ImportError")


@needs_cxx
def test_out_of_memory_goes_through_fallback_chain_to_numpy(monkeypatch):
    oom = FakeOutOfMemoryError("Out of memory allocating 4,096 bytes")
    install_as_cupy(monkeypatch, CupyBackend(loader=lambda: fake_modules(cusparse=FakeCusparse(raise_exc=oom))))
    # scalar decomposition is forbidden: only the numpy link of the chain can serve the op
    monkeypatch.setattr(pg.config, "scalar_fallback_max_elements", 0)
    assert CupyBackend.fallback_chain == ("numpy",)  # the backend's own chain: no config needed
    assert pg.config.fallback_chain.get("cupy") is None
    seen = []

    class Listener:
        @pg.hookimpl
        def polygrad_fallback(self, op, backend, layout, exception):
            seen.append((op, backend, layout, type(exception)))

    listener = Listener()
    pg.register_plugin(listener, name="test-cupy-oom-listener")
    pg.reset_stats()
    try:
        p = random_pattern(10, 8, 0.4, seed=30)
        rng = np.random.default_rng(31)
        vals, x = rng.standard_normal(p.nnz), rng.standard_normal((8, 3))
        with pytest.warns(pg.FallbackWarning, match="OutOfMemoryError"):
            out = spmm(pg.tensor(vals, backend="cupy"), pg.tensor(x, backend="cupy"), p)
        assert out.backend == "cupy"
        np.testing.assert_allclose(out.numpy(), dense_of(p, vals) @ x, rtol=1e-12)
        assert seen == [("spmm", "cupy", "csr", FakeOutOfMemoryError)]
        assert pg.stats()["fallbacks"] == {"spmm/cupy/csr": 1}
        # without the numpy link (and no scalar decomposition) the op fails loudly, naming the OOM
        monkeypatch.setattr(pg.config, "fallback_chain", {"cupy": []})
        with pytest.raises(BackendError, match="OutOfMemoryError"):
            spmm(pg.tensor(vals, backend="cupy"), pg.tensor(x, backend="cupy"), p)
    finally:
        pg.unregister_plugin(listener)
        pg.reset_stats()


def test_memory_available_reads_device_memory(monkeypatch):
    be = CupyBackend(loader=lambda: fake_modules(free=5 << 30, pooled=123))
    assert be.memory_available() == (5 << 30) + 123
    from polygrad.runtime import memory
    assert memory.available_bytes(be) == (5 << 30) + 123
    broken = CupyBackend(loader=lambda: fake_modules(device_count=0))
    assert broken.memory_available() is None


def test_info_reports_device(monkeypatch):
    info = CupyBackend(loader=fake_modules).info()
    assert info["available"] and info["device"] == "Fake GPU" and info["cusparse"] == "yes"
    assert info["memory_free"] == 3 << 30
    assert CupyBackend(loader=lambda: fake_modules(device_count=0)).info() == {
        "available": False, "reason": "no CUDA device: RuntimeError: the CUDA runtime reports 0 devices"}


@needs_cxx
@pytest.mark.parametrize("kind", ["sddmm", "csr_spmm", "segment_sum", "segment_max"])
@pytest.mark.parametrize("vt", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("it", [np.int32, np.int64])
def test_every_kernel_variant_compiles(kind, vt, it):
    src, name = cupy_backend.kernel_source(kind, vt, it)
    HostRawKernel(src, name)  # -Wall -Werror


def test_unknown_kernel_kind():
    with pytest.raises(ValueError, match="unknown polygrad CUDA kernel"):
        cupy_backend.kernel_source("spgemm", np.float32, np.int32)


def test_conformance_kit_passes_on_the_fake_gpu(fake_gpu, capsys):
    # the kit a third-party backend author runs: every kernel of the cupy backend (the CUDA
    # sources through the host compiler) against the scalar oracle, gradients included
    from polygrad.testing import conformance

    rc = conformance.main(["cupy"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "0 failed" in out
