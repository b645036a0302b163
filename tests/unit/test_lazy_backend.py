"""The lazy-backend contract: Backend.lazy / materialize, called by pg.materialize, optimizers and fit."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.runtime.registry import registry
from polygrad.testing.temporary import temporary_plugin
from polygrad.apps import train
from polygrad.apps.train import fit


class Pending:
    """A stand-in for a lazy array: a numpy value plus how many materialisations it went through."""

    def __init__(self, value: np.ndarray, done: bool = False):
        self.value, self.done = value, done
        self.shape, self.dtype = value.shape, value.dtype


class LazyBackend(pg.Backend):
    """numpy kernels whose results are 'pending' until materialize() marks them done."""
    name = "lazytest"
    lazy = True

    def __init__(self):
        super().__init__()
        self.calls: list[int] = []
        registry.load()  # the numpy backend's kernels: this may run before anything loaded the registry
        self.kernels = {key: self._wrap(fn) for key, fn in registry.tables["numpy"].items()}

    def _wrap(self, fn):
        def run(*arrays, **attrs):
            return Pending(np.asarray(fn(*(a.value for a in arrays), **attrs)))
        return run

    def from_numpy(self, array):
        return Pending(np.array(array), done=True)

    def to_numpy(self, array):
        return array.value

    def owns(self, array):
        return isinstance(array, Pending)

    def materialize(self, arrays):
        self.calls.append(len(arrays))
        return [Pending(a.value, done=True) for a in arrays]


@pytest.fixture
def lazy():
    be = LazyBackend()
    with temporary_plugin(be):
        yield registry.get("lazytest")


def test_materialize_skips_eager_backends_and_none():
    x = pg.tensor(np.ones(3))
    pg.materialize(x, None, 3.0)  # nothing to do, nothing raised
    np.testing.assert_array_equal(x.numpy(), np.ones(3))


def test_materialize_replaces_storage_once_per_backend(lazy):
    a = pg.tensor(np.ones(3), backend="lazytest") * 2.0
    b = a + 1.0
    assert not a._data.done and not b._data.done
    pg.materialize(a, b, a)
    assert a._data.done and b._data.done and lazy.calls == [2]   # one call, duplicates once
    np.testing.assert_array_equal(b.numpy(), np.full(3, 3.0))


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: optim.Adam(ps, lr=0.1)])
def test_optimizer_step_materializes_parameters_and_state(lazy, make):
    w = pg.tensor(np.ones((4, 2)), backend="lazytest", requires_grad=True)
    b = pg.tensor(np.zeros(2), backend="lazytest", requires_grad=True)
    opt = make([w, b])
    for step in range(3):
        opt.zero_grad()
        (pg.tensor(np.ones((3, 4)), backend="lazytest") @ w + b).tanh().sum().backward()
        opt.step()
        assert w._data.done and b._data.done
        assert all(v._data.done for st in opt.state.values() for v in st.values() if isinstance(v, pg.Tensor))
    assert len(lazy.calls) == 3                     # once per step
    assert lazy.calls[-1] >= 2                      # the parameters (and their state) together


def test_fit_backpropagates_before_reading_the_loss_and_matches_numpy(lazy):
    losses = {}
    for be in ("numpy", "lazytest"):
        with pg.use_backend(be):
            pg.manual_seed(0)
            model = nn.MLP(3, [4, 1]) if hasattr(nn, "MLP") else nn.Linear(3, 1)
            opt = optim.Adam(model.parameters(), lr=0.05)
            x = pg.tensor(np.linspace(-1, 1, 15).reshape(5, 3))
            y = pg.tensor(np.arange(5.0).reshape(5, 1))
            history = fit(model, opt, lambda: pg.mse(model(x), y), 5, rollback_threshold=None)
            losses[be] = history.losses
    np.testing.assert_allclose(losses["lazytest"], losses["numpy"], rtol=1e-6)
    # per epoch ONE call: the loss, the gradients and the step's parameters and state together
    assert len(lazy.calls) == 5


def _regression():
    """A seeded linear regression on the current backend: model, Adam, inputs, targets."""
    pg.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.Adam(model.parameters(), lr=0.05)
    return model, opt, pg.tensor(np.linspace(-1, 1, 15).reshape(5, 3)), pg.tensor(np.arange(10.0).reshape(5, 2))


def _rollback_run(be: str, scales: dict[int, float], epochs: int = 8, threshold: float | None = 0.05,
                  max_rollbacks: int = 10):
    """fit on ``be`` with the loss multiplied by ``scales[epoch]`` (a NaN, a rise) at some epochs:
    the history, the parameters and the optimizer's state, as numpy arrays."""
    with pg.use_backend(be):
        model, opt, x, y = _regression()
        calls = [0]

        def loss_fn():
            k = calls[0]
            calls[0] += 1
            return pg.mse(model(x), y) * scales.get(k, 1.0)

        try:
            history = fit(model, opt, loss_fn, epochs, rollback_threshold=threshold, max_rollbacks=max_rollbacks)
            error = None
        except pg.errors.NonFiniteError as exc:
            history, error = None, str(exc)
        params = [p.numpy() for p in model.parameters()]
        state = {k: {n: (v.numpy() if isinstance(v, pg.Tensor) else v) for n, v in st.items()}
                 for k, st in opt.state_dict()["state"].items()}
        return history, error, params, state, opt.step_count, [g["lr"] for g in opt.param_groups]


