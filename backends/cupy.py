"""The CuPy backend: GPU kernels on ``cupy.ndarray``.

Thin by design: every kernel comes from the shared array-namespace module
(``array_kernels.make_kernels(cupy)``) except the few where the GPU needs its own:

* **SpMM** -- cuSPARSE CSR x dense (``cupyx.cusparse.spmm``) on a ``csr_matrix`` built **once
  per pattern** and cached (canonical / sorted flags set, so cuSPARSE never re-sorts), int32
  indices.  A row-major ``X`` is handed over as ``X.T`` with ``transb=True`` -- the
  column-major view cuSPARSE wants, with no copy per call.  Patterns whose indices do not fit
  int32, integer dtypes, 1-D ``x`` and machines whose cuSPARSE cannot be loaded use polygrad's
  own CSR kernel (one thread per output element, int32 or int64 indices).
* **SDDMM** -- a raw CUDA kernel, one nonzero per thread, a sequential dot product per thread:
  no atomics, so bitwise deterministic (cupyx has no SDDMM).
* **SEGMENT_SUM / SEGMENT_MAX / INDEX_ADD** -- a deterministic segment reduction (one thread per
  output element, sequential over its segment).  INDEX_ADD sorts the target positions first
  (a sort-based segment sum) instead of the shared module's atomic ``cupyx.scatter_add``, whose
  float sums change with thread scheduling.

Availability is checked lazily and in two separate steps: "cupy importable" and "a CUDA device
present" (importing cupy works on a machine without a GPU; the first allocation fails).  Nothing
here imports cupy at module level: ``import polygrad`` never pays for it, and this module loads
on machines without cupy.

Out-of-memory (``cupy.cuda.memory.OutOfMemoryError``, a ``MemoryError``) raised by a kernel is a
kernel fault like any other: dispatch reroutes the op through ``pg.config.fallback_chain``
(``cupy -> numpy``, then scalar decomposition) and reports the event.

Tests inject a fake ``cupy`` (numpy's namespace plus the few cupy-only attributes used here; the
CUDA sources are compiled by a host C++ compiler) through ``CupyBackend(loader=...)``, so this
module's logic runs on CPU.
"""
from __future__ import annotations

import copy
import importlib
import math
import string
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import polygrad as pg
from polygrad.runtime.backend import KDLCUDA, KDLCUDAMANAGED
from polygrad.errors import BackendUnavailableError, SparseIndexError
from polygrad.errors import describe_exception
from polygrad.ir.ops import Op

from .array_kernels import make_kernels

INSTALL_HINT = "pip install polygrad-core[cuda]"

#: threads per block of polygrad's CUDA kernels; every kernel uses a grid-stride loop, so any
#: launch size is correct and this only tunes occupancy
BLOCK = 256
#: cap on blocks per launch (grid-stride loops cover the rest)
MAX_BLOCKS = 1 << 16
#: largest value an int32 index array can hold
INT32_MAX = np.iinfo(np.int32).max

#: value dtype -> (C type, accumulator C type) of polygrad's own CUDA kernels.  Float sums
#: accumulate in the value type (like numpy's float32 reductions); integer sums in 64 bits.
CTYPES: dict[np.dtype, tuple[str, str]] = {
    np.dtype(np.float32): ("float", "float"),
    np.dtype(np.float64): ("double", "double"),
    np.dtype(np.int32): ("int", "long long"),
    np.dtype(np.int64): ("long long", "long long"),
}
INDEX_CTYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
#: dtypes cuSPARSE SpMM takes
CUSPARSE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# --- CUDA sources ------------------------------------------------------------------------------
# Plain C in CUDA's kernel syntax (no intrinsics, no shared memory), so that a host compiler can
# build and run them in tests.  $T = value type, $A = accumulator type, $I = index type.  Strides
# are in elements; every index is widened to 64 bits before multiplying.

