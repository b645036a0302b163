"""Shared fixtures: backends to parametrise over, and the path to the Planetoid data."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def planetoid_dir() -> Path | None:
    """$POLYGRAD_PLANETOID_DIR, else ../shared/data/planetoid beside the checkout (as CI lays it)."""
    from polygrad.data import find_planetoid_dir
    return find_planetoid_dir(REPO.parent / "shared" / "data" / "planetoid", REPO / ".device_data" / "planetoid")


@pytest.fixture
def planetoid_root() -> Path:
    root = planetoid_dir()
    if root is None:
        pytest.skip("Planetoid data not found (set POLYGRAD_PLANETOID_DIR or place ../shared/data/planetoid)")
    return root


def available_backends() -> list[str]:
    import polygrad as pg
    return [b.name for b in pg.list_backends() if b.available]


def _cupy_skip_reason() -> str | None:
    import polygrad as pg
    info = {b.name: b for b in pg.list_backends()}.get("cupy")
    if info is None:
        return "cupy backend not registered"
    return None if info.available else f"cupy backend unavailable: {info.reason}"


@pytest.fixture(params=["scalar", "numpy", "cupy"])
def backend(request) -> str:
    """Every built-in backend; cupy runs where a GPU is present and skips with the reason elsewhere."""
    if request.param == "cupy":
        reason = _cupy_skip_reason()
        if reason:
            pytest.skip(reason)
    return request.param


@pytest.fixture(autouse=True)
def _fresh_fallback_warnings():
    """Each test starts with polygrad's warn-once fallback record empty: a fallback warned by an
    earlier test must not silence the warning a later test asserts (the suite runs in random order)."""
    import polygrad as pg
    pg.reset_stats()
    yield
