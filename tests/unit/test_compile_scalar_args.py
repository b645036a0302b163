"""A Python or numpy scalar argument of ``pg.compile`` is part of the cache key by its bits: keyed
by value, ``-0.0`` matched the capture of ``0.0`` (they compare and hash equal), so
``1 / (x * s)`` replayed ``+inf`` where eager gives ``-inf``; NaNs of another sign or payload are
other keys too."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg

from tests.helpers import assert_bitwise

SPECIALS = [0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1.5]


def _as(kind: str, v: float):
    return {"float": float(v), "float32": np.float32(v), "float64": np.float64(v), "complex": complex(v, -v)}[kind]


@pytest.mark.parametrize("pure", [True, False])
@pytest.mark.parametrize("kind", ["float", "float32", "float64", "complex"])
@settings(max_examples=25, deadline=None)
@given(first=st.sampled_from(SPECIALS), then=st.lists(st.sampled_from(SPECIALS), min_size=1, max_size=4))
def test_scalar_arguments_replay_by_their_bits(pure: bool, kind: str, first: float, then: list) -> None:
    """Captured and replayed with ``first`` (four calls), then called with other values."""
    x = pg.tensor(np.array([1.0, -2.0, 0.0]))

    def step(s):
        return 1.0 / (x * s.real if isinstance(s, complex) else x * s)

    compiled = pg.compile(step, pure=pure)
    with np.errstate(all="ignore"):
        for v in [first] * 4 + then:
            s = _as(kind, v)
            assert_bitwise(compiled(s).numpy(), step(s).numpy())
