"""pg.compile: replayed steps give exactly the eager numbers; every guard re-captures; faults in a
replayed kernel are survived; validation, events and randomness behave as they do eagerly."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad import data as pdata
from polygrad.compile import CompileError
from polygrad.apps.demos import load_graph
from polygrad.errors import BackendError, FallbackWarning
from polygrad.testing import inject_fault
from tests.helpers import sparse_dropout_step

from pathlib import Path

from polygrad.apps.train import fit

# these tests pin the pure mode's capture and replay (pg.compile(fn, pure=True)); the default mode,
# which runs the step's Python on every call, is tested in test_compile_modes.py
compile_pure = functools.partial(pg.compile, pure=True)

REPO = Path(__file__).resolve().parents[2]


def planetoid_dir():
    """Cora beside the checkout (../shared/data/planetoid), else None: the embedded graph is used."""
    return pdata.find_planetoid_dir(REPO.parent / "shared" / "data" / "planetoid")


def _moons(seed: int = 1337, steps: int = 50):
    pg.manual_seed(seed)
    X_np, y01 = pdata.make_moons(100, 0.1, seed=seed)
    X = pg.tensor(X_np, dtype=pg.float64)
    y = (y01 * 2 - 1).astype(np.float64)
    model = nn.MLP(2, [16, 16, 1], init="micrograd", dtype=pg.float64)
    opt = optim.SGD(model.parameters(), lr=1.0, momentum=0.9, weight_decay=2e-4,
                    lr_schedule=lambda k: 1.0 - 0.9 * k / steps)

    def step():
        opt.zero_grad()
        loss = nn.max_margin(model(X), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _params(model) -> list[np.ndarray]:
    return [p.numpy().copy() for p in model.parameters()]


def test_moons_mlp_compiled_equals_eager_over_50_steps():
    eager_model, eager_step = _moons()
    model, step = _moons()
    compiled = compile_pure(step)
    for k in range(50):
        assert compiled().item() == eager_step().item(), f"step {k}"
    for a, b in zip(_params(eager_model), _params(model)):
        np.testing.assert_array_equal(a, b)
    assert compiled.stats["replays"] == 50 - 3 and compiled.stats["dropped"] == 0


def _gcn(seed: int):
    root = planetoid_dir()
    ds = pdata.load_planetoid(root, "cora") if root is not None else load_graph()
    pg.manual_seed(seed)
    x = nn.csr_to_tensor(pdata.row_normalize(ds.x, dtype=np.float64))
    model = nn.GCN(ds.num_features, 16, 2, ds.num_classes, dropout=0.5, dtype=pg.float64)
    opt = optim.Adam([{"params": model.conv1.parameters(), "weight_decay": 5e-4},
                      {"params": model.conv2.parameters()}], lr=0.01)

    def step():
        opt.zero_grad()
        loss = nn.cross_entropy(model(x, ds.edge_index), ds.y, mask=ds.train_mask)
        loss.backward()
        opt.step()
        return loss

    return model, step


def test_gcn_with_dropout_compiled_equals_eager_over_20_epochs():
    eager_model, eager_step = _gcn(0)
    model, step = _gcn(0)
    compiled = compile_pure(step)
    for epoch in range(20):
        pg.manual_seed(100 + epoch)  # both runs draw the same dropout masks, in the same order
        want = eager_step().item()
        pg.manual_seed(100 + epoch)
        assert compiled().item() == want, f"epoch {epoch}"
    for a, b in zip(_params(eager_model), _params(model)):
        np.testing.assert_array_equal(a, b)
    assert compiled.stats["replays"] == 17


def test_replays_draw_fresh_dropout_masks():
    x = pg.ones(4, 50, dtype=pg.float64)
    f = compile_pure(lambda t: nn.dropout(t, 0.5) * 1.0, warmup=0)
    outs = [f(x).numpy() for _ in range(5)]
    assert f.stats["replays"] == 3
    assert not np.array_equal(outs[3], outs[4])  # a replay is not a frozen mask
    pg.manual_seed(7)
    eager = nn.dropout(x, 0.5).numpy()
    pg.manual_seed(7)
    np.testing.assert_array_equal(f(x).numpy(), eager)


# -- guards -------------------------------------------------------------------------------------------

def _twins(fn):
    """(compiled fn with no warm-up, counter of its captures)."""
    return compile_pure(fn, warmup=0)


def _settle(f, *args):
    for _ in range(3):
        f(*args)
    assert f.stats["replays"] >= 1


def _recaptured(f, before: int) -> bool:
    return f.stats["captures"] > before


def _square_sum(t):
    return (t * t).sum()


@pytest.mark.parametrize("change", ["shape", "dtype", "requires_grad", "backend", "layout"])
def test_each_argument_guard_recaptures(change):
    f = _twins(_square_sum)
    x = pg.tensor(np.arange(6.0).reshape(2, 3))
    _settle(f, x)
    before = f.stats["captures"]
    if change == "shape":
        y = pg.tensor(np.arange(8.0).reshape(2, 4))
    elif change == "dtype":
        y = x.float()
    elif change == "requires_grad":
        y = pg.tensor(x.numpy(), requires_grad=True)
    elif change == "backend":
        y = x.to("scalar")
    else:
        y = pg.tensor(np.eye(3)[:2] * 2.0, layout="csr")
    want = float(_square_sum(y).item())
    assert float(f(y).item()) == pytest.approx(want)
    assert _recaptured(f, before)


def test_sparsity_pattern_guard_recaptures():
    def spmm(a, x):
        return (a @ x).sum()

    f = _twins(spmm)
    x = pg.tensor(np.arange(12.0).reshape(4, 3))
    a = pg.sparse_coo(np.array([[0, 1, 2], [1, 2, 3]]), np.array([1.0, 2.0, 3.0]), (4, 4))
    _settle(f, a, x)
    before = f.stats["captures"]
    b = pg.sparse_coo(np.array([[0, 3, 3], [0, 0, 1]]), np.array([1.0, 2.0, 3.0]), (4, 4))  # same nnz
    assert f(b, x).item() == pytest.approx(spmm(b, x).item())
    assert _recaptured(f, before)


def test_train_eval_mode_guard_recaptures():
    pg.manual_seed(0)
    model = nn.MLP(3, [8, 2], dropout=0.5, dtype=pg.float64)
    x = pg.randn(5, 3, dtype=pg.float64)
    f = compile_pure(lambda: model(x).sum(), warmup=0)
    _settle(f)
    before = f.stats["captures"]
    model.eval()
    with pg.no_grad():
        want = model(x).sum().item()
    assert f().item() == want and f().item() == want  # no dropout any more
    assert _recaptured(f, before)


@pytest.mark.parametrize("knob", ["fallback", "validate", "grad_mode", "default_backend"])
def test_config_and_mode_guards_recapture(knob, monkeypatch):
    x = pg.tensor(np.arange(6.0).reshape(2, 3))
    f = compile_pure(lambda t: (t * 2.0).sum(), warmup=0)
    _settle(f, x)
    before = f.stats["captures"]
    if knob == "fallback":
        monkeypatch.setattr(pg.config, "fallback", "raise")
        f(x)
    elif knob == "validate":
        monkeypatch.setattr(pg.config, "validate", True)
        f(x)
    elif knob == "grad_mode":
        with pg.no_grad():
            f(x)
    else:
        with pg.use_backend("scalar"):
            f(x)
    assert _recaptured(f, before)


def test_gradient_accumulation_state_is_a_guard():
    w = pg.tensor(np.array([1.0, 2.0]), requires_grad=True)

    def step():  # no zero_grad: gradients accumulate
        loss = (w * w).sum()
        loss.backward()
        return loss

    f = compile_pure(step, warmup=0)
    for _ in range(4):
        f()
    np.testing.assert_array_equal(w.grad.numpy(), 4 * 2 * w.numpy())
    before = f.stats["captures"]
    w.grad = None  # the captured accumulation would read a gradient that is not there
    f()
    np.testing.assert_array_equal(w.grad.numpy(), 2 * w.numpy())
    assert _recaptured(f, before)


def test_python_scalar_arguments_are_guarded_by_value():
    x = pg.tensor(np.ones(3))
    f = compile_pure(lambda t, s: (t * s).sum(), warmup=0)
    assert [f(x, s).item() for s in (1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0)] == [3.0] * 3 + [6.0] * 4


def test_capture_cache_is_a_bounded_lru():
    f = compile_pure(_square_sum, cache_size=2, warmup=0)
    for n in (2, 3, 4, 2):
        x = pg.ones(n)
        for _ in range(3):
            assert f(x).item() == n
    assert len(f._cache) == 2


# -- what is refused, and why ------------------------------------------------------------------------

def test_changing_python_constant_is_refused_not_frozen():
    w = pg.tensor(np.array([1.0, -2.0]), requires_grad=True)
    lr = [0.1]

    def step():
        w.grad = None
        (w * w).sum().backward()
        with pg.no_grad():
            w.data = w - lr[0] * w.grad
        lr[0] *= 0.5  # a schedule in Python: a replay would freeze it

    f = compile_pure(step)
    want = np.array([1.0, -2.0])
    rate = 0.1
    with pytest.warns(RuntimeWarning, match="the step changes 'lr'"):
        for _ in range(8):
            f()
            want = want - rate * 2 * want
            rate *= 0.5
    np.testing.assert_allclose(w.numpy(), want, rtol=0, atol=0)
    assert f.stats["replays"] == 0


def test_float_results_of_computed_values_are_host_reads_that_pure_mode_refuses():
    x = pg.tensor(np.arange(3.0))
    f = compile_pure(lambda t: (t * t).sum().item(), warmup=0)
    with pytest.warns(RuntimeWarning, match="computed on the host"):
        assert [f(x) for _ in range(4)] == [5.0] * 4
    assert f.stats["replays"] == 0 and "computed on the host" in f.reason
    g = compile_pure(lambda t: float(np.sum(t.numpy())), warmup=0)
    with pytest.warns(RuntimeWarning, match="Python number"):
        assert [g(x) for _ in range(4)] == [3.0] * 4
    assert g.stats["replays"] == 0


def test_numpy_argument_is_a_clear_error():
    f = compile_pure(lambda a: a)
    with pytest.raises(CompileError, match="numpy array"):
        f(np.ones(3))


def test_backend_can_opt_out_of_replay(monkeypatch):
    be = pg.tensor(1.0)._be
    monkeypatch.setattr(type(be), "supports_replay", False, raising=False)
    f = compile_pure(_square_sum, warmup=0)
    x = pg.ones(3)
    with pytest.warns(RuntimeWarning, match="does not support replay"):
        assert [f(x).item() for _ in range(4)] == [3.0] * 4
    assert f.stats["replays"] == 0


# -- safety --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["raise", "wrong_shape"])
def test_fault_in_replayed_kernel_is_survived(mode):
    eager_model, eager_step = _moons()
    model, step = _moons()
    compiled = compile_pure(step)
    for _ in range(5):
        assert compiled().item() == eager_step().item()
    with pytest.warns(FallbackWarning):
        with inject_fault("numpy", "matmul", mode=mode) as fault:
            got = compiled().item()
    assert fault.triggered >= 1
    assert got == pytest.approx(eager_step().item(), rel=1e-12)
    assert compiled.stats["dropped"] == 1
    for _ in range(6):  # captured again, replayed again, still the eager numbers
        assert compiled().item() == pytest.approx(eager_step().item(), rel=1e-12)
    for a, b in zip(_params(eager_model), _params(model)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert compiled.stats["replays"] > 5


def test_fault_in_replayed_fused_backward_is_survived(monkeypatch):
    eager_model, eager_step = _gcn(0)
    model, step = _gcn(0)
    compiled = compile_pure(step)
    for epoch in range(4):
        pg.manual_seed(epoch)
        want = eager_step().item()
        pg.manual_seed(epoch)
        assert compiled().item() == want
    pg.manual_seed(99)
    want = eager_step().item()
    pg.manual_seed(99)
    table = pg.runtime.registry.registry.vjp_tables["numpy"]
    key = (pg.Op.SPMM, "csr")
    fused = table[key]
    calls = []

    def failing_once(*args, **kwargs):  # only the fused backward kernel, only once
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault in the fused SpMM backward")
        return fused(*args, **kwargs)

    monkeypatch.setitem(table, key, failing_once)
    got = compiled().item()  # the replay's fused call fails; the call re-runs eagerly
    assert len(calls) >= 2 and got == want
    assert compiled.stats["dropped"] == 1
    for a, b in zip(_params(eager_model), _params(model)):
        np.testing.assert_array_equal(a, b)


def test_validate_mode_shadow_checks_replays(monkeypatch):
    monkeypatch.setattr(pg.config, "validate", True)
    x = pg.tensor(np.arange(6.0).reshape(2, 3))
    f = compile_pure(lambda t: (t.exp() * 2.0).sum(), warmup=0)
    _settle(f, x)
    with inject_fault("numpy", "exp", mode="nan"):
        with pytest.raises(BackendError, match="POLYGRAD_VALIDATE"):
            f(x)


def test_event_hooks_see_replayed_ops():
    class Listener:
        def __init__(self):
            self.ops: list[str] = []
            self.backwards = 0

        @pg.hookimpl
        def polygrad_op_executed(self, op, backend, layout, inputs, output):
            self.ops.append(op)

        @pg.hookimpl
        def polygrad_backward_finished(self, num_nodes, seconds, grads):
            self.backwards += 1
            assert all(g is not None for _, g in grads)

    _, step = _moons()
    f = compile_pure(step)
    listener = Listener()
    pg.register_plugin(listener, name="test-compile-listener")
    try:
        per_call = []
        for _ in range(6):
            start = len(listener.ops)
            f()
            per_call.append(listener.ops[start:])
    finally:
        pg.unregister_plugin(listener)
    assert f.stats["replays"] == 3
    assert per_call[-1] == per_call[0] and listener.backwards == 6


def test_fit_compiled_equals_eager():
    def run(compiled: bool) -> tuple[list[float], list[np.ndarray]]:
        pg.manual_seed(3)
        X_np, y01 = pdata.make_moons(60, 0.1, seed=3)
        X = pg.tensor(X_np, dtype=pg.float64)
        model = nn.MLP(2, [8, 1], dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.05)
        hist = fit(model, opt, lambda: nn.max_margin(model(X), y01 * 2.0 - 1), 15,
                            rollback_threshold=0.01, compile=compiled)
        return hist.losses, _params(model)

    (la, pa), (lb, pb) = run(False), run(True)
    assert la == lb
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a, b)


# -- the same contract on other backends (cupy: the real one on a GPU, the fake one on CPU) -----------

from tests.backends.test_cupy import bk, fake_gpu  # noqa: E402,F401 - fixtures: numpy, fake-cupy, cupy


def test_compiled_sparse_step_equals_eager_on_each_backend(bk):  # noqa: F811 - the imported fixture
    def build():
        pg.manual_seed(5)
        rng = np.random.default_rng(5)
        dense = rng.random((30, 30)) * (rng.random((30, 30)) < 0.1)
        with pg.use_backend(bk):
            a = pg.tensor(dense, layout="csr")
            x = pg.tensor(rng.random((30, 4)))
            lin = nn.Linear(4, 3, dtype=pg.float64)
        opt = optim.Adam(lin.parameters(), lr=0.05)
        return lin, sparse_dropout_step(a, lin, x, opt)

    (m1, eager), (m2, step) = build(), build()
    compiled = compile_pure(step)
    for k in range(8):
        pg.manual_seed(k)  # both draw the same dropout masks
        want = eager().item()
        pg.manual_seed(k)
        assert compiled().item() == want, f"step {k}"
    assert compiled.stats["replays"] == 5
    for a, b in zip(_params(m1), _params(m2)):
        np.testing.assert_array_equal(a, b)


def test_fault_after_the_optimizer_stepped_falls_back_in_place():
    def build():
        model, step = _moons()

        def step_then_predict():
            step()
            with pg.no_grad():  # kernels after opt.step(): a re-run would step twice
                return model(pg.tensor(np.ones((3, 2)))).tanh()

        return model, step_then_predict

    (m1, eager), (m2, step) = build(), build()
    compiled = compile_pure(step)
    for _ in range(4):
        np.testing.assert_array_equal(compiled().numpy(), eager().numpy())
    with pytest.warns(FallbackWarning):
        with inject_fault("numpy", "tanh") as fault:
            got = compiled().numpy()
    assert fault.triggered == 1
    np.testing.assert_allclose(got, eager().numpy(), rtol=1e-12)
    for a, b in zip(_params(m1), _params(m2)):  # stepped once, not twice
        np.testing.assert_array_equal(a, b)


def test_error_raised_while_capturing_reaches_the_caller_and_nothing_is_cached():
    calls = itertools.count(1)  # not a list: a pure step that appends to a list is refused

    def flaky(t):
        if next(calls) == 2:  # the capture call
            raise KeyError("user bug")
        return (t * 2.0).sum()

    f = compile_pure(flaky)
    x = pg.ones(3)
    f(x)
    with pytest.raises(KeyError, match="user bug"):
        f(x)
    assert [f(x).item() for _ in range(4)] == [6.0] * 4
    assert f.stats["replays"] == 2


def test_optimizer_error_in_a_replay_is_the_users_error():
    w = pg.tensor(np.ones(2), requires_grad=True)
    opt = optim.SGD([w], lr=1.0, lr_schedule=lambda k: 1.0 if k < 4 else float("nan"))

    def step():
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()

    f = compile_pure(step)
    for _ in range(4):
        f()
    with pytest.raises(ValueError, match="lr_schedule"):
        f()
    assert f.stats["dropped"] == 0


def test_compiled_inside_a_capture_is_recorded_into_it():
    inner = compile_pure(lambda t: t * 3.0)
    outer = compile_pure(lambda t: inner(t).sum(), warmup=0)
    x = pg.ones(4)
    assert [outer(x).item() for _ in range(4)] == [12.0] * 4
    assert outer.stats["replays"] == 2


def test_threads_share_a_compiled_step():
    import threading

    x = pg.tensor(np.arange(5.0))
    f = compile_pure(lambda t, s: (t * s).sum(), warmup=0)
    errors: list[BaseException] = []

    def worker(scale: float):
        try:
            for _ in range(30):
                assert f(x, scale).item() == 10.0 * scale
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1.0, 2.0, 3.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and f.stats["replays"] > 0


def test_cli_demo_compile_flag(capsys):
    from polygrad.apps.cli import main
    import json

    for flag, expected in (("--compile", True), ("--no-compile", False)):
        assert main(["demo", "moons", "--steps", "6", "--no-progress", "--json", flag]) == 0
        record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert record["compiled"] is expected


def test_step_that_clears_gradients_itself_replays_without_recapturing():
    params = [pg.tensor(np.array([1.0, -2.0]), requires_grad=True), pg.tensor(np.array([0.5]), requires_grad=True)]
    opt = optim.SGD(params, lr=0.1)

    def step():
        for p in params:
            p.grad = None  # micrograd style: not an optimizer call
        loss = (params[0] * params[0]).sum() + (params[1] * 3.0).sum()
        loss.backward()
        opt.step()
        return loss

    f = compile_pure(step)
    losses = [f().item() for _ in range(10)]
    assert f.stats["replays"] == 7 and f.stats["recaptures"] == 0
    w, b = np.array([1.0, -2.0]), 0.5
    for k in range(10):  # plain SGD by hand: d/dw = 2w, d/db = 3
        assert losses[k] == pytest.approx((w * w).sum() + 3.0 * b, rel=1e-12), f"step {k}"
        w, b = w - 0.1 * 2 * w, b - 0.1 * 3.0
    np.testing.assert_allclose(params[0].numpy(), w, rtol=1e-12)
    np.testing.assert_allclose(params[1].numpy(), [0.5 - 10 * 0.1 * 3.0], rtol=1e-12)


class _Counter:
    """An op listener: with one registered, replays run the executor's checked variant."""

    def __init__(self):
        self.ops = 0

    @pg.hookimpl
    def polygrad_op_executed(self, op, backend, layout, inputs, output):
        self.ops += 1


