"""``as_generator``: the one way the data layer turns a seed into a ``numpy.random.Generator``."""
from __future__ import annotations

from typing import Any

import numpy as np

from polygrad.ir.errors import DataError



def as_generator(seed: Any, what: str = "seed") -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for ``seed``.

    Parameters
    ----------
    seed:
        ``None`` (fresh OS entropy), a non-negative ``int``, or an existing
        ``numpy.random.Generator`` (returned unchanged, so callers can share one stream).
    what:
        Name used in the error message.
    """
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"{what} must be None, a non-negative int or a numpy Generator, "
                        f"got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise DataError(f"{what} must be non-negative, got {seed}")
    return np.random.default_rng(int(seed))
