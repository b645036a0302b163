"""polygrad-arrayapi: the whole kit on each installed namespace; non-standard ops declared.

Skipped when neither array_api_strict nor array_api_compat is installed.  Registered from this
checkout when the plugin is not installed."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.registry import registry
from polygrad.testing.conformance import run_conformance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import polygrad_arrayapi  # noqa: E402

INSTALLED = [b.name for b in polygrad_arrayapi.polygrad_backends()]
pytestmark = pytest.mark.skipif(not INSTALLED, reason="no Array API namespace installed "
                                "(pip install array-api-strict array-api-compat)")


@pytest.fixture(scope="module", autouse=True)
def registered():
    registry.load()
    if not set(INSTALLED) <= {b.name for b in pg.list_backends()}:
        pg.register_plugin(polygrad_arrayapi, "polygrad-arrayapi-from-checkout")
    yield


@pytest.mark.parametrize("backend", INSTALLED)
def test_the_whole_kit_passes(backend: str) -> None:
    report = run_conformance(backend)
    assert report.ok, [r.message for r in report.failures[:5]]
    assert not [r for r in report.results if r.status == "xfail"]


@pytest.mark.parametrize("backend", INSTALLED)
def test_nonstandard_ops_are_declared(backend: str) -> None:
    be = registry.get(backend)
    assert set(be.nonstandard) == {"index_add", "getitem", "spmm", "segment_sum", "segment_max"}
    assert all(how for how in be.nonstandard.values())


@pytest.mark.parametrize("backend", INSTALLED)
def test_training_on_the_namespace_matches_numpy(backend: str) -> None:
    rng = np.random.default_rng(0)
    x_np, w_np = rng.normal(size=(5, 3)), rng.normal(size=(3, 2))

    def loss_and_grad(name: str):
        x = pg.tensor(x_np, backend=name)
        w = pg.tensor(w_np, backend=name, requires_grad=True)
        loss = (x @ w).tanh().sum()
        loss.backward()
        return loss.item(), w.grad.numpy()

    want, got = loss_and_grad("numpy"), loss_and_grad(backend)
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