def test_plain_and_checked_replays_agree():
    def run(listen: bool) -> tuple:
        model, step = _moons()
        f = compile_pure(step)
        listener = _Counter()
        if listen:
            pg.register_plugin(listener, name="test-compile-counter")
        try:
            losses = [f().item() for _ in range(8)]
        finally:
            if listen:
                pg.unregister_plugin(listener)
        return losses, _params(model), f, listener

    fast_losses, fast_params, f, _ = run(False)
    cap = next(iter(f._cache.values())).capture
    assert cap.fast is not None and cap.checked is None  # one executor: the generated function
    slow_losses, slow_params, g, listener = run(True)
    cap = next(iter(g._cache.values())).capture
    assert cap.checked is not None and g.stats["replays"] == 5 and listener.ops > 0
    assert fast_losses == slow_losses
    for a, b in zip(fast_params, slow_params):
        np.testing.assert_array_equal(a, b)


def test_pattern_rebuilt_every_call_still_replays():
    edges = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    x = pg.tensor(np.arange(8.0).reshape(4, 2))

    def propagate(t):
        a = pg.from_edge_index(edges, 4)  # a new (equal) pattern object each call
        return (a @ t).sum()

    f = compile_pure(propagate, warmup=0)
    assert [f(x).item() for _ in range(4)] == [propagate(x).item()] * 4
    assert f.stats["replays"] == 2


