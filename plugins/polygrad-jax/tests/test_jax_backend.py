"""polygrad-jax: the kit on the jax backend, zero-copy tensors, and steps compiled by jax.jit.

Skipped when jax is not installed.  The plugin is registered from this checkout when it is not
installed, so ``python -m pytest plugins/polygrad-jax/tests`` works either way."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import polygrad as pg  # noqa: E402
from polygrad import nn, optim  # noqa: E402
from polygrad.compile.backend_compile import CompiledStep  # noqa: E402
from polygrad.runtime.registry import registry  # noqa: E402
from polygrad.testing.conformance import run_conformance  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def jax_backend():
    registry.load()
    if "jax" not in [b.name for b in pg.list_backends()]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import polygrad_jax
        pg.register_plugin(polygrad_jax, "polygrad-jax-from-checkout")
    yield


# the sparse kernels (with the kit's inf/NaN and long-row cases) and the dense ops whose JAX form
# differs most from numpy's; `polygrad check jax` runs the whole kit (708 checks, minutes)
KIT_OPS = ["spmm", "sddmm", "segment_sum", "segment_max", "index_add", "getitem", "matmul", "sum", "cast"]


def test_the_kit_passes_on_the_jax_backend() -> None:
    report = run_conformance("jax", ops=KIT_OPS)
    assert report.ok, [r.message for r in report.failures[:5]]
    assert {r.case for r in report.results} >= {"long_rows", "nonfinite_values"}


def test_a_jax_array_becomes_a_tensor_without_a_copy() -> None:
    a = jax.numpy.arange(6.0).reshape(2, 3)
    t = pg.tensor(a)
    assert t.backend == "jax" and t._data is a
    assert pg.tensor(a, requires_grad=True).requires_grad


def _moons_step(backend: str):
    from polygrad import data as pdata
    pg.manual_seed(0)
    X_np, y01 = pdata.make_moons(64, 0.1, seed=1)
    with pg.use_backend(backend):
        X = pg.tensor(X_np, dtype=pg.float64)
        y = pg.tensor((y01 * 2 - 1).astype(np.float64))
        model = nn.MLP(2, [16, 1], init="micrograd", dtype=pg.float64)
        opt = optim.Adam(model.parameters(), lr=0.05)

    def step():
        opt.zero_grad()
        loss = nn.max_margin(model(X), y)
        loss.backward()
        opt.step()
        return loss
    return model, step


def test_a_compiled_step_runs_as_one_jit_and_matches_numpy() -> None:
    _, numpy_step = _moons_step("numpy")
    want = [numpy_step().item() for _ in range(10)]
    model, step = _moons_step("jax")
    compiled = pg.compile(step, pure=True)
    with pg.use_backend("jax"):
        got = [compiled().item() for _ in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)   # float64; XLA may reassociate
    (entry,) = compiled._cache.values()
    assert isinstance(entry.capture.fast, CompiledStep) and entry.capture.fast.calls == compiled.stats["replays"] > 0
    assert all(isinstance(p._data, jax.Array) for p in model.parameters())   # updates stayed on device
