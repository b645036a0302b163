"""Fallback to scalar decomposition, proven with fault injection.

For every primitive op, a numpy kernel that raises or returns a wrong-shaped output must not
change the answer: the forward comes from the op's scalar reference over Values and the gradient
from ``Value.backward`` over that decomposition, and the event is reported (hook, FallbackWarning,
``pg.stats()``).  Then the policy knobs: ``pg.config.fallback = "raise"``, the size guard, the
per-backend fallback chain (with a fake backend registered at runtime), fused backward kernels,
and a GCN trained with every SpMM kernel call failing.
"""
from __future__ import annotations

import threading
import time
import types
import warnings
from typing import Callable

import numpy as np
import pytest

import polygrad as pg
from polygrad.engine import dispatch
from polygrad.errors import BackendError, BackendUnavailableError, PolygradError
from polygrad.ir.ops import Op
from polygrad.sparse.pattern import Pattern
from polygrad.tensor import spmm
from polygrad.testing import inject_fault
from polygrad.testing.cases import Case, cases

RTOL, ATOL = 1e-9, 1e-12


# -- helpers ------------------------------------------------------------------------------------------

class Recorder:
    """A plugin listening to the polygrad_fallback hook."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, BaseException]] = []

    @pg.hookimpl
    def polygrad_fallback(self, op, backend, layout, exception):
        self.events.append((op, backend, layout, exception))


@pytest.fixture
def recorder():
    rec = Recorder()
    pg.register_plugin(rec, name=f"fallback-recorder-{id(rec)}")
    pg.reset_stats()
    try:
        yield rec
    finally:
        pg.unregister_plugin(rec)
        pg.reset_stats()


def random_pattern(nrows: int, ncols: int, density: float, seed: int, layout: str = "csr") -> Pattern:
    """Canonical pattern of a small random CSR matrix; row 1 is kept empty (an edge case)."""
    rng = np.random.default_rng(seed)
    mask = rng.random((nrows, ncols)) < density
    mask[1, :] = False
    mask[0, 0] = True
    rows, cols = np.nonzero(mask)  # row-major, sorted within rows: canonical
    return Pattern.from_sorted((nrows, ncols), rows, cols, layout)


def _edge_cases() -> list[Case]:
    """Edge points the shared catalogue avoids (it is built for central differences) where the VJP
    rule and the scalar decomposition must still agree: relu at 0, ties in maximum and in max."""
    rng = np.random.default_rng(0)
    at_zero = rng.uniform(-1, 1, (3, 4))
    at_zero[0, 1] = 0.0                      # relu'(0) = 0 in the rule and in Value.relu
    tie_a, tie_b = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, (3, 4))
    tie_b[0, :2] = tie_a[0, :2]              # maximum splits the gradient evenly on ties
    ties_max = rng.uniform(-1, 1, (3, 4))
    ties_max[1, 3] = ties_max[1, 0] = 2.0    # max along axis 1 with a tie
    return [Case(Op.RELU, "at_zero", (at_zero,)),
            Case(Op.MAXIMUM, "ties", (tie_a, tie_b)),
            Case(Op.MAX, "ties", (ties_max,), {"axes": (1,), "keepdims": False})]


# every primitive op, every layout: the catalogue the conformance kit runs, plus the edge points
CASES = cases() + _edge_cases()


def apply_case(case: Case, ts) -> pg.Tensor:
    return dispatch.apply(case.op, tuple(ts), case.attrs, case.layout)


def run_case(case: Case, backend: str = "numpy"):
    """(forward output, gradients of sum(w * out) w.r.t. every differentiated input) as numpy arrays."""
    ts = case.tensors(backend, requires_grad=True)
    out = apply_case(case, ts)
    grads = []
    if case.differentiable:
        w = np.random.default_rng(7).uniform(0.5, 1.5, size=out.shape)
        (out * pg.tensor(w, backend=backend)).sum().backward()
        grads = [t.grad.numpy() for t, g in zip(ts, case.grad) if g]
    return out.numpy(), grads


def assert_same(got, want) -> None:
    out, grads = got
    want_out, want_grads = want
    assert out.dtype == want_out.dtype and out.shape == want_out.shape
    if out.dtype.kind == "f":
        np.testing.assert_allclose(out, want_out, rtol=RTOL, atol=ATOL)
    else:
        np.testing.assert_array_equal(out, want_out)
    assert len(grads) == len(want_grads)
    for g, wg in zip(grads, want_grads):
        assert g.shape == wg.shape and g.dtype == wg.dtype
        np.testing.assert_allclose(g, wg, rtol=RTOL, atol=ATOL)


# -- every primitive op ---------------------------------------------------------------------------------

def test_cases_cover_every_primitive_op():
    assert {c.op for c in CASES} == set(Op)
    assert {c.op.value for c in CASES} == set(pg.testing.list_ops())


@pytest.mark.parametrize("mode", ["raise", "wrong_shape"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_faulty_numpy_kernel_gives_the_clean_answer(case, mode, recorder):
    clean = run_case(case)
    pg.reset_stats()
    with inject_fault("numpy", case.op.value, mode=mode) as fault:
        with pytest.warns(pg.FallbackWarning, match=f"op '{case.op}' failed on backend 'numpy'"):
            faulty = run_case(case)
    assert_same(faulty, clean)
    assert fault.triggered >= 1
    assert pg.stats()["fallbacks_by_op"].get(case.op.value, 0) >= fault.triggered
    ops = {(op, be) for op, be, _layout, _exc in recorder.events}
    assert (case.op.value, "numpy") in ops
    expected = RuntimeError if mode == "raise" else BackendError
    assert all(isinstance(e, expected) for op, _, _, e in recorder.events if op == case.op.value)


def test_fallback_gradient_comes_from_the_decomposition_not_the_rule(recorder):
    """With SPMM faulty, backward never calls an SPMM or SDDMM kernel (the rule would: dX = AᵀdY
    is an SpMM, dA an SDDMM): the gradient is Value.backward over the decomposition."""
    case = _spmm_case()
    clean = run_case(case)
    ts = case.tensors(requires_grad=True)
    with inject_fault("numpy", "spmm") as fault, pytest.warns(pg.FallbackWarning):
        out = apply_case(case, ts)
    assert out._node.scalar is not None
    with inject_fault("numpy", "spmm", mode="nan", times=0) as spmm_probe, \
            inject_fault("numpy", "sddmm", mode="nan", times=0) as sddmm_probe:
        w = np.random.default_rng(7).uniform(0.5, 1.5, size=out.shape)
        (out * pg.tensor(w)).sum().backward()
    assert fault.triggered == 1 and spmm_probe.calls == 0 and sddmm_probe.calls == 0
    assert_same((out.numpy(), [t.grad.numpy() for t in ts]), clean)


# -- NaN passes through ----------------------------------------------------------------------------------

def test_nan_outputs_are_not_kernel_failures(recorder):
    x = pg.tensor(np.linspace(-1, 1, 6), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pg.FallbackWarning)
        with inject_fault("numpy", "exp", mode="nan") as fault:
            y = x.exp()
            y.sum().backward()
    assert fault.triggered >= 1
    assert np.isnan(y.numpy()).all()
    assert np.isnan(x.grad.numpy()).all()  # the rule's g * out carries the NaN on
    assert recorder.events == [] and pg.stats()["fallbacks_total"] == 0


def test_nan_mode_leaves_non_float_outputs_alone():
    a, b = pg.tensor([1.0, 2.0, 3.0]), pg.tensor([2.0, 2.0, 2.0])
    with inject_fault("numpy", "lt", mode="nan") as fault:
        assert (a < b).tolist() == [True, False, False]
    assert fault.triggered == 1


# -- reporting ---------------------------------------------------------------------------------------------

def test_warning_once_per_op_backend_and_exception_type(recorder):
    x = pg.tensor([1.0, 2.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with inject_fault("numpy", "neg"):
            for _ in range(3):
                -x
        with inject_fault("numpy", "neg", error=ZeroDivisionError):
            -x
            -x
    fallback_warnings = [w for w in caught if issubclass(w.category, pg.FallbackWarning)]
    assert len(fallback_warnings) == 2
    assert "RuntimeError" in str(fallback_warnings[0].message)
    assert "ZeroDivisionError" in str(fallback_warnings[1].message)
    assert len(recorder.events) == 5  # the hook fires every time
    stats = pg.stats()
    assert stats["fallbacks"] == {"neg/numpy/dense": 5}
    assert stats["fallbacks_by_op"] == {"neg": 5} and stats["fallbacks_total"] == 5


def test_error_instance_is_raised_as_given(recorder):
    err = KeyError("custom instance")
    with pytest.warns(pg.FallbackWarning), inject_fault("numpy", "tanh", error=err):
        y = pg.tensor([0.5]).tanh()
    assert y.item() == pytest.approx(np.tanh(0.5))
    assert recorder.events[0][3] is err


# -- policy: raise, size guard ------------------------------------------------------------------------------

class InjectedError(Exception):
    pass


def test_config_raise_reraises_the_kernel_error(monkeypatch, recorder):
    monkeypatch.setattr(pg.config, "fallback", "raise")
    x = pg.tensor(np.ones((2, 3)))
    with inject_fault("numpy", "matmul", error=InjectedError):
        with pytest.raises(InjectedError, match="injected fault.*matmul"):
            x @ x.T
    with inject_fault("numpy", "matmul", mode="wrong_shape"):
        with pytest.raises(BackendError, match=r"op 'matmul'.*returned shape \(2, 2, 2\).*expected \(2, 2\)"):
            x @ x.T
    assert recorder.events == [] and pg.stats()["fallbacks_total"] == 0


def test_config_fallback_rejects_unknown_policies():
    with pytest.raises(ValueError, match="'scalar' or 'raise'"):
        pg.config.fallback = "ignore"


@pytest.mark.parametrize("op, build", [
    ("matmul", lambda: (pg.tensor(np.ones((5, 6))), pg.tensor(np.ones((6, 7))), pg.matmul)),
    ("spmm", lambda: (pg.tensor(np.ones(random_pattern(6, 5, 0.5, 3).nnz)), pg.tensor(np.ones((5, 4))),
                      lambda v, x: spmm(v, x, random_pattern(6, 5, 0.5, 3)))),
])
def test_size_guard_raises_a_clear_backend_error(monkeypatch, op, build):
    a, b, fn = build()
    expected = fn(a, b).numpy()
    with inject_fault("numpy", op, error=InjectedError):
        # the guard is inclusive: an op of exactly the limit is still decomposed
        cost = dispatch.scalar_cost(Op(op), (a.shape, b.shape), {}, expected.shape)
        monkeypatch.setattr(pg.config, "scalar_fallback_max_elements", cost)
        with pytest.warns(pg.FallbackWarning):
            np.testing.assert_allclose(fn(a, b).numpy(), expected, rtol=RTOL)
        monkeypatch.setattr(pg.config, "scalar_fallback_max_elements", cost - 1)
        with pytest.raises(BackendError) as info:
            fn(a, b)
    msg = str(info.value)
    assert f"op '{op}'" in msg and str(cost) in msg and f"scalar_fallback_max_elements={cost - 1}" in msg
    assert "InjectedError" in msg and "injected fault" in msg
    assert isinstance(info.value.__cause__, InjectedError)


def test_size_guard_counts_the_inner_products_of_matmul():
    # [n, k] @ [k, m] does n*k*m multiplications: far more than the elements it reads and writes
    assert dispatch.scalar_cost(Op.MATMUL, ((40, 2000), (2000, 40)), {}, (40, 40)) > 3_000_000
    assert dispatch.scalar_cost(Op.ADD, ((3, 4), (4,)), {}, (3, 4)) == 12 + 4 + 12


# -- grad modes through a fallen-back op -------------------------------------------------------------------------

def test_retain_graph_backpropagates_a_decomposition_twice(recorder):
    a = np.random.default_rng(3).uniform(-1, 1, (3, 4))
    x = pg.tensor(a, requires_grad=True)
    with inject_fault("numpy", "tanh"), pytest.warns(pg.FallbackWarning):
        y = (x.tanh() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    want = np.tanh(a) + a * (1 - np.tanh(a) ** 2)
    np.testing.assert_allclose(first, want, rtol=RTOL)
    np.testing.assert_allclose(x.grad.numpy(), 2 * want, rtol=RTOL)


def test_create_graph_through_a_fallen_back_op_gives_second_derivatives(recorder):
    a = np.random.default_rng(4).uniform(-1, 1, (5,))
    x = pg.tensor(a, requires_grad=True)
    with inject_fault("numpy", "tanh"), pytest.warns(pg.FallbackWarning):
        y = x.tanh().sum()
        (g,) = pg.grad(y, x, create_graph=True)
        (g * g).sum().backward()
    t = np.tanh(a)
    np.testing.assert_allclose(g.numpy(), 1 - t ** 2, rtol=RTOL)
    # d/dx sum((1 - tanh^2)^2) = 2 (1 - t^2) (-2 t (1 - t^2))
    np.testing.assert_allclose(x.grad.numpy(), -4 * t * (1 - t ** 2) ** 2, rtol=1e-9, atol=1e-12)


def test_no_grad_fallback_keeps_no_decomposition():
    x = pg.tensor(np.ones(3), requires_grad=True)
    with inject_fault("numpy", "exp"), pytest.warns(pg.FallbackWarning), pg.no_grad():
        y = x.exp()
    assert not y.requires_grad and y._node is None
    np.testing.assert_allclose(y.numpy(), np.e)


def test_empty_tensor_gets_an_empty_gradient(recorder):
    x = pg.tensor(np.ones((0, 3)), requires_grad=True)
    with inject_fault("numpy", "tanh"), pytest.warns(pg.FallbackWarning):
        y = x.tanh()
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 3)


# -- inject_fault itself ------------------------------------------------------------------------------------------

def test_times_limits_the_faulty_calls(recorder):
    x = pg.tensor([0.1, 0.2])
    with inject_fault("numpy", Op.EXP, times=2) as fault, pytest.warns(pg.FallbackWarning):
        for _ in range(5):
            np.testing.assert_allclose(x.exp().numpy(), np.exp([0.1, 0.2]))
    assert (fault.calls, fault.triggered) == (5, 2)
    assert len(recorder.events) == 2


def test_table_is_restored_even_when_the_block_raises():
    before = pg.kernel_table("numpy")
    with pytest.raises(ZeroDivisionError):
        with inject_fault("numpy", "spmm"):
            assert pg.get_kernel("numpy", Op.SPMM, "csr") is not before[(Op.SPMM, "csr")]
            assert (Op.SPMM, "coo") not in pg.kernel_table("numpy")  # keyed once, under "csr"
            1 / 0
    assert pg.kernel_table("numpy") == before


def test_overlapping_faults_may_exit_in_any_order():
    key = (Op.TANH, "dense")
    original = pg.get_kernel("numpy", *key)
    x = pg.tensor([0.3])
    outer = inject_fault("numpy", "tanh", mode="nan")
    inner = inject_fault("numpy", "tanh", error=InjectedError)
    f_outer, f_inner = outer.__enter__(), inner.__enter__()
    outer.__exit__(None, None, None)  # the outer one ends first
    with pytest.warns(pg.FallbackWarning):
        assert x.tanh().item() == pytest.approx(np.tanh(0.3))  # inner still raises: fallback
    inner.__exit__(None, None, None)
    assert pg.get_kernel("numpy", *key) is original
    assert not np.isnan(x.tanh().item())
    assert f_inner.triggered == 1 and not f_outer.active


def test_faults_under_threads_give_right_answers():
    a = np.random.default_rng(5).uniform(-1, 1, (4, 3))
    want = np.tanh(a)
    errors: list = []

    def worker():
        try:
            for _ in range(20):
                np.testing.assert_allclose(pg.tensor(a).tanh().numpy(), want, rtol=RTOL)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pg.FallbackWarning)
        with inject_fault("numpy", "tanh") as fault:
            threads = [threading.Thread(target=worker) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert errors == []
    assert fault.triggered == 80


@pytest.mark.parametrize("kwargs, error, match", [
    ({"backend": "nope", "op": "spmm"}, BackendUnavailableError, "unknown backend 'nope'"),
    ({"backend": "numpy", "op": "spmmm"}, ValueError, "unknown op 'spmmm'.*spmm"),
    ({"backend": "numpy", "op": 3}, TypeError, "op must be"),
    ({"backend": 3, "op": "spmm"}, TypeError, "backend must be"),
    ({"backend": "numpy", "op": "spmm", "mode": "slow"}, ValueError, "mode must be one of"),
    ({"backend": "numpy", "op": "spmm", "times": -1}, ValueError, "times must be"),
    ({"backend": "numpy", "op": "spmm", "error": "boom"}, TypeError, "error must be an exception"),
])
def test_inject_fault_rejects_bad_arguments(kwargs, error, match):
    before = pg.kernel_table("numpy")
    with pytest.raises(error, match=match):
        with inject_fault(**kwargs):
            pass
    assert pg.kernel_table("numpy") == before


def test_inject_fault_accepts_enum_names():
    with inject_fault("numpy", "SPMM") as fault:
        assert fault.op is Op.SPMM


# -- the per-backend fallback chain, with a fake backend registered at runtime ------------------------------

class FakeArray:
    """The fake backend's array type: a numpy array in a wrapper, so conversions must happen."""
    __slots__ = ("a",)

    def __init__(self, a) -> None:
        self.a = np.asarray(a)


