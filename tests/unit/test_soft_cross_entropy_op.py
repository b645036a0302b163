"""``Op.SOFT_CROSS_ENTROPY``: the fused form of ``pg.cross_entropy`` at class probabilities.

The promise is bitwise: loss, both gradients (logits and probabilities) and floating-point
warnings are the composite's ``-(log_softmax(x) * probs).sum(-1)``, reduced (the slow path it
replaces), whether the gradients come from the backend's fused backward or from the rule;
gradients also agree with central differences (float64), second order included, and with
PyTorch where it is installed.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.ir.ops import FUSED, Op
from polygrad.runtime.registry import registry
from polygrad.testing import check_grads
from tests.helpers import (LOGIT_SPECIALS, assert_bitwise, assert_second_order_matches_central_differences,
                           draw_logits, numpy_kernel_steps, without_kernel)

KEY = (Op.SOFT_CROSS_ENTROPY, "dense")


@pytest.fixture(autouse=True)
def served_on_numpy(monkeypatch):
    """pg.cross_entropy on numpy runs the composite by default (the kernel's ``accepts`` declines:
    slower in one process); these tests make it serve, to check its steps against the composite."""
    registry.load()  # the tables are filled on first use: this file may run first, or alone
    monkeypatch.setattr(registry.tables["numpy"][KEY], "accepts", lambda x, probs: True)


def test_numpy_runs_the_composite_by_default(monkeypatch):
    monkeypatch.undo()
    x = pg.tensor(np.zeros((3, 2)), requires_grad=True)
    assert pg.cross_entropy(x, np.eye(2)[[0, 1, 1]])._node.op == Op.MUL


def run(x: np.ndarray, probs: np.ndarray, reduction: str, seed: np.ndarray | None, probs_grad: bool):
    """(loss, dx, dprobs or None, warning messages, the op the loss came from) of
    pg.cross_entropy on fresh leaves."""
    t = pg.tensor(x, requires_grad=True)
    p = pg.tensor(probs, requires_grad=probs_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = pg.cross_entropy(t, p, reduction=reduction)
        loss.backward(None if seed is None else pg.tensor(seed))
    dprobs = p.grad.numpy() if probs_grad else None
    return loss.numpy(), t.grad.numpy(), dprobs, sorted(str(w.message) for w in caught), loss._node.op


@st.composite
def problems(draw):
    x = draw_logits(draw)
    (n, c), dtype = x.shape, x.dtype
    plain, special = st.floats(-30, 30, width=32), st.sampled_from(LOGIT_SPECIALS)
    # probabilities (rows summing to 1), or any numbers (PyTorch takes them as they are)
    if draw(st.booleans()):
        raw = np.array(draw(st.lists(st.floats(0, 1, width=32), min_size=n * c, max_size=n * c)),
                       dtype=np.float64).reshape(n, c) + 1e-3
        probs = (raw / raw.sum(-1, keepdims=True)).astype(dtype)
    else:
        probs = np.array(draw(st.lists(st.one_of(plain, special), min_size=n * c, max_size=n * c)),
                         dtype=np.float64).astype(dtype).reshape(n, c)
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    seed = None
    if reduction == "none":
        seed = np.array(draw(st.lists(st.one_of(plain, special), min_size=n, max_size=n)), dtype=dtype)
    return x, probs, reduction, seed, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_fused_op_gives_the_composites_bits(problem):
    x, probs, reduction, seed, probs_grad = problem
    loss, dx, dp, warned, op = run(x, probs, reduction, seed, probs_grad)  # fused forward, fused backward
    assert op == Op.SOFT_CROSS_ENTROPY
    with without_kernel(registry.vjp_tables, KEY):  # fused forward, the rule's backward
        r_loss, r_dx, r_dp, r_warned, _ = run(x, probs, reduction, seed, probs_grad)
    with without_kernel(registry.tables, KEY):  # the composite: its ops forward, their rules backward
        c_loss, c_dx, c_dp, c_warned, c_op = run(x, probs, reduction, seed, probs_grad)
    assert c_op != Op.SOFT_CROSS_ENTROPY
    for got in (loss, r_loss):
        assert_bitwise(got, c_loss)
    for got in (dx, r_dx):
        assert_bitwise(got, c_dx)
    if probs_grad:
        for got in (dp, r_dp):
            assert_bitwise(got, c_dp)
    # the same floating-point warnings, as many times (the backward's recomputation of the forward's
    # steps does not warn again: the composite's backward does not recompute)
    assert warned == r_warned == c_warned


def test_gradients_match_central_differences_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)) * 3
    probs = rng.dirichlet(np.ones(4), size=6)
    for reduction in ("mean", "sum", "none"):
        check_grads(lambda t, p: pg.cross_entropy(t, p, reduction=reduction), [x, probs], rtol=1e-7, atol=1e-9)


def test_second_order_through_the_rule_matches_central_differences():
    """``create_graph``: the rule's steps are differentiable (the fused kernel is not used)."""
    rng = np.random.default_rng(1)
    x0, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    probs = pg.tensor(rng.dirichlet(np.ones(3), size=5))
    assert_second_order_matches_central_differences(lambda t: pg.cross_entropy(t, probs), x0, v)