def _same_run(got, want, rtol: float = 0.0):
    """Two runs of :func:`_rollback_run` agree: the same decisions, and numbers bit for bit
    (``rtol=0``) or to ``rtol``."""
    def same(a, b):
        if rtol:
            np.testing.assert_allclose(a, b, rtol=rtol)
        else:
            np.testing.assert_array_equal(a, b)                       # NaN equals NaN
    (h1, e1, p1, s1, c1, lr1), (h2, e2, p2, s2, c2, lr2) = got, want
    assert e1 == e2 and c1 == c2 and lr1 == lr2
    if h1 is not None:
        same(h1.losses, h2.losses)
        assert [r.rolled_back for r in h1.records] == [r.rolled_back for r in h2.records]
        assert [r.lr for r in h1.records] == [r.lr for r in h2.records]
        assert (h1.rollbacks, h1.best_epoch, h1.stop_reason) == (h2.rollbacks, h2.best_epoch, h2.stop_reason)
    for a, b in zip(p1, p2):
        same(a, b)
    assert s1.keys() == s2.keys()
    for k in s1:
        for n in s1[k]:
            same(s1[k][n], s2[k][n])


def _ahead_and_after(monkeypatch, lazy, scales, **kw):
    """The lazy run stepping ahead (fit's default there), and the same run stepping after reading
    the loss (the path it replaces): with how many materialisations each made."""
    got = _rollback_run("lazytest", scales, **kw)
    calls = len(lazy.calls)
    with monkeypatch.context() as m:
        m.setattr(train, "_steps_ahead", lambda optimizer: False)
        slow = _rollback_run("lazytest", scales, **kw)
    return got, slow, calls


@pytest.mark.parametrize("scales, threshold", [
    ({3: float("nan")}, 0.05),                    # a NaN loss: rolled back, the step undone
    ({2: 3.0, 5: float("inf")}, 0.05),            # a rise, then an Inf
    ({2: 3.0, 3: 3.0, 4: 3.0}, 0.05),             # rollbacks in a row, up to max_rollbacks
    ({0: float("nan")}, 0.05),                    # NaN before any good checkpoint: raises
    ({4: float("nan")}, None),                    # rollback off: a NaN step is taken, as eager
])
def test_fit_steps_ahead_on_a_lazy_backend_and_rolls_back_exactly(monkeypatch, lazy, scales, threshold):
    """On a lazy backend fit submits the step with the loss, before knowing it; where the eager
    loop would not have stepped, the undo puts back the previous parameters and state: bit for
    bit what stepping after reading the loss gives, and numpy's numbers."""
    got, slow, calls = _ahead_and_after(monkeypatch, lazy, scales, threshold=threshold)
    _same_run(got, slow)
    _same_run(got, _rollback_run("numpy", scales, threshold=threshold), rtol=1e-6)
    if 0 in scales:
        assert got[1] is not None and got[4] == 0 and got[3] == {}   # raised before any step
    else:
        assert calls == 8                                             # one materialisation per epoch
        assert len(lazy.calls) - calls > 8                            # the replaced path: two per epoch


def test_fit_max_rollbacks_stops_with_the_step_undone(monkeypatch, lazy):
    scales = {k: 10.0 ** k for k in range(2, 8)}
    got, slow, _ = _ahead_and_after(monkeypatch, lazy, scales, epochs=8, max_rollbacks=3)
    _same_run(got, slow)
    assert got[0].rollbacks >= 1 and got[0].stopped_early


def test_a_failed_materialisation_in_fit_leaves_the_last_step_intact(lazy):
    with pg.use_backend("lazytest"):
        pg.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = optim.Adam(model.parameters(), lr=0.05)
        x = pg.tensor(np.linspace(-1, 1, 15).reshape(5, 3))
        fit(model, opt, lambda: pg.mse(model(x), pg.zeros(5, 2)), 2, rollback_threshold=None)
        before = [p.numpy().copy() for p in model.parameters()]
        state = [(id(p), dict(st)) for p, st in ((p, opt.state[id(p)]) for p in model.parameters())]

        def failing(arrays):
            raise pg.errors.BackendError("backend 'lazytest': a worker was lost")

        lazy.materialize = failing
        with pytest.raises(pg.errors.BackendError, match="worker was lost"):
            fit(model, opt, lambda: pg.mse(model(x), pg.zeros(5, 2)), 1, rollback_threshold=None)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert opt.step_count == 2
    for key, st in state:
        assert opt.state[key].keys() == st.keys()
        assert all(opt.state[key][n] is v for n, v in st.items())   # the very arrays from before


def test_a_failing_checkpoint_save_leaves_the_state_from_before_the_step(lazy, monkeypatch, tmp_path):
    """fit saves a checkpoint, then steps; stepping ahead on a lazy backend must leave the same
    state when the save raises (found by review: one step further, step_count 3 instead of 2)."""
    saves = []
    real_save = pg.save

    def save(obj, path):
        saves.append(path)
        if len(saves) == 3:
            raise OSError("disk full")
        return real_save(obj, path)

    results = []
    for backend in ("numpy", "lazytest"):
        saves.clear()
        monkeypatch.setattr(pg, "save", save)
        with pg.use_backend(backend):
            model, opt, x, y = _regression()
            with pytest.raises(OSError, match="disk full"):
                fit(model, opt, lambda: pg.mse(model(x), y), 5, checkpoint_path=tmp_path / f"{backend}.ckpt")
        monkeypatch.setattr(pg, "save", real_save)
        results.append((opt.step_count, [p.numpy().copy() for p in model.parameters()]))
    (steps_np, params_np), (steps_lazy, params_lazy) = results
    assert steps_np == steps_lazy == 2
    for a, b in zip(params_np, params_lazy):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_single_process_backend_refuses_connect():
    with pytest.raises(pg.errors.BackendError, match="runs in this process"):
        registry.get("numpy").connect(workers=2)
