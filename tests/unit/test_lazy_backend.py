"""The lazy-backend contract: Backend.lazy / materialize, called by pg.materialize, optimizers and fit."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.runtime.registry import registry
from polygrad.testing.temporary import temporary_plugin
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
    # per epoch: the loss and gradients in one call, then the step's parameters and state
    assert len(lazy.calls) == 10


def test_single_process_backend_refuses_connect():
    with pytest.raises(pg.errors.BackendError, match="runs in this process"):
        registry.get("numpy").connect(workers=2)
