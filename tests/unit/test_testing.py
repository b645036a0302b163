"""polygrad.testing: check_grads, numerical_grad, assert_backends_agree, the case catalogue, the
conformance checks (each one made to fail by a deliberately wrong backend), xfail files."""
from __future__ import annotations

import json

import numpy as np
import pytest

import polygrad as pg
from polygrad.engine import grad_rules
from polygrad.backends.array_kernels import make_kernels
from polygrad.errors import ConformanceError, DTypeError
from polygrad.ir.ops import NON_DIFFERENTIABLE, Op
from polygrad.runtime.registry import registry
from polygrad.testing import assert_backends_agree, check_grads, numerical_grad
from polygrad.testing import conformance as kit
from polygrad.testing.cases import bad_cases, cases, covered, sample_pattern
from polygrad.testing.temporary import temporary_plugin


# -- a deliberately wrong backend ----------------------------------------------------------------

class Wrong(pg.Backend):
    """numpy kernels with one fault, chosen per test."""

    def __init__(self, name: str, kernels: dict | None = None, vjps: dict | None = None,
                 drop: tuple = ()):
        super().__init__()
        self.name = name
        self.kernels = make_kernels(np)
        self.kernels.update(kernels or {})
        for key in drop:
            del self.kernels[key]
        self.vjp_kernels.update(vjps or {})

    def from_numpy(self, a):
        return np.array(a)

    def to_numpy(self, a):
        return np.asarray(a)


def run(backend: Wrong, **kwargs) -> kit.Report:
    with temporary_plugin(backend):
        return kit.run_conformance(backend.name, **kwargs)


def messages(report: kit.Report) -> str:
    return "\n".join(r.message for r in report.failures)


# -- check_grads / numerical_grad / assert_backends_agree ------------------------------------------

def test_numerical_grad_matches_closed_form():
    x = np.random.default_rng(0).normal(size=(3, 2))
    g = np.random.default_rng(1).normal(size=(3, 2))
    (num,) = numerical_grad(lambda t: t * t * t, [x], grad_output=g)
    np.testing.assert_allclose(num, 3 * x ** 2 * g, rtol=1e-7)


def test_check_grads_passes_on_composites_and_returns_gradients():
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=(3, 2))
    gx, gw = check_grads(lambda x, w: (x @ w).softmax(-1).log().sum(), [x, w])
    assert gx.shape == (4, 3) and gw.shape == (3, 2) and gx.dtype == np.float64
    check_grads(lambda x: x.sigmoid() * x.tanh(), [rng.normal(size=5)], backend="scalar")


def test_check_grads_wrt_and_integer_inputs():
    idx = np.array([2, 0, 2])
    (gx, gi) = check_grads(lambda x, i: x[i].sum(), [np.arange(3.0), idx], wrt=[0])
    np.testing.assert_allclose(gx, [1.0, 0.0, 2.0])
    assert gi is None
    with pytest.raises(DTypeError, match="only floating"):
        check_grads(lambda x, i: x[i].sum(), [np.arange(3.0), idx], wrt=[1])


def test_check_grads_catches_a_wrong_vjp_rule(monkeypatch):
    monkeypatch.setitem(grad_rules.RULES, Op.TANH, lambda node, out, g: (g * (1 - out * out) * 1.001,))
    with pytest.raises(ConformanceError) as err:
        check_grads(lambda x: x.tanh(), [np.linspace(-1, 1, 6).reshape(2, 3)])
    msg = str(err.value)
    assert "input 0 (2, 3)" in msg and "max abs error" in msg and "central differences" in msg


def test_check_grads_rejects_non_tensor_and_integer_outputs():
    with pytest.raises(DTypeError, match="must return a polygrad Tensor"):
        check_grads(lambda x: 1.0, [np.ones(2)])
    with pytest.raises(DTypeError, match="floating output"):
        check_grads(lambda x: x > 0, [np.ones(2)])


def test_assert_backends_agree_and_disagreement_names_both():
    rng = np.random.default_rng(3)
    res = assert_backends_agree(lambda x: x.softmax(-1) * 3, [rng.normal(size=(2, 4))], backends=["scalar", "numpy"])
    assert set(res) == {"scalar", "numpy"}
    bad = Wrong("wrong-exp", {(Op.EXP, "dense"): lambda x: np.exp(x) * 1.01})
    with temporary_plugin(bad), pytest.raises(ConformanceError) as err:
        assert_backends_agree(lambda x: x.exp().sum(), [rng.normal(size=3)], backends=["numpy", "wrong-exp"])
    assert "'wrong-exp' vs 'numpy'" in str(err.value) and "max abs error" in str(err.value)
    with pytest.raises(ConformanceError, match="at least two"):
        assert_backends_agree(lambda x: x, [np.ones(2)], backends=["numpy"])