class FakeBackend(pg.Backend):
    name = "fake-fallback"
    description = "numpy kernels behind a wrapper type (test double)"

    def __init__(self, numpy_kernels: dict, fused_spmm: Callable | None = None) -> None:
        super().__init__()

        def wrap(kernel):
            return lambda *arrays, **attrs: FakeArray(kernel(*[x.a for x in arrays], **attrs))

        self.kernels = {key: wrap(k) for key, k in numpy_kernels.items()}
        if fused_spmm is not None:
            self.vjp_kernels = {(Op.SPMM, "csr"): fused_spmm}

    def from_numpy(self, array):
        return FakeArray(array.copy())

    def to_numpy(self, array):
        return array.a

    def owns(self, array) -> bool:
        return isinstance(array, FakeArray)

    def shape(self, array):
        return array.a.shape

    def dtype(self, array):
        return array.a.dtype


def _numpy_fused_spmm(g, values, x, *, needs, pattern):
    """A correct fused SpMM backward on FakeArrays (dvalues by SDDMM, dX = Aᵀ dY)."""
    g, v, xa = g.a, values.a, x.a
    dv = np.einsum("ij,ij->i", g[pattern.rows], xa[pattern.cols]) if needs[0] else None
    dx = None
    if needs[1]:
        dx = np.zeros_like(xa)
        np.add.at(dx, pattern.cols, v[:, None] * g[pattern.rows])
    return (None if dv is None else FakeArray(dv), None if dx is None else FakeArray(dx))


