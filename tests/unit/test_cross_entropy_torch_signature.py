"""cross_entropy / nll_loss take PyTorch's signature and semantics (round 8).

``input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
reduction='mean', label_smoothing=0.0`` (nll_loss: no label_smoothing), plus polygrad's keyword-only
``mask``.  Checked: values and gradients against torch (skipped without it) over generated inputs,
gradients against numerical differentiation in float64, the fused op's bits in the plain case (old
vs new), pg.compile's capture and replay with the new options, and the errors bad input gets.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.engine.dispatch import apply
from polygrad.errors import ArgumentError, DTypeError, ShapeError
from polygrad.ir.ops import Op
from polygrad.tensor import losses as L
from polygrad.testing import check_grads

from tests.helpers import assert_bitwise

REDUCTIONS = ("mean", "sum", "none")


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: the PyTorch comparison is skipped")


@st.composite
def _problem(draw: Any) -> dict:
    """Logits [N, C] (finite, some ties), class targets with some ignored rows, options."""
    n, c = draw(st.integers(0, 5)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    value = st.floats(-30, 30, width=32) | st.sampled_from([0.0, 1.0, -1.0])
    logits = np.asarray(draw(st.lists(value, min_size=n * c, max_size=n * c)), dtype=dtype).reshape(n, c)
    ignore_index = draw(st.sampled_from([-100, -1, 0, c - 1]))
    target = np.asarray(draw(st.lists(st.integers(0, c - 1) | st.just(ignore_index), min_size=n, max_size=n)),
                        dtype=np.int64).reshape(n)
    weight = draw(st.none() | st.lists(st.floats(0.0, 3.0, width=32), min_size=c, max_size=c))
    return {"logits": logits, "target": target, "ignore_index": ignore_index,
            "weight": None if weight is None else np.asarray(weight, dtype=dtype),
            "label_smoothing": draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
            "reduction": draw(st.sampled_from(REDUCTIONS)), "backend": draw(st.sampled_from(["numpy", "scalar"]))}


def _ours(p: dict, probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    x = pg.tensor(p["logits"], requires_grad=True, backend=p["backend"])
    target = p["target"] if probs is None else pg.tensor(probs, backend=p["backend"])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        loss = pg.cross_entropy(x, target, p["weight"], ignore_index=p["ignore_index"] if probs is None else -100,
                                reduction=p["reduction"], label_smoothing=p["label_smoothing"])
        loss.sum().backward()
    return loss.numpy(), x.grad.numpy()


def _theirs(p: dict, probs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    torch = _torch()
    x = torch.tensor(p["logits"], requires_grad=True)
    target = torch.tensor(p["target"] if probs is None else probs)
    loss = torch.nn.functional.cross_entropy(
        x, target, None if p["weight"] is None else torch.tensor(p["weight"]),
        ignore_index=p["ignore_index"] if probs is None else -100, reduction=p["reduction"],
        label_smoothing=p["label_smoothing"])
    loss.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def _close(ours: tuple, theirs: tuple, dtype: Any) -> None:
    rtol, atol = (1e-9, 1e-12) if dtype == np.float64 else (2e-5, 1e-6)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(p=_problem())
def test_values_and_gradients_are_torchs_for_class_targets(p: dict) -> None:
    theirs = _theirs(p)
    _close(_ours(p), theirs, p["logits"].dtype)


@settings(max_examples=80, deadline=None)
@given(p=_problem(), data=st.data())
def test_values_and_gradients_are_torchs_for_probability_targets(p: dict, data: Any) -> None:
    n, c = p["logits"].shape
    raw = np.asarray(data.draw(st.lists(st.floats(0.0, 1.0), min_size=n * c, max_size=n * c)), dtype=p["logits"].dtype)
    theirs = _theirs(p, raw.reshape(n, c))
    _close(_ours(p, raw.reshape(n, c)), theirs, p["logits"].dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_gradients_match_numerical_differentiation(reduction: str, smoothing: float) -> None:
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, 4))
    target = np.array([0, 3, -100, 1, 2, 3])
    weight = np.array([0.5, 2.0, 1.0, 1.5])
    check_grads(lambda x: pg.cross_entropy(x, target, weight, reduction=reduction, label_smoothing=smoothing),
                [logits])
    other = np.array([0, 3, 2, 1, 2, 3])  # ignore_index=3 and 2 below: rows of a real class left out
    check_grads(lambda x: pg.cross_entropy(x, other, ignore_index=3, reduction=reduction,
                                           label_smoothing=smoothing), [logits])
    probs = rng.uniform(size=(6, 4))
    check_grads(lambda x, t: pg.cross_entropy(x, t, weight, reduction=reduction, label_smoothing=smoothing),
                [logits, probs])
    check_grads(lambda x: nn.nll_loss(x.log_softmax(-1), other, weight, None, 2, reduction=reduction), [logits])


def test_weighted_mean_divides_by_the_counted_targets_weights() -> None:
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]]))
    target, weight = np.array([0, 2, -100]), np.array([2.0, 1.0, 4.0])
    got = pg.cross_entropy(pg.tensor(logits), target, weight).item()
    want = (2.0 * -np.log(0.5) + 4.0 * -np.log(0.6)) / (2.0 + 4.0)
    assert got == pytest.approx(want, rel=1e-12)
    # label smoothing: (1 - e) * nll + e / C * sum over counted rows of -sum_c w_c logp_c, same denominator
    e = 0.3
    smooth = -(logits[:2] * weight).sum()
    got = pg.cross_entropy(pg.tensor(logits), target, weight, label_smoothing=e).item()
    assert got == pytest.approx((1 - e) * want + e / 3 * smooth / 6.0, rel=1e-12)


@pytest.mark.parametrize("weight", [None, np.array([1.0, 2.0, 3.0])])
def test_all_targets_ignored(weight: Any) -> None:
    """PyTorch: "mean" is 0 / 0 = NaN, "sum" 0, "none" zeros; the gradient is zero everywhere."""
    for reduction, want in (("mean", np.nan), ("sum", 0.0), ("none", [0.0, 0.0])):
        for smoothing in (0.0, 0.2):
            x = pg.tensor(np.ones((2, 3)), requires_grad=True)
            with np.errstate(all="ignore"):
                loss = pg.cross_entropy(x, [-100, -100], weight, reduction=reduction, label_smoothing=smoothing)
                loss.sum().backward()
            np.testing.assert_array_equal(loss.numpy(), want)
            np.testing.assert_array_equal(x.grad.numpy(), np.zeros((2, 3)))


def test_nll_loss_takes_torchs_argument_order() -> None:
    torch = _torch()
    rng = np.random.default_rng(2)
    logp = np.log(rng.dirichlet(np.ones(4), size=7))
    target = np.array([0, 1, 2, 3, 1, 1, 0])
    weight = np.array([1.0, 0.5, 2.0, 3.0])
    for reduction in REDUCTIONS:
        x = pg.tensor(logp, requires_grad=True)
        ours = nn.nll_loss(x, target, weight, None, 1, None, reduction)
        ours.sum().backward()
        tx = torch.tensor(logp, requires_grad=True)
        theirs = torch.nn.functional.nll_loss(tx, torch.tensor(target), torch.tensor(weight), None, 1, None, reduction)
        theirs.sum().backward()
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_mask_is_keyword_only_and_selects_rows_first() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, 3))
    target = np.array([0, 1, 2, -100, 1, 0])
    mask = np.array([True, False, True, True, False, True])
    weight = np.array([1.0, 2.0, 0.5])
    rows = np.flatnonzero(mask)
    for fn in (pg.cross_entropy, nn.cross_entropy):
        got = fn(pg.tensor(logits), target, weight, mask=mask, label_smoothing=0.1).item()
        want = fn(pg.tensor(logits[rows]), target[rows], weight, label_smoothing=0.1).item()
        assert got == want
    assert nn.nll_loss(pg.tensor(logits), target, weight, mask=mask).item() == \
        nn.nll_loss(pg.tensor(logits[rows]), target[rows], weight).item()
    # the old positional mask is now the weight: a bool array there is refused, never used as weights
    with pytest.raises(DTypeError, match="weight must be floating"):
        pg.cross_entropy(pg.tensor(logits), target, mask)


# -- the fused op keeps its bits in the plain case -------------------------------------------------

@st.composite
def _plain(draw: Any) -> tuple:
    n, c = draw(st.integers(0, 5)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    value = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.sampled_from([0.0, -0.0, np.inf, -np.inf])
    logits = np.asarray(draw(st.lists(value, min_size=n * c, max_size=n * c)), dtype=dtype).reshape(n, c)
    if draw(st.booleans()):
        logits = np.asfortranarray(logits)
    target = np.asarray(draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), dtype=np.int64).reshape(n)
    return logits, target, draw(st.sampled_from(REDUCTIONS))


def _outcome(fn: Any, logits: np.ndarray) -> list:
    x = pg.tensor(logits, requires_grad=True)
    with np.errstate(all="ignore"):
        out = fn(x)
        w = np.linspace(0.5, 1.5, out.numel).reshape(out.shape).astype(logits.dtype)
        (out * pg.tensor(w)).sum().backward()
    return [out.numpy().copy(), str(out.dtype), list(out.shape), x.grad.numpy().copy()]


@settings(max_examples=150, deadline=None)
@given(case=_plain(), ignore=st.sampled_from([-100, -1, 7]))
def test_plain_case_runs_the_fused_op_with_its_old_bits(case: tuple, ignore: int) -> None:
    """No weight, no smoothing, no ignored row (whatever ignore_index says, when no target equals
    it): the result is exactly the fused op's, as before the new signature."""
    logits, target, reduction = case
    calls = []
    real = L._fused_cross_entropy

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(L, "_fused_cross_entropy", spy)
        new = _outcome(lambda x: pg.cross_entropy(x, target, None, None, ignore, None, reduction, 0.0), logits)
    assert calls, "the plain case must reach the fused op"
    old = _outcome(lambda x: apply(Op.CROSS_ENTROPY, (x,), {"target": target, "reduction": reduction}), logits)
    assert_bitwise(new, old)


