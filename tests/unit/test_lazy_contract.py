"""The conformance kit's lazy-backend contract (polygrad.testing.lazy): it holds for lazy backends
that keep it, and each way of breaking it fails the check that names it."""
from __future__ import annotations

import numpy as np
import pytest

from polygrad.runtime.registry import registry
from polygrad.testing import conformance
from polygrad.testing.lazy import LAZY_CHECKS, check_lazy_contract, is_lazy
from polygrad.testing.temporary import temporary_plugin
from tests.unit.test_fit_pipeline import SubmittingBackend
from tests.unit.test_lazy_backend import LazyBackend, Pending


class Reordering(LazyBackend):
    name = "lazyreorder"

    def materialize(self, arrays):
        return [Pending(a.value, done=True) for a in reversed(arrays)]


class DroppingSubmit(LazyBackend):
    name = "lazydrop"

    def submit(self, arrays):
        return [Pending(a.value) for a in arrays[:-1]]


class DriftingSubmit(LazyBackend):
    """submit recomputes its arrays one ulp off: the numbers a training run would drift by."""
    name = "lazydrift"

    def submit(self, arrays):
        return [Pending(np.nextafter(a.value, np.inf)) for a in arrays]


class Raising(LazyBackend):
    name = "lazyraise"

    def materialize(self, arrays):
        raise RuntimeError("the cluster went away")


def _contract(backend_class):
    with temporary_plugin(backend_class()):
        return check_lazy_contract(backend_class.name)


@pytest.mark.parametrize("backend_class", [LazyBackend, SubmittingBackend])
def test_lazy_backends_that_keep_the_contract_pass_it(backend_class):
    with temporary_plugin(backend_class()):
        assert is_lazy(backend_class.name)
        assert check_lazy_contract(backend_class.name) == []


class Float32Lazy(LazyBackend):
    """A lazy backend that holds float32 only: the contract runs at float32 (not a DTypeError)."""
    name = "lazyf32"
    dtypes = ("float32", "int32", "bool")


def test_a_float32_only_lazy_backend_is_checked_at_float32():
    with temporary_plugin(Float32Lazy()):
        assert check_lazy_contract("lazyf32") == []


def test_an_eager_backend_has_nothing_to_check():
    assert not is_lazy("numpy") and check_lazy_contract("numpy") == []


@pytest.mark.parametrize("backend_class, failing, says", [
    (Reordering, {"materialize", "submit"},
     "materialize of a leaf: shape (4,) dtype float64, where the input reads as shape (4, 3)"),
    (DroppingSubmit, {"submit"}, "submit of 3 arrays returned 2: one array per input"),
    (DriftingSubmit, {"submit"}, "the same kernels must give the same bits"),
    (Raising, set(LAZY_CHECKS), "raised RuntimeError: the cluster went away"),
])
def test_each_way_of_breaking_the_contract_fails_the_check_that_names_it(backend_class, failing, says):
    failures = _contract(backend_class)
    named = {name for name in LAZY_CHECKS for message in failures if f"lazy contract {name!r} " in message}
    assert named == failing, failures
    assert any(says in message for message in failures), failures
    assert all(f"on backend {backend_class.name!r}" in message for message in failures)


@pytest.mark.parametrize("backend_class, code", [(LazyBackend, 0), (DriftingSubmit, 1)])
def test_polygrad_check_reports_the_contract_of_a_lazy_backend(backend_class, code, monkeypatch, capsys):
    monkeypatch.setattr(conformance, "run_conformance", lambda name, *a, **k: conformance.Report(name, provided=set()))
    monkeypatch.setattr(conformance, "check_edge_points", lambda name: [])
    with temporary_plugin(backend_class()):
        assert conformance.main([backend_class.name]) == code
    out = capsys.readouterr().out
    held = len(LAZY_CHECKS) - (code == 1)
    assert f"lazy backend contract (materialize, submit): {held} of {len(LAZY_CHECKS)} hold" in out
    assert ("FAIL lazy contract 'submit'" in out) == (code == 1)
    assert registry.get("numpy")  # the registry is whole again after the temporary plugin