def make_fake_plugin(fused_spmm: Callable | None = None):
    """A plugin module providing FakeBackend, to register with pg.register_plugin."""
    numpy_kernels = pg.kernel_table("numpy")
    assert not any(type(k).__name__ == "_Wrapper" for k in numpy_kernels.values())  # no fault active
    plugin = types.ModuleType("fake_fallback_plugin")

    @pg.hookimpl
    def polygrad_backends():
        return [FakeBackend(numpy_kernels, fused_spmm)]

    plugin.polygrad_backends = polygrad_backends
    return plugin


@pytest.fixture
def fake():
    plugin = make_fake_plugin()
    pg.register_plugin(plugin)
    try:
        yield FakeBackend.name
    finally:
        pg.unregister_plugin(plugin)
    assert FakeBackend.name not in {b.name for b in pg.list_backends()}


def _spmm_case() -> Case:
    """An SpMM of a matrix with an empty row by a dense matrix, both differentiated."""
    return next(c for c in cases("spmm", "csr") if c.inputs[1].ndim == 2 and all(c.grad))


def test_chain_serves_from_the_next_backend(fake, monkeypatch, recorder):
    monkeypatch.setattr(pg.config, "fallback_chain", {fake: ["numpy"]})
    case = _spmm_case()
    clean = run_case(case, "numpy")
    ts = case.tensors(fake, requires_grad=True)
    with inject_fault(fake, "spmm") as fault, \
            inject_fault("numpy", "spmm", mode="nan", times=0) as numpy_probe, \
            pytest.warns(pg.FallbackWarning, match=f"backend '{fake}'"):
        out = apply_case(case, ts)
        assert out.backend == fake and out._node.scalar is None  # served by numpy, not decomposed
        w = np.random.default_rng(7).uniform(0.5, 1.5, size=out.shape)
        (out * pg.tensor(w, backend=fake)).sum().backward()
    assert numpy_probe.calls >= 1 and fault.triggered >= 1
    assert_same((out.numpy(), [t.grad.numpy() for t in ts]), clean)
    assert {(op, be) for op, be, _, _ in recorder.events} == {("spmm", fake)}


