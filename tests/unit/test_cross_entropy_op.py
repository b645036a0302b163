"""``Op.CROSS_ENTROPY``: the fused form of ``pg.cross_entropy`` at integer classes.

The promise is bitwise: loss, gradient and floating-point warnings are the composite's (the
slow path it replaces), whether the gradient comes from the backend's fused backward or from the
rule; gradients also agree with central differences (float64), second order included, and with
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

KEY = (Op.CROSS_ENTROPY, "dense")


def run(x: np.ndarray, target: np.ndarray, reduction: str, seed: np.ndarray | None):
    """(loss, dx, warning messages) of pg.cross_entropy on a fresh leaf, and the op the loss came from."""
    t = pg.tensor(x, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = pg.cross_entropy(t, target, reduction=reduction)
        loss.backward(None if seed is None else pg.tensor(seed))
    return loss.numpy(), t.grad.numpy(), sorted(str(w.message) for w in caught), loss._node.op


@st.composite
def problems(draw):
    x = draw_logits(draw)
    (n, c), dtype = x.shape, x.dtype
    plain, special = st.floats(-30, 30, width=32), st.sampled_from(LOGIT_SPECIALS)
    target = np.array(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64)
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    seed = None
    if reduction == "none":
        seed = np.array(draw(st.lists(st.one_of(plain, special), min_size=n, max_size=n)), dtype=dtype)
    return x, target, reduction, seed


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_fused_op_gives_the_composites_bits(problem):
    x, target, reduction, seed = problem
    loss, dx, warned, op = run(x, target, reduction, seed)  # fused forward, fused backward
    assert op == Op.CROSS_ENTROPY
    with without_kernel(registry.vjp_tables, KEY):  # fused forward, the rule's backward
        r_loss, r_dx, r_warned, _ = run(x, target, reduction, seed)
    with without_kernel(registry.tables, KEY):  # the composite: 12 ops forward, their rules backward
        c_loss, c_dx, c_warned, c_op = run(x, target, reduction, seed)
    assert c_op != Op.CROSS_ENTROPY
    for got in (loss, r_loss):
        assert_bitwise(got, c_loss)
    for got in (dx, r_dx):
        assert_bitwise(got, c_dx)
    # the same floating-point warnings, as many times (the backward's recomputation of the forward's
    # steps does not warn again: the composite's backward does not recompute)
    assert warned == r_warned == c_warned


def test_gradient_matches_central_differences_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)) * 3
    target = np.array([0, 3, 1, 1, 2, 0])
    for reduction in ("mean", "sum", "none"):
        check_grads(lambda t: pg.cross_entropy(t, target, reduction=reduction), [x], rtol=1e-7, atol=1e-9)


def test_second_order_through_the_rule_matches_central_differences():
    """``create_graph``: the rule's steps are differentiable (the fused kernel is not used)."""
    rng = np.random.default_rng(1)
    x0, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    target = np.array([2, 0, 1, 1, 0])
    assert_second_order_matches_central_differences(lambda t: pg.cross_entropy(t, target), x0, v)


def test_a_backend_without_the_kernel_runs_the_composite():
    assert Op.CROSS_ENTROPY in FUSED
    x, target = np.array([[1.0, 2.0], [0.5, -1.0]]), np.array([1, 0])
    with without_kernel(registry.tables, KEY):
        *_, op = run(x, target, "mean", None)
    assert op == Op.MUL  # the composite's last step: sum * (1 / N)


def test_scalar_backend_and_validate_mode_agree_with_numpy():
    x = np.random.default_rng(2).normal(size=(4, 3))
    target = np.array([0, 2, 2, 1])
    want = pg.cross_entropy(pg.tensor(x), target).item()
    with pg.use_backend("scalar"):
        got = pg.cross_entropy(pg.tensor(x), target).item()
    assert got == pytest.approx(want, rel=1e-12)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pg.config, "validate", True)  # shadow-runs the kernel against the scalar reference
        assert pg.cross_entropy(pg.tensor(x), target).item() == want


def test_the_fused_kernel_calls_what_dispatch_runs():
    """A fault injected into exp (as a plugin override would replace it) reaches the fused op,
    which then falls back as a whole, to the clean answer."""
    from polygrad.testing import inject_fault

    x, target = np.random.default_rng(4).normal(size=(3, 4)), np.array([3, 0, 1])
    clean = run(x, target, "mean", None)
    with inject_fault("numpy", "exp") as fault:
        faulty = run(x, target, "mean", None)  # (run records the warnings)
    assert fault.triggered >= 1 and any("op 'cross_entropy' failed" in w for w in faulty[2])
    np.testing.assert_allclose(faulty[0], clean[0], rtol=1e-12)
    np.testing.assert_allclose(faulty[1], clean[1], rtol=1e-12)


