"""Declared dtypes and immutable arrays in the contract, and the kit's non-finite / long-row cases.

Each check here has a backend that gets it wrong (the kit must fail it) next to one that gets it
right (the kit must pass it)."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.backend import contract_problem, supports_dtype
from polygrad.backends.array_kernels import make_kernels
from polygrad.errors import DTypeError
from polygrad.ir.ops import Op
from polygrad.testing.temporary import temporary_plugin
from polygrad.testing.conformance import run_conformance


class _NumpyBackend(pg.Backend):
    """numpy kernels; refuses any array of a dtype it does not declare (the kit must not hand one)."""

    def __init__(self, name: str, dtypes: tuple[str, ...] | None = None, kernels: dict | None = None) -> None:
        super().__init__()
        self.name = name
        if dtypes is not None:
            self.dtypes = dtypes
        self.kernels = make_kernels(np)
        self.kernels.update(kernels or {})
        self.to_numpy_calls = 0

    def from_numpy(self, a):
        if not supports_dtype(self, a.dtype):
            raise TypeError(f"{self.name} got an undeclared dtype {a.dtype}")
        return np.array(a)

    def to_numpy(self, a):
        self.to_numpy_calls += 1
        return np.asarray(a)

    def owns(self, a):
        return isinstance(a, np.ndarray)


@np.errstate(invalid="ignore")
def _cumsum_spmm(values, x, *, pattern):
    """SpMM by a prefix sum over *all* nonzeros, then row differences: mixes rows (an inf makes
    every later row NaN; large early rows swamp small later ones in float32)."""
    contrib = values.reshape((-1,) + (1,) * (x.ndim - 1)) * x[pattern.cols]
    c = np.concatenate([np.zeros((1,) + contrib.shape[1:], contrib.dtype), np.cumsum(contrib, axis=0)])
    return (c[pattern.indptr[1:]] - c[pattern.indptr[:-1]]).astype(np.result_type(values, x))


def test_kit_catches_a_spmm_that_sums_across_rows() -> None:
    wrong = _NumpyBackend("cumsum-spmm", kernels={(Op.SPMM, "csr"): _cumsum_spmm})
    with temporary_plugin(wrong):
        report = run_conformance("cumsum-spmm", ops=["spmm"], layouts=["csr"], checks=["forward", "float32"])
    failed = {(r.case, r.check) for r in report.failures}
    assert ("nonfinite_values", "forward") in failed       # NaN in rows after the inf
    assert ("long_rows-float32", "float32") in failed or ("long_rows", "float32") in failed
    message = next(r.message for r in report.failures if "long_rows" in r.case and r.check == "float32")
    assert "accumulates across rows" in message and "row" in message
    assert ("small_matrix", "forward") not in failed        # finite short cases still agree


def test_kit_passes_the_numpy_spmm_on_the_new_cases() -> None:
    report = run_conformance("numpy", ops=["spmm", "segment_sum", "sddmm"], checks=["forward", "float32"])
    assert report.ok, [r.message for r in report.failures]
    cases = {r.case for r in report.results if r.status == "pass"}
    assert {"nonfinite_values", "nonfinite_x", "long_rows"} <= {c.split("-")[0] for c in cases}


def _int32_sum(x, *, axes, keepdims):
    """numpy's sum, with integer sums in int32 (numpy's own widen to int64, which f32only lacks)."""
    if not axes and x.dtype.kind not in "biu":
        return x
    return x.sum(axis=axes, keepdims=keepdims, dtype=np.int32 if x.dtype.kind in "biu" else None)


def test_a_float32_only_backend_is_valid_and_checked_at_what_it_declares() -> None:
    f32 = _NumpyBackend("f32only", dtypes=("float32", "int32", "bool"), kernels={(Op.SUM, "dense"): _int32_sum})
    assert contract_problem(f32) == ""
    with temporary_plugin(f32):
        report = run_conformance("f32only", ops=["mul", "exp", "sum", "spmm", "getitem", "index_add"])
        assert report.ok, [r.message for r in report.failures[:5]]
        ran = {(r.check, r.status) for r in report.results}
        assert ("float32", "pass") in ran and ("grad-scalar", "pass") in ran and ("integer", "pass") in ran
        assert ("forward", "pass") not in {(r.check, r.status) for r in report.results
                                           if r.op == Op.MUL}   # a float64 check: not applicable
        with pytest.raises(DTypeError, match="f32only.*float32, int32, bool.*float64"):
            pg.tensor(np.ones(3), backend="f32only")
        t = pg.tensor(np.ones(3, np.float32), backend="f32only", requires_grad=True)
        (t * t).sum().backward()
        assert t.grad.dtype == np.float32


@pytest.mark.parametrize("dtypes, needle", [((), "must be a tuple"), (("int32",), "no float dtype"),
                                            (("float32", "complex64"), "must be a tuple")])
def test_bad_dtype_declarations_are_named(dtypes, needle) -> None:
    assert needle in contract_problem(_NumpyBackend("bad", dtypes=dtypes))


def test_integer_sums_on_a_backend_without_int64_are_in_its_widest_integer() -> None:
    """Inference gives integer sums int64 (PyTorch's rule); a backend that declares no int64 (JAX
    without 64-bit mode) sums in int32 instead, eagerly and in the kit -- no fallback, no int64
    tensor on a backend that cannot hold one -- and the kit does not cast to undeclared dtypes."""
    f32 = _NumpyBackend("f32only", dtypes=("float32", "int32", "bool"), kernels={(Op.SUM, "dense"): _int32_sum})
    with temporary_plugin(f32):
        t = pg.tensor(np.array([[1, 2], [3, 4]], np.int32), backend="f32only")
        for total, want in ((t.sum(), 10), (t.sum(axis=0), [4, 6]), ((t > 1).sum(), 3)):
            assert total.dtype == np.int32 and total.numpy().tolist() == want
        report = run_conformance("f32only", ops=["sum", "cast"])
        assert report.ok, [r.message for r in report.failures[:5]]
        cases = {r.case.split("-")[0] for r in report.results if r.op == Op.CAST}
        assert "f64_to_f32" in cases and not cases & {"f64_to_f64", "f64_to_i64", "i64_to_f64"}  # not applicable
    assert pg.tensor(np.array([1, 2], np.int32)).sum().dtype == np.int64   # numpy declares int64: unchanged


def test_an_immutable_backend_shares_its_arrays_without_a_host_round_trip() -> None:
    from polygrad.apps.train import _copy_tensor

    class Frozen(_NumpyBackend):
        immutable = True

    frozen = Frozen("frozen")
    with temporary_plugin(frozen):
        native = np.arange(4.0)
        t = pg.tensor(native, backend="frozen")
        calls = frozen.to_numpy_calls
        shared = pg.tensor(t._data, backend="frozen")     # one of its own arrays: shared, no host trip
        assert shared.backend == "frozen" and shared._data is t._data
        snap = _copy_tensor(t)               # fit()'s best-epoch snapshot
        assert snap._data is t._data
        assert frozen.to_numpy_calls == calls
        # a mutable backend still copies
        plain = _NumpyBackend("plain")
    with temporary_plugin(plain):
        p = pg.tensor(np.arange(4.0), backend="plain")
        assert _copy_tensor(p)._data is not p._data