_SDDMM_SRC = """
extern "C" __global__ void polygrad_sddmm(
    const long long nnz, const long long f,
    const $I* __restrict__ rows, const $I* __restrict__ cols,
    const $T* __restrict__ p, const long long p0, const long long p1,
    const $T* __restrict__ q, const long long q0, const long long q1,
    $T* __restrict__ out)
{
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < nnz; e += step) {
        const $T* pr = p + (long long)rows[e] * p0;
        const $T* qr = q + (long long)cols[e] * q0;
        $A acc = 0;
        for (long long k = 0; k < f; ++k)
            acc += ($A)pr[k * p1] * ($A)qr[k * q1];
        out[e] = ($T)acc;
    }
}
"""

_CSR_SPMM_SRC = """
extern "C" __global__ void polygrad_csr_spmm(
    const long long nrows, const long long f,
    const $I* __restrict__ indptr, const $I* __restrict__ cols,
    const $T* __restrict__ vals, const long long v0,
    const $T* __restrict__ x, const long long x0, const long long x1,
    $T* __restrict__ out)
{
    /* one thread per output element (i, j), j fastest: neighbouring threads read neighbouring
       columns of the same row of x */
    const long long total = nrows * f;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long i = t / f, j = t - i * f;
        const long long end = (long long)indptr[i + 1];
        $A acc = 0;
        for (long long e = (long long)indptr[i]; e < end; ++e)
            acc += ($A)vals[e * v0] * ($A)x[(long long)cols[e] * x0 + j * x1];
        out[t] = ($T)acc;
    }
}
"""

_SEGMENT_SRC = """
extern "C" __global__ void polygrad_segment_$NAME(
    const long long nseg, const long long w,
    const $I* __restrict__ bounds, const $I* __restrict__ order, const int has_order,
    const $T* __restrict__ v, const long long v0, const long long v1,
    $T* __restrict__ out)
{
    /* out[s, j] = reduce over e in [bounds[s], bounds[s+1]) of v[order[e], j]; empty -> 0.
       One thread per (s, j), sequential over the segment: deterministic, no atomics. */
    const long long total = nseg * w;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {
        const long long s = t / w, j = t - s * w;
        const long long start = (long long)bounds[s], end = (long long)bounds[s + 1];
        if (start == end) { out[t] = ($T)0; continue; }
        long long r = has_order ? (long long)order[start] : start;
        $A acc = ($A)v[r * v0 + j * v1];
        for (long long e = start + 1; e < end; ++e) {
            r = has_order ? (long long)order[e] : e;
            const $A y = ($A)v[r * v0 + j * v1];
            acc = $COMBINE;
        }
        out[t] = ($T)acc;
    }
}
"""

#: segment reductions: name -> combine expression of (acc, y).  max propagates NaN like numpy
#: (``y != y`` only for floats: integers have no NaN, and compilers flag the self-comparison).
_COMBINE = {"sum": "acc + y", "max": "((y > acc || y != y) ? y : acc)"}
_COMBINE_INT = {"sum": "acc + y", "max": "(y > acc ? y : acc)"}


def kernel_source(kind: str, value_dtype: Any, index_dtype: Any) -> tuple[str, str]:
    """(CUDA source, kernel name) of polygrad's kernel ``kind`` for these dtypes.

    ``kind``: "sddmm", "csr_spmm", "segment_sum" or "segment_max".  Public so tests can
    compile the very same source with a host compiler.
    """
    t, a = CTYPES[np.dtype(value_dtype)]
    subs = {"T": t, "A": a, "I": INDEX_CTYPES[np.dtype(index_dtype)]}
    if kind == "sddmm":
        src, name = _SDDMM_SRC, "polygrad_sddmm"
    elif kind == "csr_spmm":
        src, name = _CSR_SPMM_SRC, "polygrad_csr_spmm"
    elif kind.startswith("segment_") and kind[8:] in _COMBINE:
        op = kind[8:]
        src, name = _SEGMENT_SRC, f"polygrad_segment_{op}"
        combine = _COMBINE if np.dtype(value_dtype).kind == "f" else _COMBINE_INT
        subs.update(NAME=op, COMBINE=combine[op])
    else:
        raise ValueError(f"unknown polygrad CUDA kernel {kind!r}")
    return string.Template(src).substitute(subs), name


