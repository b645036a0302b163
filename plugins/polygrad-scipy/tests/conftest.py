"""Make the plugin importable from a source checkout, and registered for each test.

Installed (``pip install plugins/polygrad-scipy``), polygrad loads it through its entry point and
the fixture below does nothing.  From a checkout without installing, the package is put on
sys.path and registered for the test only (removed afterwards, so nothing leaks).
"""
from __future__ import annotations

import os
import sys

import pytest

try:
    import polygrad_scipy  # noqa: F401
except ImportError:  # running from the source tree, not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import polygrad_scipy  # noqa: F401

from polygrad.runtime.registry import registry
from polygrad.testing.temporary import temporary_plugin


def installed() -> bool:
    """Whether polygrad loaded polygrad-scipy through its entry point."""
    registry.load()
    entry = registry.entries.get("scipy")
    return entry is not None and entry.origin == "polygrad-scipy" and entry.backend is not None


@pytest.fixture
def scipy_plugin():
    """The plugin module, registered (through its entry point, or for this test only)."""
    if installed():
        yield polygrad_scipy
        return
    with temporary_plugin(polygrad_scipy, "scipy"):
        yield polygrad_scipy
