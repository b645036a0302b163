"""Class 1c: gradients at edge points follow PyTorch's conventions, on every backend.

Numerical differentiation cannot check a kink, so the expected values are PyTorch's own
(hard-coded in ``polygrad.testing.edges`` and re-derived from torch here when it is installed).
"""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.testing.edges import EDGE_CASES, check_edge_point, check_edge_points


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_edge_point_matches_pytorch(backend, case):
    assert check_edge_point(backend, case) is None


@pytest.mark.parametrize("case", EDGE_CASES, ids=lambda c: c.name)
def test_hard_coded_values_are_pytorchs(case):
    torch = pytest.importorskip("torch")
    xs = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in case.inputs]
    out = (case.torch_fn or case.fn)(*xs)
    out.sum().backward()
    if case.value is not None:
        np.testing.assert_allclose(out.detach().numpy(), np.asarray(case.value, dtype=np.float64), rtol=1e-12)
    for x, want in zip(xs, case.grads):
        got = np.zeros(x.shape) if x.grad is None else x.grad.numpy()
        np.testing.assert_allclose(got, np.asarray(want, dtype=np.float64), rtol=1e-12)


def test_check_edge_points_reports_a_wrong_rule(monkeypatch):
    """The kit is not vacuous: a rule with the old NaN-at-zero behaviour is reported by name."""
    from polygrad.engine import grad_rules
    from polygrad.ir.ops import Op

    def naive_pow(node, out, g):
        a, b = node.inputs
        return (g * b * a ** (b - 1), g * out * a.log())

    monkeypatch.setitem(grad_rules.RULES, Op.POW, naive_pow)
    failures = check_edge_points("numpy")
    assert any("pow-zero-exponent-at-zero" in f for f in failures)
    assert any("pow-zero-base-d-exponent" in f for f in failures)


def test_pow_zero_exponent_second_order():
    """x ** 0 stays gradient-free under create_graph (the where() rule is differentiable)."""
    x = pg.tensor([0.0, 3.0], dtype="float64", requires_grad=True)
    with np.errstate(all="ignore"):  # 0 ** -1 = inf inside the discarded branch of the rule
        (g,) = pg.grad((x ** 0.0).sum(), x, create_graph=True)
    assert g.numpy().tolist() == [0.0, 0.0]


def test_clip_gradient_away_from_bounds_is_numerical(backend):
    from polygrad.testing import check_grads
    x = np.array([-2.0, 0.3, 0.7, 2.0])
    check_grads(lambda t: t.clip(-1.0, 1.0), [x], backend=backend)


def test_clip_keeps_nan_and_integer_dtype():
    x = pg.tensor([np.nan, -5.0, 5.0], dtype="float64")
    assert np.isnan(x.clip(0, 1).numpy()[0])
    i = pg.tensor([-5, 0, 5])
    assert i.clip(-1, 1).numpy().tolist() == [-1, 0, 1]


def test_scalar_value_engine_follows_the_same_convention():
    from polygrad import Value
    x = Value(0.0)
    (x ** 0).backward()
    assert x.grad == 0.0
    b, e = Value(0.0), Value(2.0)
    (b ** e).backward()
    assert e.grad == 0.0 and b.grad == 0.0


def test_polygrad_check_runs_the_edge_points(monkeypatch, capsys):
    """`polygrad check NAME` (a full run) reports the edge-point set and fails on a disagreement."""
    from polygrad.testing import conformance

    monkeypatch.setattr(conformance, "run_conformance",
                        lambda name, *a, **k: conformance.Report(name, provided=set()))
    assert conformance.main(["numpy"]) == 0
    assert f"{len(EDGE_CASES)} of {len(EDGE_CASES)} agree" in capsys.readouterr().out

    from polygrad.engine import grad_rules
    from polygrad.ir.ops import Op
    monkeypatch.setitem(grad_rules.RULES, Op.POW,
                        lambda node, out, g: (g * node.inputs[1] * node.inputs[0] ** (node.inputs[1] - 1), None))
    assert conformance.main(["numpy"]) == 1
    assert "FAIL edge case 'pow-zero-exponent-at-zero'" in capsys.readouterr().out