def test_new_options_take_the_composite(monkeypatch: Any) -> None:
    calls = []
    monkeypatch.setattr(L, "_fused_cross_entropy", lambda *a: calls.append(1))
    x = pg.tensor(np.ones((2, 3)))
    pg.cross_entropy(x, [0, 1], np.ones(3))
    pg.cross_entropy(x, [0, 1], label_smoothing=0.1)
    pg.cross_entropy(x, [0, -100])
    assert calls == []


# -- pg.compile ------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"weight": np.array([0.5, 2.0, 1.0])},
    {"label_smoothing": 0.2},
    {"ignore_index": 1},
    {"weight": np.array([0.5, 2.0, 1.0]), "label_smoothing": 0.1, "ignore_index": 0, "reduction": "sum"},
])
def test_compiled_step_replays_the_new_options_bit_for_bit(options: dict) -> None:
    rng = np.random.default_rng(5)
    x = pg.tensor(rng.normal(size=(9, 4)))
    w = pg.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    mask = rng.uniform(size=9) < 0.7
    opts = dict(options)
    weight = opts.pop("weight", None)

    def step(y):
        w.grad = None
        loss = nn.cross_entropy(x @ w, y, weight, mask=mask, **opts)
        loss.backward()
        return loss

    def outcome(fn: Any, y: np.ndarray) -> list:
        loss = fn(pg.tensor(y))
        return [loss.numpy().copy(), w.grad.numpy().copy()]

    compiled = pg.compile(step, pure=True)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2])
    for i in range(5):
        assert_bitwise(outcome(compiled, y), outcome(step, y), f"call {i}")
    assert compiled.stats["replays"] >= 2
    if weight is not None:  # a weight changed in place is seen, not frozen into the replay
        weight *= 3.0
        for i in range(4):
            assert_bitwise(outcome(compiled, y), outcome(step, y), f"after changing the weight, call {i}")
    y = np.array([2, 2, 1, 0, 0, 1, 1, 2, 0])  # so are new targets
    for i in range(4):
        assert_bitwise(outcome(compiled, y), outcome(step, y), f"new targets, call {i}")


