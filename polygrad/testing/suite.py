"""pytest base classes of the conformance suite, to subclass in a backend package's own tests.

The pattern pandas uses for extension arrays: inherit the tests, supply a fixture.  In your
package's ``tests/test_conformance.py``::

    import pytest
    from polygrad.testing.suite import BackendConformanceTests

    @pytest.fixture
    def backend():
        return "mybackend"            # a registered backend name, or a polygrad.Backend instance

    class TestMyBackend(BackendConformanceTests):
        pass

Pick parts instead of the whole (``BaseForwardTests``, ``BaseDtypeTests``, ``BaseGradTests``,
``BaseErrorTests``, ``BaseFusedVJPTests``), override a test to skip or adapt it, and declare
known gaps with an ``xfail_files`` fixture returning paths of xfail files (the format of
``polygrad/testing/xfail.txt``).  Kernels the backend does not provide are skipped.  Every test
runs one check of :mod:`polygrad.testing.conformance` on one catalogue case, so a failure's
message names the op, the layout, the case and the largest error.

A ``Backend`` instance that is not registered yet is registered for each test and removed
afterwards (:func:`polygrad.testing.temporary.temporary_plugin`).
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from ..runtime.backend import Backend
from ..runtime.registry import registry
from . import conformance
from .cases import bad_cases, cases
from .temporary import temporary_plugin

_CASES = cases()
_DIFF_CASES = [c for c in _CASES if c.differentiable]
_F32_CASES = [c for c in _CASES if c.float32 and any(a.dtype.kind == "f" for a in c.inputs)]
_BAD_CASES = bad_cases()


def _ids(case: Any) -> str:
    return case.id


class _ConformanceBase:
    """Shared fixtures: the backend under test, its xfail list, and the check runner."""

    @pytest.fixture
    def xfail_files(self) -> list[str]:
        """Override to return paths of extra xfail files for your backend."""
        return []

    @pytest.fixture
    def conformance_backend(self, backend: Any) -> Iterator[str]:
        """The name of the backend under test (registered for the test when given as an instance)."""
        if isinstance(backend, Backend):
            registry.load()
            entry = registry.entries.get(backend.name)
            if entry is None or entry.backend is not backend:
                with temporary_plugin(backend):
                    yield backend.name
                return
            yield backend.name
            return
        yield conformance.resolve_backend(backend)

    @pytest.fixture
    def conformance_xfails(self, xfail_files: list[str]) -> list[conformance.XFail]:
        return conformance.load_xfails(xfail_files)

    def run_conformance_check(self, request: Any, backend: str, check: str, case: Any,
                              xfails: list[conformance.XFail]) -> None:
        """Run one check; skip when the kernel is not provided or the check does not apply."""
        if (case.op, case.layout) not in conformance.provided(backend):
            pytest.skip(f"backend {backend!r} provides no kernel for op '{case.op.value}' ({case.layout})")
        xf = conformance.find_xfail(xfails, backend, case.op, case.layout, check, case.name)
        if xf is not None:
            request.node.add_marker(pytest.mark.xfail(reason=xf.reason or "listed in an xfail file", strict=False))
        try:
            conformance.run_check(backend, check, case)
        except conformance.NotApplicable as exc:
            pytest.skip(str(exc))
        except conformance.CheckFailure as exc:
            pytest.fail(str(exc), pytrace=False)


class BaseForwardTests(_ConformanceBase):
    @pytest.mark.parametrize("case", _CASES, ids=_ids)
    def test_forward(self, request, conformance_backend, conformance_xfails, case):
        self.run_conformance_check(request, conformance_backend, "forward", case, conformance_xfails)


class BaseDtypeTests(_ConformanceBase):
    @pytest.mark.parametrize("case", _F32_CASES, ids=_ids)
    def test_float32(self, request, conformance_backend, conformance_xfails, case):
        self.run_conformance_check(request, conformance_backend, "float32", case, conformance_xfails)


class BaseGradTests(_ConformanceBase):
    @pytest.mark.parametrize("case", _DIFF_CASES, ids=_ids)
    def test_grad_numeric(self, request, conformance_backend, conformance_xfails, case):
        self.run_conformance_check(request, conformance_backend, "grad-numeric", case, conformance_xfails)

    @pytest.mark.parametrize("case", _DIFF_CASES, ids=_ids)
    def test_grad_scalar(self, request, conformance_backend, conformance_xfails, case):
        self.run_conformance_check(request, conformance_backend, "grad-scalar", case, conformance_xfails)


class BaseErrorTests(_ConformanceBase):
    @pytest.mark.parametrize("case", _BAD_CASES, ids=_ids)
    def test_errors(self, request, conformance_backend, conformance_xfails, case):
        self.run_conformance_check(request, conformance_backend, "errors", case, conformance_xfails)


class BaseFusedVJPTests(_ConformanceBase):
    @pytest.mark.parametrize("case", _DIFF_CASES, ids=_ids)
    def test_fused_vjp(self, request, conformance_backend, conformance_xfails, case):
        if (case.op, case.layout) not in conformance.fused(conformance_backend):
            pytest.skip(f"no fused backward kernel for op '{case.op.value}' ({case.layout})")
        self.run_conformance_check(request, conformance_backend, "fused-vjp", case, conformance_xfails)


class BackendConformanceTests(BaseForwardTests, BaseDtypeTests, BaseGradTests, BaseErrorTests, BaseFusedVJPTests):
    """The whole suite: subclass it and supply a ``backend`` fixture."""