def test_the_composite_runs_where_the_op_cannot_promise_its_bits():
    assert Op.SOFT_CROSS_ENTROPY in FUSED
    rng = np.random.default_rng(5)
    x, probs = rng.normal(size=(3, 4)), rng.dirichlet(np.ones(4), size=3)
    with without_kernel(registry.tables, KEY):  # a backend without the kernel
        assert run(x, probs, "mean", None, False)[-1] == Op.MUL  # the composite's last step: sum * (1 / N)
    t = pg.tensor(x, requires_grad=True)
    # probabilities computed from a tensor that takes a gradient: two paths, the composite's order
    derived = pg.tensor(probs, requires_grad=True) * 1.0
    assert pg.cross_entropy(t, derived)._node.op == Op.MUL
    assert pg.cross_entropy(t, t)._node.op == Op.MUL  # the logits as their own targets
    assert pg.cross_entropy(t, pg.tensor(probs.astype(np.float32)))._node.op == Op.MUL  # other dtype
    # class weights and label smoothing: the composite
    assert pg.cross_entropy(t, probs, weight=np.ones(4))._node.op == Op.MUL
    assert pg.cross_entropy(t, probs, label_smoothing=0.1)._node.op == Op.MUL
    # a numpy array of the input's shape is taken as probabilities, as PyTorch does
    assert pg.cross_entropy(t, probs)._node.op == Op.SOFT_CROSS_ENTROPY


def test_scalar_backend_and_validate_mode_agree_with_numpy():
    rng = np.random.default_rng(2)
    x, probs = rng.normal(size=(4, 3)), rng.dirichlet(np.ones(3), size=4)
    want = pg.cross_entropy(pg.tensor(x), pg.tensor(probs)).item()
    with pg.use_backend("scalar"):
        got = pg.cross_entropy(pg.tensor(x), pg.tensor(probs)).item()
    assert got == pytest.approx(want, rel=1e-12)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pg.config, "validate", True)  # shadow-runs the kernel against the scalar reference
        assert pg.cross_entropy(pg.tensor(x), pg.tensor(probs)).item() == want


def test_the_fused_kernel_calls_what_dispatch_runs():
    """A fault injected into exp (as a plugin override would replace it) reaches the fused op,
    which then falls back as a whole, to the clean answer."""
    from polygrad.testing import inject_fault

    rng = np.random.default_rng(4)
    x, probs = rng.normal(size=(3, 4)), rng.dirichlet(np.ones(4), size=3)
    clean = run(x, probs, "mean", None, True)
    with inject_fault("numpy", "exp") as fault:
        faulty = run(x, probs, "mean", None, True)
    assert fault.triggered >= 1 and any("op 'soft_cross_entropy' failed" in w for w in faulty[3])
    for got, want in zip(faulty[:3], clean[:3]):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_mismatched_probabilities_are_named():
    x = pg.tensor(np.zeros((2, 3)))
    with pytest.raises(pg.errors.ShapeError, match="must match input"):
        pg.cross_entropy(x, pg.tensor(np.zeros((2, 4))))
    from polygrad.engine.dispatch import apply

    with pytest.raises(pg.errors.DTypeError, match="op 'soft_cross_entropy': probabilities of dtype float32"):
        apply(Op.SOFT_CROSS_ENTROPY, (x, pg.tensor(np.zeros((2, 3), dtype=np.float32))), {"reduction": "mean"})
    with pytest.raises(pg.errors.ShapeError, match="reduction"):
        apply(Op.SOFT_CROSS_ENTROPY, (x, x), {"reduction": "max"})


def test_compile_follows_new_probabilities():
    """Probabilities are an input: a compiled step reads the new ones every call."""
    x = pg.tensor(np.array([[1.0, 2.0, 0.5], [0.0, 3.0, -1.0]]), requires_grad=True)

    def step(probs):
        return pg.cross_entropy(x, probs)

    eye = np.eye(3)
    for compiled in (pg.compile(step), pg.compile(step, pure=True)):
        for rows in ([0, 1], [2, 2], [0, 1], [1, 0], [1, 0]):
            probs = pg.tensor(eye[rows])
            assert compiled(probs).item() == step(probs).item()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_pytorch_float64(reduction):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: no comparison against F.cross_entropy")
    import torch.nn.functional as F

    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 4)) * 5
    x[0] = [0.0, -3.0, 1.0, 2.0]
    x[1] = [30.0, -30.0, 0.0, 0.0]   # a nearly certain class
    x[2] = [3.0, 3.0, 3.0, 3.0]      # ties
    probs = rng.dirichlet(np.ones(4), size=7)
    probs[3] = [0.0, 0.0, 1.0, 0.0]  # one-hot
    seed = rng.normal(size=7) if reduction == "none" else None
    loss, dx, dp, _, op = run(x, probs, reduction, seed, True)
    assert op == Op.SOFT_CROSS_ENTROPY
    xt = torch.tensor(x, requires_grad=True)
    pt = torch.tensor(probs, requires_grad=True)
    lt = F.cross_entropy(xt, pt, reduction=reduction)
    lt.backward(None if seed is None else torch.tensor(seed))
    np.testing.assert_allclose(loss, lt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dp, pt.grad.numpy(), rtol=1e-12, atol=1e-12)


