"""Opt-in pytest plugin: run polygrad's conformance suite against any installed backend.

::

    pytest -p polygrad.testing.plugin --polygrad-backend NAME [--polygrad-xfail FILE]
    POLYGRAD_CONFORMANCE_BACKEND=NAME pytest -p polygrad.testing.plugin

With a backend named, the suite's tests (:class:`polygrad.testing.suite.BackendConformanceTests`)
are added to whatever else pytest collected (pass a path with no tests, or ``-k``, to narrow
it down).  Without one, the plugin does nothing.  The plugin is not auto-loaded: only ``-p``
enables it, so installing polygrad never changes another project's test run.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .suite import BackendConformanceTests

ENV_VAR = "POLYGRAD_CONFORMANCE_BACKEND"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("polygrad", "polygrad backend conformance")
    group.addoption("--polygrad-backend", default=os.environ.get(ENV_VAR) or None, metavar="NAME",
                    help=f"run polygrad's conformance suite on this backend (default: ${ENV_VAR})")
    group.addoption("--polygrad-xfail", action="append", default=[], metavar="FILE",
                    help="extra xfail file for the conformance suite: 'backend op layout check [case]  # reason'")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "polygrad_conformance: a test of polygrad's backend conformance suite")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    """Collect this module's conformance class when a backend is named (before -k/-m deselection)."""
    if not config.getoption("polygrad_backend"):
        return
    module = pytest.Module.from_parent(session, path=Path(__file__))
    found = list(session.genitems(module))
    for item in found:
        item.add_marker(pytest.mark.polygrad_conformance)
    items.extend(found)


class TestPolygradConformance(BackendConformanceTests):
    """The whole conformance suite against ``--polygrad-backend``."""

    # fixtures live on the class, not the module: a -p plugin's module-level fixtures would be
    # visible to every test of the session
    @pytest.fixture
    def backend(self, request: Any) -> str:
        return request.config.getoption("polygrad_backend")

    @pytest.fixture
    def xfail_files(self, request: Any) -> list[str]:
        return list(request.config.getoption("polygrad_xfail"))