def test_chain_falls_through_to_scalar_when_every_link_fails(fake, monkeypatch, recorder):
    monkeypatch.setattr(pg.config, "fallback_chain", {fake: ["not-installed", "numpy"]})
    case = _spmm_case()
    clean = run_case(case, "numpy")
    with inject_fault(fake, "spmm"), inject_fault("numpy", "spmm", error=InjectedError), \
            pytest.warns(pg.FallbackWarning):
        assert_same(run_case(case, fake), clean)
    backends = [be for op, be, _, _ in recorder.events if op == "spmm"]
    assert fake in backends and "numpy" in backends
    assert pg.stats()["fallbacks"]["spmm/numpy/csr"] >= 1


# -- fused backward kernels -----------------------------------------------------------------------------------

def _broken_fused(kind: str):
    def fused(g, values, x, *, needs, pattern):
        if kind == "raise":
            raise InjectedError("fused backward exploded")
        dv, dx = _numpy_fused_spmm(g, values, x, needs=needs, pattern=pattern)
        if kind == "wrong_shape":
            return FakeArray(np.zeros(3)), dx
        if kind == "missing":
            return None, dx
        if kind == "short":
            return (dv,)
        return dv, dx
    return fused


@pytest.mark.parametrize("kind", ["ok", "raise", "wrong_shape", "missing", "short"])
def test_failing_fused_backward_is_recomputed_by_scalar_decomposition(kind, recorder):
    plugin = make_fake_plugin(_broken_fused(kind))
    pg.register_plugin(plugin)
    try:
        case = _spmm_case()
        clean = run_case(case, "numpy")
        # probes count the forward kernels the VJP rule would call: zero means it was not used
        with inject_fault(FakeBackend.name, "sddmm", mode="nan", times=0) as sddmm_probe:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = run_case(case, FakeBackend.name)
        assert_same(got, clean)
        assert sddmm_probe.calls == 0  # neither the fused kernel's rule nor the rule ran SDDMM
        fell_back = [w for w in caught if issubclass(w.category, pg.FallbackWarning)]
        if kind == "ok":
            assert recorder.events == [] and not fell_back
        else:
            assert [(op, be) for op, be, _, _ in recorder.events] == [("spmm", FakeBackend.name)]
            assert len(fell_back) == 1
    finally:
        pg.unregister_plugin(plugin)