def index_dtype_for(pattern) -> np.dtype:
    """int32 when every index, pointer and dimension of ``pattern`` fits, else int64."""
    n, m = pattern.shape
    return np.dtype(np.int32) if max(n, m, pattern.nnz) <= INT32_MAX else np.dtype(np.int64)


# --- loading ----------------------------------------------------------------------------------

@dataclass
class CupyModules:
    """The modules this backend runs on (real ones, or fakes injected by tests)."""
    cupy: Any
    #: ``cupyx.scipy.sparse`` and ``cupyx.cusparse``; None when they cannot be loaded (then SpMM
    #: runs polygrad's own CSR kernel and ``cusparse_error`` says why)
    sparse: Any = None
    cusparse: Any = None
    cusparse_error: str = ""


def import_cupy() -> CupyModules:
    """Import cupy (raises ImportError when it is not installed).  cuSPARSE is loaded later."""
    return CupyModules(cupy=importlib.import_module("cupy"))


def _load_cusparse(mods: CupyModules) -> None:
    if mods.sparse is not None or mods.cusparse_error:
        return
    try:
        # cupyx.cusparse loads the CUDA libraries on import: it can fail where cupy itself works
        mods.sparse = importlib.import_module("cupyx.scipy.sparse")
        mods.cusparse = importlib.import_module("cupyx.cusparse")
        if not mods.cusparse.check_availability("spmm"):
            raise ImportError("this cuSPARSE has no generic SpMM")
    except Exception as exc:  # noqa: BLE001 - any failure means "use our own kernel"
        mods.sparse = mods.cusparse = None
        mods.cusparse_error = f"{type(exc).__name__}: {exc}"


# --- the backend --------------------------------------------------------------------------------

