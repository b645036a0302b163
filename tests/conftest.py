"""Shared fixtures: backends to parametrise over, and the path to the Planetoid data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def planetoid_dir() -> Path | None:
    """The Planetoid folder: $POLYGRAD_PLANETOID_DIR, else ../shared/data/planetoid beside the repo."""
    env = os.environ.get("POLYGRAD_PLANETOID_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data" / "planetoid")
    for c in candidates:
        if (c / "ind.cora.graph").exists():
            return c
    return None


@pytest.fixture
def planetoid_root() -> Path:
    root = planetoid_dir()
    if root is None:
        pytest.skip("Planetoid data not found (set POLYGRAD_PLANETOID_DIR or place ../shared/data/planetoid)")
    return root


def available_backends() -> list[str]:
    import polygrad as pg
    return [b.name for b in pg.list_backends() if b.available]


@pytest.fixture(params=["scalar", "numpy"])
def backend(request) -> str:
    """The built-in CPU backends every op must agree on."""
    return request.param