# -- the catalogue ------------------------------------------------------------------------------------

def test_catalogue_covers_every_op_and_layout():
    pairs = covered()
    for op in Op:
        assert any(o == op for o, _ in pairs), f"no case for op '{op}'"
    for op in (Op.SPMM, Op.SDDMM, Op.SEGMENT_SUM, Op.SEGMENT_MAX):
        assert {(op, "csr"), (op, "coo")} <= pairs
    for op in set(Op) - NON_DIFFERENTIABLE - {Op.CAST}:
        assert any(c.differentiable for c in cases(op)), f"no gradient case for op '{op}'"
    assert any(a.size == 0 for c in cases() for a in c.inputs)             # empty tensors
    assert any(a.ndim == 0 for c in cases() for a in c.inputs)             # 0-d tensors
    # cast and sum accept every operand once their attrs are normalised (by tensor.py): no bad case
    assert {c.op for c in bad_cases()} == set(Op) - {Op.CAST, Op.SUM}


def test_cases_run_through_dispatch_and_ids_are_unique():
    ids = [c.id for c in cases()]
    assert len(ids) == len(set(ids))
    case = cases("spmm", "coo")[0]
    out = case.run("numpy")
    assert out.shape[0] == case.attrs["pattern"].shape[0]
    p = sample_pattern()
    assert p is sample_pattern() and p.nnz > 0 and p.indptr[1] == p.indptr[2]  # shared, row 1 empty


# -- each check fails on the fault it exists for -------------------------------------------------

def test_builtin_backends_pass():
    for name in ("numpy", "scalar"):
        report = kit.run_conformance(name, ops=["add", "matmul", "spmm", "sum"])
        assert report.ok, messages(report)


def test_kernel_off_by_epsilon_fails_naming_op_layout_and_error():
    report = run(Wrong("wrong-eps", {(Op.EXP, "dense"): lambda x: np.exp(x) + 1e-4}), ops=["exp", "add"])
    assert not report.ok
    assert report.cell(Op.EXP, "dense") == "FAIL" and report.cell(Op.ADD, "dense") == "pass"
    forward = [r for r in report.failures if r.check == "forward"]
    assert forward and all(r.op == Op.EXP for r in report.failures)
    assert "op 'exp' (dense)" in forward[0].message and "max abs error 0.0001" in forward[0].message
    assert forward[0].max_error == pytest.approx(1e-4, rel=1e-3)


def test_wrong_fused_vjp_fails_naming_op_layout_and_error():
    k = make_kernels(np)

    def wrong_vjp(g, values, x, *, needs, pattern):
        tp, perm = pattern.transpose()
        dx = k[(Op.SPMM, "csr")](values[perm], g, pattern=tp) * 1.01          # 1% off
        g2, x2 = (g.reshape(-1, 1), x.reshape(-1, 1)) if x.ndim == 1 else (g, x)
        dv = k[(Op.SDDMM, "csr")](g2, x2, pattern=pattern)
        # and forgets dA when only the values need a gradient
        return (dv if needs[1] else None) if needs[0] else None, dx if needs[1] else None

    report = run(Wrong("wrong-vjp", vjps={(Op.SPMM, "csr"): wrong_vjp}), ops=["spmm"],
                 checks=["fused-vjp", "grad-numeric"])
    fused = [r for r in report.failures if r.check == "fused-vjp"]
    # one kernel serves both labels of the canonical storage (polygrad.ir.ops.kernel_key): both fail
    assert fused and report.cell(Op.SPMM, "csr") == "FAIL" and report.cell(Op.SPMM, "coo") == "FAIL"
    text = messages(report)
    assert "op 'spmm' (csr)" in text and "VJP rule" in text and "max abs error" in text
    assert "returned no gradient for input 0" in text          # values need a gradient, got None
    assert any(r.check == "grad-numeric" for r in report.failures)  # autodiff used it: caught too


def test_raising_kernel_wrong_dtype_and_input_mutation_fail():
    def raising(x):
        raise RuntimeError("boom")

    def mutating(a, b):
        a *= 1.0  # noqa - in place
        a[...] = 0
        return np.add(a, b)

    report = run(Wrong("wrong-misc", {(Op.TANH, "dense"): raising,
                                      (Op.NEG, "dense"): lambda x: np.negative(x).astype(np.float32),
                                      (Op.ADD, "dense"): mutating}), ops=["tanh", "neg", "add"],
                 checks=["forward"])
    text = messages(report)
    assert "op 'tanh' (dense)" in text and "kernel raised RuntimeError: boom" in text
    assert "op 'neg' (dense)" in text and "dtype float32" in text
    assert "op 'add' (dense)" in text and "modified its input 0 in place" in text