class CupyBackend(pg.Backend):
    name = "cupy"
    description = "CUDA GPU kernels on cupy arrays (cuSPARSE SpMM, deterministic SDDMM and segment sums)"
    fallback_chain = ("numpy",)  # a failing GPU kernel is retried on the host before decomposition
    dlpack_devices = (KDLCUDA, KDLCUDAMANAGED)

    def __init__(self, loader: Callable[[], CupyModules] | None = None) -> None:
        """``loader`` returns the modules to run on (default: import cupy); tests pass fakes."""
        super().__init__()
        self._loader = loader or import_cupy
        self._lock = threading.RLock()
        self._mods: CupyModules | None = None
        self._reason: str | None = None     # None: not checked yet; "": available
        self._impl: dict | None = None      # the real kernel table, built on the first kernel call
        self._compiled: dict[tuple, Any] = {}
        #: pattern -> {dtype: cached csr_matrix template}; dies with the pattern
        self._csr_cache: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
        #: "auto": cuSPARSE where it applies, else polygrad's kernel; "kernel": always ours
        self.spmm_impl = "auto"
        #: whether cuSPARSE accepted a transposed dense operand (see _CupyKernels.cusparse_spmm)
        self.cusparse_transb = True
        # The registry reads the kernel table at load time, long before anyone asks for a GPU:
        # register thin forwarders so that neither import nor registration touches cupy.
        self.kernels = {key: self._deferred(key) for key in make_kernels(np)}

    # -- availability ----------------------------------------------------------------------
    def _check(self) -> str:
        with self._lock:
            if self._reason is not None:
                return self._reason
            try:
                mods = self._loader()
            except Exception as exc:  # noqa: BLE001 - a broken cupy install must not break us
                missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "cupy").split(".")[0] == "cupy"
                what = "cupy not installed" if missing else "cupy failed to import"
                self._reason = f"{what} ({describe_exception(exc)}; {INSTALL_HINT})"
                return self._reason
            cp = mods.cupy
            try:
                count = int(cp.cuda.runtime.getDeviceCount())
                if count < 1:
                    raise RuntimeError("the CUDA runtime reports 0 devices")
                # a device can be listed and still unusable (driver too old, out of memory,
                # exclusive mode taken): only a real allocation tells.  (No kernel is launched
                # here: that would need the runtime compiler, whose absence the first kernel
                # call reports through the fallback chain instead.)
                probe = cp.zeros(1, dtype=cp.float32)
                cp.cuda.runtime.deviceSynchronize()
                if cp.asnumpy(probe).shape != (1,):
                    raise RuntimeError("a one-element probe allocation came back wrong")
                del probe
            except Exception as exc:  # noqa: BLE001
                self._reason = f"no CUDA device: {describe_exception(exc)}"
                return self._reason
            self._mods = mods
            self._reason = ""
            return ""

    def is_available(self) -> bool:
        return self._check() == ""

    def unavailable_reason(self) -> str:
        return self._check() or "available"

    @property
    def install_hint(self) -> str:  # type: ignore[override]
        # the registry appends this to the reason; don't say it twice
        return "" if INSTALL_HINT in (self._reason or "") else INSTALL_HINT

    def modules(self) -> CupyModules:
        """The loaded modules; BackendUnavailableError (with the reason) when cupy can't run."""
        reason = self._check()
        if reason:
            hint = self.install_hint
            raise BackendUnavailableError(f"backend 'cupy' is not available: {reason}"
                                          + (f" ({hint})" if hint else ""))
        assert self._mods is not None
        return self._mods

    def info(self) -> dict:
        """Facts for ``polygrad check`` / the GPU check log: versions, device, memory, cuSPARSE."""
        out: dict[str, Any] = {"available": self.is_available(), "reason": self._reason or ""}
        if not out["available"]:
            return out
        mods = self.modules()
        _load_cusparse(mods)
        cp = mods.cupy
        out["cupy"] = getattr(cp, "__version__", "?")
        try:
            dev = cp.cuda.Device()
            props = cp.cuda.runtime.getDeviceProperties(dev.id)
            name = props.get("name", b"")
            out["device"] = name.decode() if isinstance(name, bytes) else str(name)
            free, total = cp.cuda.runtime.memGetInfo()
            out["memory_free"], out["memory_total"] = int(free), int(total)
        except Exception as exc:  # noqa: BLE001 - informational only
            out["device_error"] = describe_exception(exc)
        out["cusparse"] = "yes" if mods.cusparse is not None else f"no ({mods.cusparse_error})"
        return out

    # -- arrays -------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        return self.modules().cupy.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return self.modules().cupy.asnumpy(array)

    def owns(self, array: Any) -> bool:
        if self._mods is None:
            # don't import cupy to answer "is this a cupy array?" about a numpy array
            if not type(array).__module__.startswith("cupy") or not self.is_available():
                return False
        return isinstance(array, self._mods.cupy.ndarray)  # type: ignore[union-attr]

    def from_dlpack(self, obj: Any) -> Any:
        return self.modules().cupy.from_dlpack(obj)  # zero-copy on the device

    def memory_used(self, device: int = 0) -> int | None:
        """Bytes held by cupy's default memory pool (never imports cupy to answer)."""
        if self._mods is None:
            return None
        try:
            return int(self._mods.cupy.get_default_memory_pool().used_bytes())
        except Exception:  # noqa: BLE001 - no device: nothing to report
            return None

    def memory_available(self, device: int = 0) -> int | None:
        """Free device memory: the driver's free bytes plus what cupy's pool holds unused."""
        if not self.is_available():
            return None
        cp = self.modules().cupy
        try:
            free, _total = cp.cuda.runtime.memGetInfo()
            pooled = cp.get_default_memory_pool().free_bytes()
            return int(free) + int(pooled)
        except Exception:  # noqa: BLE001 - unknown: let the caller fall back to host memory
            return None

    # -- kernels --------------------------------------------------------------------------------
    def _deferred(self, key: tuple) -> Callable:
        def kernel(*args: Any, **attrs: Any) -> Any:
            impl = self._impl if self._impl is not None else self._build()
            return impl[key](*args, **attrs)
        kernel.__name__ = f"cupy_{key[0].value}_{key[1]}"
        return kernel

    def _build(self) -> dict:
        with self._lock:
            if self._impl is None:
                mods = self.modules()
                _load_cusparse(mods)
                table = make_kernels(mods.cupy)
                table.update(_CupyKernels(self, mods, table).table())
                self._impl = table
            return self._impl

    def raw_kernel(self, kind: str, value_dtype: Any, index_dtype: Any) -> Any:
        """polygrad's CUDA kernel ``kind`` for these dtypes, compiled once (cupy caches on disk)."""
        key = (kind, np.dtype(value_dtype), np.dtype(index_dtype))
        k = self._compiled.get(key)
        if k is None:
            src, name = kernel_source(kind, value_dtype, index_dtype)
            k = self.modules().cupy.RawKernel(src, name)
            self._compiled[key] = k
        return k

    def launch(self, kind: str, value_dtype: Any, index_dtype: Any, total: int, args: tuple) -> None:
        if total <= 0:
            return
        blocks = min(MAX_BLOCKS, -(-total // BLOCK))
        self.raw_kernel(kind, value_dtype, index_dtype)((blocks,), (BLOCK,), args)

    def csr_matrix(self, pattern, dtype: Any) -> Any:
        """The cached ``cupyx.scipy.sparse.csr_matrix`` *template* of ``pattern`` for ``dtype``.

        Built once per (pattern, dtype): the constructor validates and synchronises with the
        device, which must not happen per call.  Its index arrays are the pattern's int32 device
        arrays (shared with the other kernels through ``pattern.on``) and its canonical / sorted
        flags are set, so cuSPARSE never re-sorts.  Callers take a shallow copy and set ``data``
        (:meth:`_CupyKernels.spmm`), so concurrent calls never share mutable state.
        """
        dtype = np.dtype(dtype)
        with self._lock:
            per_dtype = self._csr_cache.get(pattern)
            if per_dtype is None:
                per_dtype = self._csr_cache[pattern] = {}
            m = per_dtype.get(dtype)
            if m is not None:
                return m
            mods = self.modules()
            _load_cusparse(mods)
            if mods.sparse is None:
                raise RuntimeError(f"cuSPARSE is not available: {mods.cusparse_error}")
            if index_dtype_for(pattern) != np.dtype(np.int32):
                raise SparseIndexError(
                    f"op 'spmm': pattern {pattern.shape} with nnz={pattern.nnz} needs int64 indices, "
                    f"which cuSPARSE CSR SpMM does not take here; polygrad's own CSR kernel serves it")
            indptr, _, cols = self.device_indices(pattern)
            cp = mods.cupy
            placeholder = cp.zeros(pattern.nnz, dtype=dtype)
            m = mods.sparse.csr_matrix((placeholder, cols, indptr), shape=pattern.shape, copy=False)
            m.has_sorted_indices = True
            m.has_canonical_format = True
            m.data = placeholder[:0]  # the template holds no values: each call brings its own
            per_dtype[dtype] = m
            return m

    def device_indices(self, pattern) -> tuple[Any, Any, Any]:
        """(indptr, rows, cols) on the device, int32 when they fit (else int64), cached on the pattern."""
        idx = index_dtype_for(pattern)
        cp = self.modules().cupy
        return pattern.on(("cupy", idx.name), lambda a: cp.asarray(a, dtype=idx))


def _elem_strides(a: Any) -> tuple[int, ...]:
    """Strides of ``a`` in elements (what polygrad's kernels take)."""
    return tuple(int(s) // a.itemsize for s in a.strides)


class _CupyKernels:
    """The GPU-specific kernels, bound to one backend and its modules."""

    def __init__(self, be: CupyBackend, mods: CupyModules, shared: dict) -> None:
        self.be, self.cp, self.mods = be, mods.cupy, mods
        self.shared = dict(shared)  # the generic versions, for dtypes our kernels don't cover

    def table(self) -> dict:
        t: dict = {(Op.INDEX_ADD, "dense"): self.index_add}
        # keyed once: "csr" and "coo" label one canonical storage (polygrad.ir.ops.kernel_key)
        t[(Op.SPMM, "csr")] = self.spmm
        t[(Op.SDDMM, "csr")] = self.sddmm
        t[(Op.SEGMENT_SUM, "csr")] = self.segment_sum
        t[(Op.SEGMENT_MAX, "csr")] = self.segment_max
        return t

    # -- SpMM ------------------------------------------------------------------------------------
    def spmm(self, values, x, *, pattern):
        cp, be = self.cp, self.be
        dtype = np.result_type(values.dtype, x.dtype)
        n, f = pattern.shape[0], (x.shape[1] if x.ndim == 2 else 1)
        if dtype not in CTYPES:
            return self.shared[(Op.SPMM, "csr")](values, x, pattern=pattern)
        values = values.astype(dtype, copy=False)
        x = x.astype(dtype, copy=False)
        if pattern.nnz == 0 or n == 0 or f == 0:
            return cp.zeros((n, f) if x.ndim == 2 else (n,), dtype=dtype)
        _load_cusparse(self.mods)
        if (be.spmm_impl == "auto" and x.ndim == 2 and dtype in CUSPARSE_DTYPES
                and self.mods.cusparse is not None and index_dtype_for(pattern) == np.dtype(np.int32)):
            return self.cusparse_spmm(values, x, pattern)
        return self.kernel_spmm(values, x, pattern)

    def cusparse_spmm(self, values, x, pattern):
        """cuSPARSE SpMM; the output is column-major (n, F), which every cupy op accepts."""
        a = copy.copy(self.be.csr_matrix(pattern, values.dtype))
        a.data = self.cp.ascontiguousarray(values)
        spmm = self.mods.cusparse.spmm
        if x.flags.c_contiguous and self.be.cusparse_transb:
            # row-major X is column-major X.T: hand cuSPARSE that view with the transpose flag,
            # no copy.  A cuSPARSE that refuses opB=T (it is documented for CSR, but versions
            # differ) is remembered and served by the copying path from then on.
            try:
                return spmm(a, x.T, transb=True)
            except MemoryError:
                raise
            except Exception:  # noqa: BLE001
                self.be.cusparse_transb = False
        if x.flags.f_contiguous:
            return spmm(a, x)
        return spmm(a, self.cp.asfortranarray(x))

    def kernel_spmm(self, values, x, pattern):
        """polygrad's CSR kernel: any stride of x, int32 or int64 indices, float or int values."""
        cp = self.cp
        indptr, _, cols = self.be.device_indices(pattern)
        n = pattern.shape[0]
        x2 = x.reshape(x.shape[0], 1) if x.ndim == 1 else x
        f = x2.shape[1]
        out = cp.empty((n, f), dtype=x2.dtype)
        xs = _elem_strides(x2)
        self.be.launch("csr_spmm", x2.dtype, indptr.dtype, n * f,
                       (np.int64(n), np.int64(f), indptr, cols, values, np.int64(_elem_strides(values)[0]),
                        x2, np.int64(xs[0]), np.int64(xs[1]), out))
        return out.reshape(n) if x.ndim == 1 else out

    # -- SDDMM -----------------------------------------------------------------------------------
    def sddmm(self, p, q, *, pattern):
        cp = self.cp
        dtype = np.result_type(p.dtype, q.dtype)
        if dtype not in CTYPES:
            return self.shared[(Op.SDDMM, "csr")](p, q, pattern=pattern)
        p = p.astype(dtype, copy=False)
        q = q.astype(dtype, copy=False)
        _, rows, cols = self.be.device_indices(pattern)
        nnz, f = pattern.nnz, p.shape[1]
        out = cp.empty((nnz,), dtype=dtype)
        ps, qs = _elem_strides(p), _elem_strides(q)
        self.be.launch("sddmm", dtype, rows.dtype, nnz,
                       (np.int64(nnz), np.int64(f), rows, cols, p, np.int64(ps[0]), np.int64(ps[1]),
                        q, np.int64(qs[0]), np.int64(qs[1]), out))
        return out

    # -- segment reductions ----------------------------------------------------------------------
    def segments(self, kind: str, bounds, order, v2):
        """(nseg, w) reduction of the rows of ``v2`` over segments ``bounds`` (after ``order``)."""
        nseg, w = int(bounds.shape[0]) - 1, int(v2.shape[1])
        out = self.cp.empty((nseg, w), dtype=v2.dtype)
        vs = _elem_strides(v2)
        has_order = order is not None
        self.be.launch(kind, v2.dtype, bounds.dtype, nseg * w,
                       (np.int64(nseg), np.int64(w), bounds, order if has_order else bounds,
                        np.int32(has_order), v2, np.int64(vs[0]), np.int64(vs[1]), out))
        return out

    def _segment(self, kind: str, values, pattern):
        if values.dtype not in CTYPES:
            return self.shared[(Op.SEGMENT_SUM if kind == "segment_sum" else Op.SEGMENT_MAX, "csr")](
                values, pattern=pattern)
        indptr, _, _ = self.be.device_indices(pattern)
        return self.segments(kind, indptr, None, values.reshape(-1, 1)).reshape(pattern.shape[0])

    def segment_sum(self, values, *, pattern):
        return self._segment("segment_sum", values, pattern)

    def segment_max(self, values, *, pattern):
        return self._segment("segment_max", values, pattern)

    # -- INDEX_ADD ---------------------------------------------------------------------------------
    def index_add(self, src, *, index, shape):
        """zeros(shape) with src added at index, as a sort-based segment sum (no atomics).

        The target position of every source row is computed, positions are sorted (a stable,
        deterministic device sort), equal positions form segments summed sequentially by one
        thread each, and the sums are written to their (now unique) positions.
        """
        cp = self.cp
        shape = tuple(shape)
        is_bool = src.dtype == np.bool_
        work = src.astype(np.int32) if is_bool else src
        if work.dtype not in CTYPES:
            return self.shared[(Op.INDEX_ADD, "dense")](src, index=index, shape=shape)
        idx = tuple(cp.asarray(i) if hasattr(i, "dtype") else i for i in index)
        size = math.prod(shape)
        if (len(idx) == 1 and getattr(idx[0], "ndim", 0) == 1 and work.ndim == len(shape) >= 1
                and work.shape == (idx[0].shape[0],) + shape[1:]):
            # rows of the target (the gather-rows backward): segments of whole rows
            targets = idx[0].astype(np.int64, copy=False)
            targets = cp.where(targets < 0, targets + shape[0], targets)
            nrows, width = shape[0], math.prod(shape[1:])
            v2 = work.reshape(work.shape[0], width)
        else:
            pos_dtype = np.int32 if size <= INT32_MAX else np.int64
            positions = cp.arange(size, dtype=pos_dtype).reshape(shape)[idx]
            targets = positions.reshape(-1)
            v2 = cp.broadcast_to(work, positions.shape).reshape(-1, 1)
            nrows, width = size, 1
        out = cp.zeros((nrows, width), dtype=work.dtype)
        k = int(targets.shape[0])
        if k and width:
            order = cp.argsort(targets, kind="stable")
            ts = targets[order]
            starts = cp.flatnonzero(ts[1:] != ts[:-1]) + 1
            idx_dtype = np.int32 if k <= INT32_MAX else np.int64
            bounds = cp.concatenate((cp.zeros(1, dtype=idx_dtype), starts.astype(idx_dtype),
                                     cp.full(1, k, dtype=idx_dtype)))
            sums = self.segments("segment_sum", bounds, order.astype(idx_dtype, copy=False), v2)
            out[ts[bounds[:-1]]] = sums
        out = out.reshape(shape)
        return out != 0 if is_bool else out


@pg.hookimpl
def polygrad_backends():
    return [CupyBackend()]