def test_fused_backward_over_the_size_guard_uses_the_rule(monkeypatch, recorder):
    plugin = make_fake_plugin(_broken_fused("raise"))
    pg.register_plugin(plugin)
    try:
        case = _spmm_case()
        clean = run_case(case, "numpy")
        monkeypatch.setattr(pg.config, "scalar_fallback_max_elements", 10)
        with inject_fault(FakeBackend.name, "sddmm", mode="nan", times=0) as sddmm_probe, \
                pytest.warns(pg.FallbackWarning, match="fused backward exploded"):
            got = run_case(case, FakeBackend.name)
        assert_same(got, clean)
        assert sddmm_probe.calls == 1  # the rule's dA = SDDMM(dY, X) ran
    finally:
        pg.unregister_plugin(plugin)


def test_fused_backward_failure_under_config_raise(monkeypatch):
    plugin = make_fake_plugin(_broken_fused("raise"))
    pg.register_plugin(plugin)
    try:
        monkeypatch.setattr(pg.config, "fallback", "raise")
        with pytest.raises(InjectedError, match="fused backward exploded"):
            run_case(_spmm_case(), FakeBackend.name)
    finally:
        pg.unregister_plugin(plugin)


# -- a GCN trained with every SpMM kernel call failing ------------------------------------------------------