def test_fallback_during_gradient_is_a_failure():
    # the sum kernel fails only on the gradient path (expand -> sum of a 3-d array)
    def flaky_sum(x, *, axes, keepdims):
        if x.ndim == 3:
            raise MemoryError("simulated")
        return np.sum(x, axis=axes, keepdims=keepdims)

    report = run(Wrong("wrong-flaky", {(Op.SUM, "dense"): flaky_sum}), ops=["expand"], checks=["grad-numeric"])
    assert "fell back: MemoryError: simulated" in messages(report)


def test_missing_kernels_are_not_provided_not_failures():
    report = run(Wrong("partial", drop=[(Op.SDDMM, "csr"), (Op.EXP, "dense")]),  # sddmm: keyed once
                 ops=["sddmm", "exp", "spmm"])
    assert report.ok, messages(report)
    assert report.cell(Op.SDDMM, "csr") == "-" and report.cell(Op.EXP, "dense") == "-"
    assert report.cell(Op.SPMM, "csr") == "pass"   # its gradient uses sddmm: recomputed by fallback


def test_errors_check_passes_and_sees_kernel_calls(monkeypatch):
    (case,) = [c for c in bad_cases("matmul") if c.name == "inner_mismatch"]
    assert kit.run_check("numpy", "errors", case) == 0.0
    # if inference let it through, the spy would see the kernel run
    from polygrad.engine import inference
    monkeypatch.setitem(inference._RULES, Op.MATMUL, lambda *a: ((2, 2), np.dtype(np.float64)))
    with pytest.raises(kit.CheckFailure, match="kernel ran on invalid input|raised no error|expected"):
        kit.run_check("numpy", "errors", case)


# -- xfail files and the report ---------------------------------------------------------------------

def test_xfail_file_turns_failures_into_xfail_and_flags_stale_entries(tmp_path):
    path = tmp_path / "xf.txt"
    path.write_text("# known\nwrong-x exp dense * # off by 1e-4\nwrong-x add dense forward same  # stale\n")
    xfails = kit.load_xfails([str(path)])
    report = run(Wrong("wrong-x", {(Op.EXP, "dense"): lambda x: np.exp(x) + 1e-4}), ops=["exp", "add"],
                 xfails=xfails)
    assert report.ok and report.cell(Op.EXP, "dense") == "xfail"
    # a glob entry also "xpasses" the exp cases the fault cannot show (empty inputs, errors)
    xpassed = {(r.op, r.check, r.case) for r in report.results if r.status == "xpass"}
    assert (Op.ADD, "forward", "same") in xpassed and "xpassed" in report.summary()
    assert all(r.reason == "off by 1e-4" for r in report.results if r.status == "xfail")
    with pytest.raises(ValueError, match="xf2.txt:1"):
        (tmp_path / "xf2.txt").write_text("too few fields\n")
        kit.load_xfails([str(tmp_path / "xf2.txt")])


def test_builtin_xfail_file_ships_and_parses():
    assert kit.load_xfails() == [] or all(isinstance(x, kit.XFail) for x in kit.load_xfails())


def test_report_to_dict_is_json():
    report = kit.run_conformance("numpy", ops=["relu"])
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] and data["table"]["relu/dense"] == "pass" and data["table"]["relu/csr"] == "-"


# -- temporary registration -------------------------------------------------------------------------

def test_temporary_plugin_leaves_no_trace():
    before = [(b.name, b.origin) for b in pg.list_backends()]
    tables = registry.tables["numpy"]
    spmm_kernel = tables[(Op.SPMM, "csr")]

    class Override:
        @pg.hookimpl
        def polygrad_kernels(self):
            return [pg.KernelOverride("numpy", "spmm", "csr", lambda *a, **k: None, priority=99)]

    with temporary_plugin(Wrong("ghost")), temporary_plugin(Override()):
        assert "ghost" in [b.name for b in pg.list_backends()]
        assert pg.get_kernel("numpy", Op.SPMM, "csr") is not spmm_kernel
    assert [(b.name, b.origin) for b in pg.list_backends()] == before
    assert registry.tables["numpy"] is tables and tables[(Op.SPMM, "csr")] is spmm_kernel