# -- bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, pattern", [
    (lambda x: pg.cross_entropy(x, [0, 1], np.ones(2)), ShapeError, r"weight of shape \(2,\) must be \[C\] = \(3,\)"),
    (lambda x: pg.cross_entropy(x, [0, 1], np.ones((3, 1))), ShapeError, "weight of shape"),
    (lambda x: pg.cross_entropy(x, [0, 1], np.ones(3, dtype=np.int64)), DTypeError, "weight must be floating"),
    (lambda x: pg.cross_entropy(x, [0, 1], pg.tensor(np.ones(3), requires_grad=True)), ArgumentError,
     "weight takes no gradient"),
    (lambda x: pg.cross_entropy(x, [0, 3]), ShapeError, r"out of range \[0, 3\).*\(2, 3\).*3"),
    (lambda x: pg.cross_entropy(x, [0, -1]), ShapeError, "out of range"),
    (lambda x: pg.cross_entropy(x, [0, -100], ignore_index=-1), ShapeError, "-100"),
    (lambda x: pg.cross_entropy(x, [0, 1], label_smoothing=-0.1), ArgumentError, "label_smoothing"),
    (lambda x: pg.cross_entropy(x, [0, 1], label_smoothing=1.5), ArgumentError, "label_smoothing"),
    (lambda x: pg.cross_entropy(x, [0, 1], label_smoothing=float("nan")), ArgumentError, "label_smoothing"),
    (lambda x: pg.cross_entropy(x, [0, 1], label_smoothing=True), ArgumentError, "label_smoothing"),
    (lambda x: pg.cross_entropy(x, [0, 1], size_average=False), ArgumentError, "reduction='sum'"),
    (lambda x: pg.cross_entropy(x, [0, 1], None, None, -100, False), ArgumentError, "reduction="),
    (lambda x: nn.nll_loss(x, [0, 1], reduce=False), ArgumentError, "'none'"),
    (lambda x: pg.cross_entropy(x, [0, 1], reduction="avg"), ArgumentError, "reduction"),
    (lambda x: pg.cross_entropy(x, [0, 1], ignore_index=0.5), ArgumentError, "ignore_index"),
    (lambda x: pg.cross_entropy(x, pg.tensor(np.ones((2, 3))), ignore_index=1), ArgumentError,
     "probability targets"),
    (lambda x: pg.cross_entropy(x, pg.tensor(np.ones((2, 2)))), ShapeError, "probability targets"),
    (lambda x: pg.cross_entropy(x.sum(0), [0]), ShapeError, r"\[N, C\]"),
    (lambda x: pg.cross_entropy(np.ones((2, 3)), [0, 1]), DTypeError, "polygrad tensor"),
    (lambda x: nn.nll_loss(x, [0, 5], np.ones(3)), ShapeError, "nll_loss: target class out of range"),
    (lambda x: nn.nll_loss(x, [0.0, 1.0]), DTypeError, "integers"),
])
def test_bad_input_gets_a_clear_polygrad_error(call: Any, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        call(pg.tensor(np.ones((2, 3))))


def test_pytorchs_own_errors_agree_where_we_refuse() -> None:
    """The refusals above are PyTorch's too (out-of-range class, smoothing outside [0, 1],
    ignore_index with probability targets, a weight of the wrong length)."""
    torch = _torch()
    F = torch.nn.functional
    x = torch.ones(2, 3)
    for call in (lambda: F.cross_entropy(x, torch.tensor([0, 3])),
                 lambda: F.cross_entropy(x, torch.tensor([0, 1]), label_smoothing=1.5),
                 lambda: F.cross_entropy(x, torch.ones(2, 3), ignore_index=1),
                 lambda: F.cross_entropy(x, torch.tensor([0, 1]), torch.ones(2))):
        with pytest.raises((RuntimeError, IndexError, ValueError)):
            call()



def test_integer_logits_are_promoted_as_before() -> None:
    """Integer input is promoted to the default float (as before round 8; PyTorch refuses it)."""
    ints = np.array([[1, 2, 0], [3, 4, 4]])
    for fn in (lambda x: pg.cross_entropy(x, [0, 2], np.array([1.0, 2.0, 0.5]), label_smoothing=0.1),
               lambda x: nn.nll_loss(x, [0, 2], np.array([1.0, 2.0, 0.5]))):
        assert fn(pg.tensor(ints)).item() == fn(pg.tensor(ints.astype(pg.default_float))).item()


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_weights_summing_to_zero_divide_as_torch(smoothing: float) -> None:
    """Counted rows whose weights sum to 0: PyTorch divides by that 0 (an infinite loss, NaN
    and infinite gradients), not a NaN made up for it."""
    torch = _torch()
    x = np.array([[1.0, 2.0], [0.5, -1.0]])
    tx = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.cross_entropy(tx, torch.tensor([0, 1]), torch.tensor([1.0, -1.0], dtype=torch.float64),
                                             label_smoothing=smoothing)
    want.backward()
    px = pg.tensor(x, requires_grad=True)
    with np.errstate(all="ignore"):
        got = pg.cross_entropy(px, [0, 1], np.array([1.0, -1.0]), label_smoothing=smoothing)
        got.backward()
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    np.testing.assert_array_equal(px.grad.numpy(), tx.grad.numpy())
