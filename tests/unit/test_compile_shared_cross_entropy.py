"""The cross-entropy rewrite (compile/rewrite.py ``_share_cross_entropy``): a pure replay whose
cross-entropy backward takes the forward's exponentials instead of recomputing them gives eager's
bits -- the pair of kernels against the kernel and fused backward they replace (generated logits
with infinities, NaNs, ties, no rows), and whole compiled steps against eager -- and applies only
where dispatch runs the backend's own kernels."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.compile import Call
from polygrad.ir.ops import Op
from polygrad.runtime.registry import registry
from tests.helpers import assert_bitwise, observed, without_kernel
from tests.unit.test_cross_entropy_op import problems

KEY = (Op.CROSS_ENTROPY, "dense")


def _numpy_backend():
    return registry.get("numpy")


@settings(max_examples=150, deadline=None)
@given(problems())
def test_the_pair_gives_the_kernel_and_fused_backward_bits(problem):
    x, target, reduction, seed = problem
    forward, backward = _numpy_backend().cross_entropy_pair
    g = np.asarray(x.dtype.type(1.0)) if seed is None else seed
    with np.errstate(all="ignore"):
        want_loss = registry.tables["numpy"][KEY](x, target=target, reduction=reduction)
        want_dx = registry.vjp_tables["numpy"][KEY](g, x, needs=(True,), target=target, reduction=reduction)[0]
        loss, saved = forward(x, target=target, reduction=reduction)
        (dx,) = backward(g, x, saved, needs=(True,), target=target, reduction=reduction)
    assert saved.shape == ()
    assert_bitwise(np.asarray(loss), np.asarray(want_loss))  # numpy scalars as 0-d arrays: NaN equals NaN
    assert_bitwise(np.asarray(dx), np.asarray(want_dx))


def _step(c: dict):
    rng = np.random.default_rng(c["seed"])
    dtype = np.float32 if c["float32"] else np.float64
    n, f, k = c["rows"], c["features"], c["classes"]
    x = rng.normal(size=(n, f)).astype(dtype)
    if c["special"] and n:
        x[rng.integers(0, n), rng.integers(0, f)] = c["special"]
    xt = pg.tensor(x)
    w = pg.tensor(rng.normal(size=(f, k)).astype(dtype) * c["scale"], requires_grad=True)
    y = rng.integers(0, k, n)
    opt = optim.Adam([w], lr=0.05)

    def step():
        opt.zero_grad()
        logits = xt @ w
        loss = nn.cross_entropy(logits, y, reduction=c["reduction"])
        (loss.sum() if c["reduction"] == "none" else loss).backward()
        return loss, logits

    return step, opt, w


cases = st.fixed_dictionaries({
    "seed": st.integers(0, 2**16),
    "rows": st.integers(0, 12),
    "features": st.integers(1, 5),
    "classes": st.integers(1, 5),
    "scale": st.sampled_from([0.1, 1.0, 60.0]),
    "float32": st.booleans(),
    "reduction": st.sampled_from(["mean", "sum", "none"]),
    "special": st.sampled_from([None, None, np.inf, -np.inf, np.nan, 1e30]),
})


def _calls(compiled) -> list:
    return [e.fn for entry in compiled._cache.values() if entry.capture is not None
            for e in entry.capture.program if isinstance(e, Call)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_a_replay_sharing_the_forward_equals_eager_bit_for_bit(c):
    def run(compiled: bool) -> tuple:
        step, opt, w = _step(c)
        fn = pg.compile(step, pure=True) if compiled else step
        seen = []
        with np.errstate(all="ignore"):
            for _ in range(5):
                loss, logits = fn()
                opt.step()
                seen.append([observed(loss), observed(logits), observed(w), observed(w.grad)])
        return seen, fn

    (want, _), (got, compiled) = run(False), run(True)
    assert_bitwise(got, want)
    forward, backward = _numpy_backend().cross_entropy_pair
    calls = _calls(compiled)
    if calls:  # the step replayed: through the pair
        assert forward in calls and backward in calls


PLAIN = {"seed": 1, "rows": 6, "features": 3, "classes": 4, "scale": 1.0, "float32": False,
         "reduction": "mean", "special": None}


def test_the_rewrite_applies_to_a_plain_step():
    step, opt, _ = _step(PLAIN)
    compiled = pg.compile(step, pure=True)
    for _ in range(4):
        compiled()
        opt.step()
    assert set(_numpy_backend().cross_entropy_pair) <= set(_calls(compiled))


def test_no_rewrite_where_dispatch_runs_another_backward():
    c = PLAIN
    forward, _ = _numpy_backend().cross_entropy_pair
    with without_kernel(registry.vjp_tables, KEY):  # the rule's backward: no fused backward to pair
        step, opt, _ = _step(c)
        compiled = pg.compile(step, pure=True)
        for _ in range(4):
            compiled()
            opt.step()
        assert _calls(compiled) == [] or forward not in _calls(compiled)
    with pytest.MonkeyPatch.context() as mp:  # an overridden kernel (a plugin's, an injected fault)
        own = registry.tables["numpy"][KEY]
        mp.setitem(registry.tables["numpy"], KEY, lambda *a, **k: own(*a, **k))
        step, opt, _ = _step(c)
        compiled = pg.compile(step, pure=True)
        for _ in range(4):
            compiled()
            opt.step()
        assert forward not in _calls(compiled)

