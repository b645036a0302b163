"""Backend discovery, selection and mixing rules."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import BackendUnavailableError, MixedBackendError


def test_builtin_backends_are_listed_with_their_distribution():
    infos = {b.name: b for b in pg.list_backends()}
    for name in ("scalar", "numpy"):
        assert infos[name].available and infos[name].reason == ""
        assert infos[name].origin == "polygrad-core"  # the distribution, not the import name
    assert "cupy" in infos  # listed even where it cannot run, with the reason
    if not infos["cupy"].available:
        assert infos["cupy"].reason


def test_default_backend_is_numpy_and_env_var_selects():
    assert pg.get_backend() in {b.name for b in pg.list_backends()}
    code = "import polygrad as pg; print(pg.get_backend(), pg.tensor([1.0]).backend)"
    env = dict(os.environ, POLYGRAD_BACKEND="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["scalar", "scalar"]


def test_use_backend_is_context_local():
    seen = {}

    def worker():
        seen["thread"] = pg.get_backend()

    with pg.use_backend("scalar"):
        assert pg.tensor([1.0]).backend == "scalar"
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert pg.tensor([1.0]).backend == pg.get_backend()
    assert seen["thread"] != "scalar" or os.environ.get("POLYGRAD_BACKEND") == "scalar"


def test_set_backend_and_constructor_argument():
    before = pg.get_backend()
    try:
        pg.set_backend("scalar")
        assert pg.zeros(2).backend == "scalar"
        assert pg.zeros(2, backend="numpy").backend == "numpy"
    finally:
        pg.set_backend(before)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match="unknown backend 'nope'.*numpy"):
        pg.set_backend("nope")


def test_mixed_backends_raise_naming_both():
    a = pg.tensor([1.0], backend="numpy")
    b = pg.tensor([1.0], backend="scalar")
    with pytest.raises(MixedBackendError, match="numpy and scalar"):
        a + b
    assert (a + b.to("numpy")).tolist() == [2.0]


def test_to_moves_between_backends_and_keeps_values():
    x = pg.randn(3, 2, dtype=pg.float64, requires_grad=True)
    y = x.to("scalar")
    assert y.backend == "scalar" and y.requires_grad and y.is_leaf
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    assert y.to("scalar") is y