def test_bad_targets_are_named():
    x = pg.tensor(np.zeros((2, 3)))
    with pytest.raises(pg.errors.ShapeError, match="out of range"):
        pg.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(pg.errors.ShapeError, match=r"must be \[N\]"):
        pg.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(pg.errors.DTypeError, match="integers"):
        pg.cross_entropy(x, np.array([0.0, 1.0]))


def test_compile_follows_new_targets():
    """pg.compile guards the classes (an attribute array) by content, as it does a getitem index."""
    x = pg.tensor(np.array([[1.0, 2.0, 0.5], [0.0, 3.0, -1.0]]), requires_grad=True)

    def step(target):
        return pg.cross_entropy(x, target)

    for compiled in (pg.compile(step), pg.compile(step, pure=True)):
        for classes in ([0, 1], [2, 2], [0, 1], [1, 0], [1, 0]):
            target = pg.tensor(np.array(classes))
            assert compiled(target).item() == step(target).item()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_pytorch_float64(reduction):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: no comparison against F.cross_entropy")
    import torch.nn.functional as F

    rng = np.random.default_rng(3)
    x = rng.normal(size=(7, 4)) * 5
    x[0] = [0.0, -np.inf, 1.0, 2.0]  # a class of probability 0
    x[1] = [1e30, -1e30, 0.0, 0.0]   # a certain class: loss 0, gradient 0
    x[2] = [3.0, 3.0, 3.0, 3.0]      # ties
    target = np.array([0, 0, 2, 3, 1, 1, 0])
    seed = rng.normal(size=7) if reduction == "none" else None
    loss, dx, _, _ = run(x, target, reduction, seed)
    xt = torch.tensor(x, requires_grad=True)
    lt = F.cross_entropy(xt, torch.tensor(target), reduction=reduction)
    lt.backward(None if seed is None else torch.tensor(seed))
    np.testing.assert_allclose(loss, lt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)


# -- a forward's kept exponentials (what a backend that holds them from forward to backward uses) ----

@settings(max_examples=100, deadline=None)
@given(problems())
def test_a_forwards_kept_exponentials_give_the_recomputed_gradients_bits(problem):
    """``loss(keep=)`` hands ``logits_grad(saved=)`` the forward's ``exp(shifted)`` and row sums:
    the same bits as the backward's own recomputation (polygrad-dask's per-block backward)."""
    from polygrad.engine import cross_entropy

    x, target, reduction, seed = problem
    steps, keep = numpy_kernel_steps(), {}
    with np.errstate(all="ignore"):
        loss = cross_entropy.loss(x, target, reduction, steps, keep)
        g = np.ones(np.shape(loss), x.dtype) if seed is None else seed
        recomputed = cross_entropy.logits_grad(g, x, target, reduction, steps)
        kept = cross_entropy.logits_grad(g, x, target, reduction, steps, saved=(keep["e"], keep["s"]))
    assert_bitwise(kept, recomputed)
    with np.errstate(all="ignore"):  # the kept arrays are exp(x - max) and its row sums (NaN's bits aside)
        e = np.exp(x - x.max(1, keepdims=True)) if x.size else keep["e"]
    np.testing.assert_array_equal(keep["e"], e)
    np.testing.assert_array_equal(keep["s"], e.sum(1, keepdims=True))


def test_the_backward_reads_the_kept_exponentials():
    """Kept sums altered on purpose change the gradient: ``saved`` is what the backward reads."""
    from polygrad.engine import cross_entropy

    x = np.random.default_rng(0).standard_normal((6, 3))
    target = np.arange(6) % 3
    steps, keep = numpy_kernel_steps(), {}
    cross_entropy.loss(x, target, "sum", steps, keep)
    g = np.ones((), x.dtype)
    right = cross_entropy.logits_grad(g, x, target, "sum", steps, saved=(keep["e"], keep["s"]))
    wrong = cross_entropy.logits_grad(g, x, target, "sum", steps, saved=(keep["e"], keep["s"] * 2))
    np.testing.assert_allclose(right, np.exp(x) / np.exp(x).sum(1, keepdims=True) - np.eye(3)[target], atol=1e-15)
    assert not np.allclose(wrong, right)
