"""Shared test helpers: numerical differentiation (float64 central differences, independent of any
VJP), the observations and bitwise comparison the pg.compile tests use against eager, and waiting
for a forked child without hanging the suite."""
from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Sequence

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.testing import numerical_grad


def observed(x: Any) -> Any:
    """An observation as plain data: tensors copied to numpy arrays, lists and tuples as lists."""
    if isinstance(x, pg.Tensor):
        return np.array(x.numpy(), copy=True)
    if isinstance(x, (list, tuple)):
        return [observed(v) for v in x]
    return x


def numpy_kernel_steps() -> Any:
    """:class:`polygrad.engine.cross_entropy.Steps` over the numpy backend's registered kernels
    (what its fused cross-entropy kernels run), for calling the steps directly."""
    from polygrad.backends.cross_entropy_kernels import KernelSteps
    from polygrad.runtime.registry import registry

    registry.load()  # the tables are filled on first use: a test file may run first, or alone
    return KernelSteps(registry.tables["numpy"], np)


def count_block_runs(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[int]:
    """How many blocks each call of ``module.run_blocks`` (polygrad's thread-pool runner, as that
    module imported it) was handed, appended per call while ``monkeypatch`` lasts: whether the
    parallel form really ran."""
    counts: list[int] = []
    real = module.run_blocks

    def spy(fn, items, threads=None):
        items = list(items)
        counts.append(len(items))
        return real(fn, items, threads)

    monkeypatch.setattr(module, "run_blocks", spy)
    return counts


@contextmanager
def without_kernel(tables: dict, key: tuple, backend: str = "numpy"):
    """``backend`` without the kernel ``key`` in ``tables`` (``registry.tables`` or
    ``registry.vjp_tables``) for the duration: what a backend that leaves a fused op out runs."""
    from polygrad.runtime.registry import registry

    registry.load()  # the tables are filled on first use: a test file may run first, or alone
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(tables[backend], key)
        yield


def floats_with_specials(draw: Callable, shape: tuple, dtype: Any, special: Sequence[float]) -> np.ndarray:
    """A hypothesis-drawn array of ``shape``: floats in [-10, 10], about one in four from ``special``
    (signed zeros, infinities, NaN, extremes) -- the inputs the fused-op tests compare bit for bit."""
    from hypothesis import strategies as st

    n = int(np.prod(shape))
    plain = st.floats(-10, 10, width=32)
    values = draw(st.lists(st.one_of(plain, plain, plain, st.sampled_from(special)), min_size=n, max_size=n))
    return np.array(values, dtype=dtype).reshape(shape)


def assert_bitwise(a: Any, b: Any, where: str = "") -> None:
    """Two observations are the same bits (arrays: dtype, shape and bytes; NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), f"{where}: {a} != {b}"
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b and type(a) is type(b), f"{where}: {a!r} != {b!r}"


def wait_for_forked_child(pid: int, timeout_s: float, hang_message: str) -> None:
    """Waits for a forked child: passes when it exits 0, fails when it exits otherwise, and kills it
    and fails with ``hang_message`` when it has not exited within ``timeout_s`` (a hang, not a pass)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(hang_message)


def sparse_dropout_step(a: pg.Tensor, lin: nn.Linear, x: pg.Tensor, opt: optim.Optimizer) -> Callable:
    """A training step through SpMM and dropout: ``relu(a @ dropout(lin(x))).mean()``, one optimizer step."""
    def step():
        opt.zero_grad()
        loss = (a @ nn.dropout(lin(x), 0.3)).relu().mean()
        loss.backward()
        opt.step()
        return loss
    return step


def numerical_grads(f: Callable[..., "pg.Tensor"], arrays: Sequence[np.ndarray], backend: str,
                    weights: np.ndarray | None = None, eps: float = 1e-6) -> list[np.ndarray | None]:
    """d sum(w * f(*arrays)) / d arrays[i] by central differences, evaluating f on ``backend``
    (polygrad.testing's numerical_grad: it never touches a VJP rule); None for non-float inputs."""
    if weights is None:
        with pg.no_grad():
            weights = np.ones(f(*[pg.tensor(a, backend=backend) for a in arrays]).shape)
    return numerical_grad(f, arrays, eps=eps, grad_output=weights, backend=backend)


def analytic_grads(f, arrays, backend: str, weights: np.ndarray | None = None):
    """(forward output, gradients) from polygrad's backward on ``backend``."""
    ts = [pg.tensor(a, backend=backend, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = f(*ts)
    w = pg.tensor(weights if weights is not None else np.ones(out.shape), dtype=out.dtype, backend=backend)
    if any(t.requires_grad for t in ts) and out.requires_grad:
        (out * w).sum().backward()
    return out.numpy(), [t.grad.numpy() if t.grad is not None else None for t in ts]


def weighted_outcome(fn: Callable[["pg.Tensor"], "pg.Tensor"], arr: np.ndarray) -> list:
    """``fn``'s output bits, dtype and shape, and the input's gradient after backpropagating a
    fixed weighting (errors of non-finite values silenced): what bitwise comparisons compare."""
    x = pg.tensor(arr, requires_grad=True)
    with np.errstate(all="ignore"):
        out = fn(x)
        w = np.linspace(0.5, 1.5, max(out.numel, 1)).reshape(out.shape).astype(arr.dtype)
        (out * pg.tensor(w)).sum().backward()
    return [out.numpy().copy(), str(out.dtype), list(out.shape), x.grad.numpy().copy()]


def sum_of_products_step(opt: optim.Optimizer, params: Sequence[pg.Tensor]) -> Callable[..., "pg.Tensor"]:
    """A training step over ``params`` whose loss is ``sum_i (p_i * x_i).sum()`` for its arguments
    ``x_i`` (every parameter gets its own gradient), then ``opt``'s step."""
    def step(*xs: Any) -> "pg.Tensor":
        opt.zero_grad()
        loss = (params[0] * xs[0]).sum()
        for p, x in zip(params[1:], xs[1:]):
            loss = loss + (p * x).sum()
        loss.backward()
        opt.step()
        return loss
    return step


def assert_second_order_matches_central_differences(loss_of: Callable[["pg.Tensor"], "pg.Tensor"],
                                                    x0: np.ndarray, v: np.ndarray, eps: float = 1e-6) -> None:
    """``d/dx <grad loss_of(x), v>`` by ``create_graph`` (the rule's steps differentiated again)
    against central differences of that dot product, float64."""
    def grad_dot_v(x: np.ndarray):
        t = pg.tensor(x, requires_grad=True)
        (g,) = pg.grad(loss_of(t), t, create_graph=True)
        return t, (g * pg.tensor(v)).sum()

    t, s = grad_dot_v(x0)
    s.backward()
    numeric = np.zeros_like(x0)
    for i in np.ndindex(*x0.shape):
        hi, lo = x0.copy(), x0.copy()
        hi[i] += eps
        lo[i] -= eps
        numeric[i] = (grad_dot_v(hi)[1].item() - grad_dot_v(lo)[1].item()) / (2 * eps)
    np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=1e-6, atol=1e-9)


#: special logits for the fused cross-entropy ops' bitwise tests
LOGIT_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 88.7, -104.0, 1e-40]


def draw_logits(draw: Callable, max_rows: int = 5, max_classes: int = 4) -> np.ndarray:
    """Hypothesis-drawn logits ``[N, C]`` (float32 or float64, N may be 0): plain values in
    [-30, 30] mixed with :data:`LOGIT_SPECIALS`, sometimes all tied."""
    from hypothesis import strategies as st

    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n, c = draw(st.integers(0, max_rows)), draw(st.integers(1, max_classes))
    plain = st.floats(-30, 30, width=32)
    values = draw(st.lists(st.one_of(plain, plain, st.sampled_from(LOGIT_SPECIALS)), min_size=n * c,
                           max_size=n * c))
    with np.errstate(over="ignore"):
        x = np.array(values, dtype=np.float64).astype(dtype).reshape(n, c)
    if n and draw(st.booleans()):  # ties
        x[:, :] = x[:1, :1]
    return x