def _synthetic_graph(n: int = 200, classes: int = 4, features: int = 16, seed: int = 0):
    """A stochastic block model with noisy class-dependent features; Â = D^-1/2 (A + I) D^-1/2."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    same = y[:, None] == y[None, :]
    prob = np.where(same, 0.05, 0.005)
    upper = np.triu(rng.random((n, n)) < prob, 1)
    adj = upper | upper.T | np.eye(n, dtype=bool)
    rows, cols = np.nonzero(adj)
    deg = adj.sum(1).astype(np.float64)
    values = 1.0 / np.sqrt(deg[rows] * deg[cols])
    pattern = Pattern.from_sorted((n, n), rows, cols)
    centers = rng.normal(0, 1, (classes, features))
    x = centers[y] + rng.normal(0, 1.5, (n, features))
    train = rng.permutation(n)[: n // 2]
    return pattern, values, x, y, train


def train_gcn(steps: int = 20, hidden: int = 16, lr: float = 0.5) -> list[float]:
    """A 2-layer GCN (Â relu(Â X W1) W2), full-batch SGD; returns the loss of every step."""
    pattern, values, x_np, y, train = _synthetic_graph()
    rng = np.random.default_rng(1)
    f, c = x_np.shape[1], int(y.max()) + 1
    w1 = rng.normal(0, np.sqrt(2.0 / (f + hidden)), (f, hidden))
    w2 = rng.normal(0, np.sqrt(2.0 / (hidden + c)), (hidden, c))
    a, x = pg.tensor(values), pg.tensor(x_np)
    losses = []
    for _ in range(steps):
        W1, W2 = pg.tensor(w1, requires_grad=True), pg.tensor(w2, requires_grad=True)
        h = spmm(a, x @ W1, pattern).relu()
        logits = spmm(a, h @ W2, pattern)
        loss = pg.cross_entropy(logits, y, mask=train)
        loss.backward()
        losses.append(loss.item())
        w1 = w1 - lr * W1.grad.numpy()
        w2 = w2 - lr * W2.grad.numpy()
    return losses


def test_gcn_training_with_every_spmm_failing_matches_the_clean_run(recorder):
    t0 = time.perf_counter()
    clean = train_gcn()
    t1 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with inject_fault("numpy", "spmm") as fault:
            faulty = train_gcn()
    t2 = time.perf_counter()
    np.testing.assert_allclose(faulty, clean, rtol=1e-6)
    assert clean[-1] < 0.8 * clean[0]  # it does learn: the trajectory is not flat by accident
    assert fault.triggered == fault.calls == 2 * 20  # every forward SpMM failed; backward used Values
    assert pg.stats()["fallbacks_by_op"] == {"spmm": 40}
    assert sum(issubclass(w.category, pg.FallbackWarning) for w in caught) == 1
    print(f"\nGCN 20 steps, 200 nodes: clean {t1 - t0:.3f}s, every SpMM failing {t2 - t1:.3f}s, "
          f"ratio faulty/clean {(t2 - t1) / (t1 - t0):.1f}x")


def test_polygrad_errors_are_not_fallen_back_from(recorder):
    """A kernel raising a polygrad error on purpose (its own validation) is the user's to see."""
    with inject_fault("numpy", "exp", error=pg.errors.ShapeError("kernel says no")):
        with pytest.raises(pg.errors.ShapeError, match="kernel says no"):
            pg.tensor([1.0]).exp()
    assert recorder.events == []
    assert issubclass(dispatch.KernelFault, PolygradError)


def test_validate_mode_catches_a_kernel_that_disagrees_with_the_reference(monkeypatch):
    """POLYGRAD_VALIDATE / pg.config.validate shadow-runs kernels against the scalar reference."""
    import polygrad as pg
    from polygrad.errors import BackendError
    from polygrad.ir.ops import Op
    from polygrad.runtime.registry import registry

    monkeypatch.setattr(pg.config, "validate", True)
    x = pg.tensor([0.5, -1.0, 2.0], dtype=pg.float64)
    assert (x.exp() * 2).tolist() == pytest.approx([2 * np.exp(0.5), 2 * np.exp(-1.0), 2 * np.exp(2.0)])
    table = registry.tables["numpy"]
    good = table[(Op.EXP, "dense")]
    monkeypatch.setitem(table, (Op.EXP, "dense"), lambda a: good(a) * (1 + 1e-3))
    with pytest.raises(BackendError, match=r"POLYGRAD_VALIDATE: op 'exp' on backend 'numpy'.*max abs error"):
        x.exp()
