"""``Backend.random_mask``: dropout drawn by the backend from a key (one word of pg.manual_seed's
generator per mask), recorded in a pure capture as a ``Call`` so a replay -- or a backend's
compiled step -- draws on the backend; deterministic per seed, and bit for bit eager's when replayed."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.backends.numpy import NumpyBackend
from polygrad.compile import Call
from polygrad.compile.backend_compile import CompiledStep
from polygrad.testing.temporary import temporary_plugin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_step_compile import Compiler  # noqa: E402 - the kernels-in-order 'compiler'

compile_pure = functools.partial(pg.compile, pure=True)


class KeyedNumpy(NumpyBackend):
    """numpy, with dropout masks drawn from a Philox stream keyed by the mask's key."""

    name = "numpy-keyed"

    def __init__(self) -> None:
        super().__init__()
        self.draws = 0

    def random_mask(self, k0, k1, *, shape, dtype, drop_below, scale):
        self.draws += 1
        bits = np.random.Generator(np.random.Philox(key=(k1 << 31) | k0)).integers(0, 1 << 16, shape, np.uint16)
        return np.where(bits >= drop_below, dtype.type(scale), dtype.type(0))


def _masks(seed: int, p: float) -> tuple[np.ndarray, np.ndarray, int]:
    pg.manual_seed(seed)
    with pg.use_backend("numpy-keyed"):
        x = pg.ones((5, 7))
        a, b = nn.dropout(x, p).numpy(), nn.dropout(x, p).numpy()
    return a, b, int(pg.rng().bit_generator.random_raw())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), p=st.sampled_from([0.1, 0.5, 0.9, 1.0]))
def test_keyed_masks_are_reproducible_from_the_seed_and_take_one_word_each(seed, p):
    with temporary_plugin(KeyedNumpy()) as plugin:
        a, b, after = _masks(seed, p)
        assert plugin.backends[0].draws == 2
        a2, b2, after2 = _masks(seed, p)
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert after == after2
    pg.manual_seed(seed)
    words = pg.rng().bit_generator.random_raw(3)
    assert after == int(words[2])   # two masks, two words
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    assert set(np.unique(a).tolist()) <= {0.0, float(np.float32(scale))}


def _dropout_step(seed: int):
    pg.manual_seed(seed)
    rng = np.random.default_rng(seed)
    with pg.use_backend("numpy-keyed"):
        w1 = pg.tensor(rng.normal(size=(4, 8)), requires_grad=True)
        w2 = pg.tensor(rng.normal(size=(8, 1)), requires_grad=True)
        x = pg.tensor(rng.normal(size=(6, 4)))
        y = pg.tensor(rng.normal(size=(6, 1)))
    opt = optim.Adam([w1, w2], lr=0.05)

    def step():
        opt.zero_grad()
        h = nn.dropout((x @ w1).relu(), 0.5)
        loss = nn.mse(nn.dropout(h, 0.25) @ w2, y)
        loss.backward()
        opt.step()
        return loss
    return (w1, w2), step


def _eager_and_replayed(seed: int, compiler=None):
    params, step = _dropout_step(seed)
    with pg.use_backend("numpy-keyed"):
        eager = [step().item() for _ in range(7)]
    eager_params = [p.numpy().copy() for p in params]
    params, step = _dropout_step(seed)
    fn = compile_pure(step)
    if compiler is not None:
        pg.register_plugin(compiler, f"compiler-{id(compiler)}")
    with pg.use_backend("numpy-keyed"):
        got = [fn().item() for _ in range(7)]
    assert got == eager
    for a, b in zip(eager_params, params):
        np.testing.assert_array_equal(a, b.numpy())
    return fn


def test_a_replay_draws_keyed_masks_as_calls_bit_for_bit():
    with temporary_plugin(KeyedNumpy()) as plugin:
        fn = _eager_and_replayed(3)
        (entry,) = fn._cache.values()
        draws = [e for e in entry.capture.program
                 if isinstance(e, Call) and getattr(e.fn, "fn", None) == plugin.backends[0].random_mask]
        assert len(draws) == 2 and fn.stats["replays"] == 4


def test_a_backends_compiled_step_draws_and_updates_inside_it():
    compiler = Compiler(backend_name="numpy-keyed")
    with temporary_plugin(KeyedNumpy()) as plugin:
        fn = _eager_and_replayed(4, compiler)
        (entry,) = fn._cache.values()
        assert isinstance(entry.capture.fast, CompiledStep) and entry.capture.fast.calls == 4
        program = compiler.programs[-1]   # the capture in use (each capture was offered)
        calls = [e for e in program.entries if isinstance(e, Call)]
        assert sum(getattr(e.fn, 'fn', None) == plugin.backends[0].random_mask for e in calls) == 2   # the draws
        # the two weights' updates: one call over their concatenation, as eager runs them (NaN bits)
        updates = [e for e in calls if getattr(getattr(e.fn, "fn", None), "__module__", "") == "polygrad.optim.adam"]
        assert len(updates) == 1 and len(updates[0].fn.shapes) == 2
