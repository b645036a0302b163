"""polygrad.runtime.heap: glibc's heap-top padding, set once per process by fit and pure replays."""
from __future__ import annotations

import importlib

import pytest

from polygrad.runtime import heap


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(heap, "_done", False)
    calls = []
    monkeypatch.setattr(heap, "_set_top_pad", lambda pad: calls.append(pad) or True)
    monkeypatch.setattr(heap, "_glibc", lambda: True)
    return calls


@pytest.mark.parametrize("value, want", [("", heap.TOP_PAD_BYTES), ("0", 0), ("1048576", 1 << 20)])
def test_the_padding_comes_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv(heap.ENV_VAR, value)
    assert heap.top_pad_bytes() == want


@pytest.mark.parametrize("value", ["-5", "lots", "16M"])
def test_a_bad_setting_warns_and_uses_the_default(monkeypatch, value):
    monkeypatch.setenv(heap.ENV_VAR, value)
    with pytest.warns(UserWarning, match=heap.ENV_VAR):
        assert heap.top_pad_bytes() == heap.TOP_PAD_BYTES


def test_set_once_per_process(fresh, monkeypatch):
    monkeypatch.delenv(heap.ENV_VAR, raising=False)
    assert heap.keep_heap_top() is True
    assert heap.keep_heap_top() is False
    assert fresh == [heap.TOP_PAD_BYTES]


def test_zero_leaves_malloc_alone(fresh, monkeypatch):
    monkeypatch.setenv(heap.ENV_VAR, "0")
    assert heap.keep_heap_top() is False
    assert fresh == []


def test_nothing_without_glibc(fresh, monkeypatch):
    monkeypatch.delenv(heap.ENV_VAR, raising=False)
    monkeypatch.setattr(heap, "_glibc", lambda: False)
    assert heap.keep_heap_top() is False
    assert fresh == []


def test_fit_and_a_pure_replay_set_it(monkeypatch):
    import numpy as np

    import polygrad as pg
    from polygrad import nn, optim
    from polygrad.apps.train import fit

    executor = importlib.import_module("polygrad.compile.executor")  # the package's name is also a function
    seen = []
    monkeypatch.setattr("polygrad.apps.train.keep_heap_top", lambda: seen.append("fit"))
    monkeypatch.setattr(executor, "keep_heap_top", lambda: seen.append("replay"))
    model = nn.Linear(2, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = pg.tensor(np.ones((4, 2)))
    fit(model, opt, lambda: (model(x) ** 2).mean(), 4, rollback_threshold=None, compile="pure")
    assert seen[0] == "fit" and "replay" in seen


@pytest.mark.skipif(not heap._glibc(), reason="glibc only")
def test_glibc_takes_the_setting():
    assert heap._set_top_pad(heap.TOP_PAD_BYTES) is True