def _both_ops(x: np.ndarray, reduction: str, seed, **grad_errstate):
    """(loss, dx) bytes of the integer and the probability op on ``x`` (backward under
    ``np.errstate(**grad_errstate)``), and the ops the losses came from."""
    out = []
    classes = np.arange(x.shape[0]) % x.shape[1]
    for target in (classes, np.eye(x.shape[1], dtype=x.dtype)[classes]):
        t = pg.tensor(x, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = pg.cross_entropy(t, target, reduction=reduction)
        with np.errstate(**grad_errstate), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss.backward(None if seed is None else pg.tensor(seed))
        out.append((loss.numpy().tobytes(), t.grad.numpy().tobytes(), [str(w.message) for w in caught],
                    loss._node.op))
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_backward_that_raises_on_invalid_values_runs_as_the_composites(reduction):
    """The fused backward recomputes the forward's shift and exponentials; a row holding an
    infinity makes them warn (or, under ``np.errstate(invalid="raise")``, raise) again, where the
    composite's backward does not recompute: neither may warn, fail or fall back there."""
    x = np.array([[np.inf, 1.0, 2.0], [0.5, 1.0, -1.0]], dtype=np.float32)
    seed = np.ones(2, np.float32) if reduction == "none" else None
    fused = _both_ops(x, reduction, seed, invalid="raise")
    with without_kernel(registry.tables, KEY), without_kernel(registry.tables, (Op.CROSS_ENTROPY, "dense")):
        composite = _both_ops(x, reduction, seed, invalid="raise")
    assert [f[3] for f in fused] == [Op.CROSS_ENTROPY, Op.SOFT_CROSS_ENTROPY]
    for f, c in zip(fused, composite):
        assert f[:3] == c[:3] and f[2] == []


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_upstream_gradient_of_another_dtype_gives_the_composites_bits(reduction):
    """A float64 upstream gradient for a float32 loss (a loss scale): the mean's rule multiplies it
    by the forward's constant, 1/N in the loss's dtype, as the composite's mul rule does."""
    x = np.random.default_rng(6).normal(size=(7, 3)).astype(np.float32) * 4
    seed = np.float64(1.7) if reduction != "none" else np.linspace(-2, 2, 7)
    fused = _both_ops(x, reduction, np.asarray(seed, dtype=np.float64))
    with without_kernel(registry.tables, KEY), without_kernel(registry.tables, (Op.CROSS_ENTROPY, "dense")):
        composite = _both_ops(x, reduction, np.asarray(seed, dtype=np.float64))
    assert [f[:3] for f in fused] == [c[:3] for c in composite]


# -- a forward's kept exponentials (what a backend that holds them from forward to backward uses) ----

@settings(max_examples=100, deadline=None)
@given(problems())
def test_a_forwards_kept_exponentials_give_the_recomputed_gradients_bits(problem):
    """``soft_loss(keep=)`` hands ``soft_grads(saved=)`` the forward's ``exp(shifted)`` and row
    sums: the same bits, both gradients, as the backward's own recomputation."""
    from polygrad.engine import cross_entropy

    x, probs, reduction, seed, _ = problem
    steps, keep = numpy_kernel_steps(), {}
    with np.errstate(all="ignore"):
        loss = cross_entropy.soft_loss(x, probs, reduction, steps, keep)
        g = np.ones(np.shape(loss), x.dtype) if seed is None else seed
        recomputed = cross_entropy.soft_grads(g, x, probs, reduction, (True, True), steps)
        kept = cross_entropy.soft_grads(g, x, probs, reduction, (True, True), steps, saved=(keep["e"], keep["s"]))
    assert_bitwise(list(kept), list(recomputed))


def test_the_backward_reads_the_kept_exponentials():
    """Kept sums altered on purpose change the logits' gradient: ``saved`` is what it reads."""
    from polygrad.engine import cross_entropy

    x = np.random.default_rng(0).standard_normal((6, 3))
    probs = np.eye(3)[np.arange(6) % 3]
    steps, keep = numpy_kernel_steps(), {}
    cross_entropy.soft_loss(x, probs, "sum", steps, keep)
    g = np.ones((), x.dtype)
    right = cross_entropy.soft_grads(g, x, probs, "sum", (True, False), steps, saved=(keep["e"], keep["s"]))[0]
    wrong = cross_entropy.soft_grads(g, x, probs, "sum", (True, False), steps, saved=(keep["e"], keep["s"] * 2))[0]
    np.testing.assert_allclose(right, np.exp(x) / np.exp(x).sum(1, keepdims=True) - probs, atol=1e-15)
    assert not np.allclose(wrong, right)