def test_compiled_method_guards_its_module_mode():
    class Trainer(nn.Module):
        def __init__(self):
            pg.manual_seed(1)
            self.net = nn.MLP(3, [4, 1], dropout=0.5, dtype=pg.float64)

        @compile_pure
        def score(self, x):
            return self.net(x).sum()

    trainer = Trainer()
    x = pg.ones(2, 3, dtype=pg.float64)
    for _ in range(5):
        trainer.score(x)
    assert Trainer.score.stats["replays"] == 2  # a warm-up, two captures, two replays
    trainer.eval()
    with pg.no_grad():
        want = trainer.net(x).sum().item()
    assert [trainer.score(x).item() for _ in range(4)] == [want] * 4
    assert Trainer.score.stats["replays"] == 3  # eval mode: its own warm-up and captures


def test_returning_a_parameter_or_an_argument_returns_the_live_object():
    w = pg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    opt = optim.SGD([w], lr=0.5)

    def step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()
        return w, x  # eager returns these very objects, w already updated

    f = compile_pure(step)
    x = pg.tensor(np.array([1.0, 1.0]))
    for k in range(5):
        got_w, got_x = f(x)
        assert got_w is w and got_x is x
        np.testing.assert_array_equal(w.numpy(), [1.0 - 0.5 * (k + 1), 2.0 - 0.5 * (k + 1)])
    assert f.stats["replays"] == 2


def test_manual_update_through_data_replays_like_eager():
    def build():
        pg.manual_seed(2)
        params = [pg.randn(3, 2, dtype=pg.float64, requires_grad=True),
                  pg.randn(2, dtype=pg.float64, requires_grad=True)]
        x = pg.randn(5, 3, dtype=pg.float64)

        def step():
            for p in params:
                p.grad = None
            loss = (x @ params[0] + params[1]).tanh().sum()
            loss.backward()
            with pg.no_grad():
                for p in params:
                    p.data = p - 0.1 * p.grad  # storage replaced by kernels: replayed as such
            return loss

        return params, step

    (pa, eager), (pb, step) = build(), build()
    f = compile_pure(step)
    for k in range(8):
        assert f().item() == eager().item(), f"step {k}"
    assert f.stats["replays"] == 5
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
