"""The two-moons toy dataset (numpy only), as in micrograd's demo.

:func:`make_moons` reproduces scikit-learn's ``make_moons`` geometry: two interleaving half
circles, the outer one ``(cos t, sin t)`` and the inner one ``(1 - cos t, 1 - sin t - 0.5)``
for ``t`` in ``linspace(0, pi, ...)``, plus isotropic Gaussian noise.  Randomness comes from
``numpy.random.default_rng(seed)``, so a given seed is reproducible across platforms (the
stream differs from scikit-learn's, which uses the legacy ``RandomState``).

The tabular helpers :func:`standardize` and :func:`train_test_split` live in
:mod:`polygrad.data.tabular` and are re-exported here for convenience.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad.runtime import memory
from polygrad.ir.errors import DataError, MemoryBudgetError

from .seeds import as_generator
from .tabular import standardize, train_test_split

__all__ = ["make_moons", "standardize", "train_test_split"]


def make_moons(n_samples: int = 100, noise: float | None = 0.1, seed: Any = None, *,
               shuffle: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Generate the two-moons binary classification dataset.

    Parameters
    ----------
    n_samples:
        Total number of points, at least 2.  The outer moon (label 0) gets
        ``n_samples // 2`` points, the inner moon (label 1) the rest.
    noise:
        Standard deviation of the Gaussian noise added to every coordinate (``0`` or ``None``
        for none).  Must be finite and non-negative.
    seed:
        ``None``, a non-negative int, or a ``numpy.random.Generator``.
    shuffle:
        Shuffle the points (and labels) before adding noise, as scikit-learn does by
        default.  With ``shuffle=False`` the outer moon comes first.

    Returns
    -------
    (X, y)
        ``X`` float64 of shape ``[n_samples, 2]``; ``y`` int64 of shape ``[n_samples]`` with
        values in ``{0, 1}``.  (micrograd's demo uses ``y * 2 - 1`` as ``{-1, +1}`` targets.)
    """
    if isinstance(n_samples, (bool, np.bool_)) or not isinstance(n_samples, (int, np.integer)):
        raise DataError(f"make_moons: n_samples must be an int, got {type(n_samples).__name__}")
    if n_samples < 2:
        raise DataError(f"make_moons: n_samples must be >= 2 (one point per moon), got {n_samples}")
    try:  # X, y and numpy's temporaries: about 6 float64 per point, refused before allocating
        memory.check("make_moons", int(n_samples) * 48, what=f"{n_samples} points")
    except MemoryBudgetError as exc:
        raise DataError(f"make_moons: n_samples={n_samples} is too many: {exc}") from None
    if noise is None:
        noise = 0.0
    if isinstance(noise, (bool, np.bool_)) or not isinstance(noise, (int, float, np.integer, np.floating)):
        raise DataError(f"make_moons: noise must be a number, got {type(noise).__name__}")
    if not math.isfinite(float(noise)) or noise < 0:
        raise DataError(f"make_moons: noise must be finite and >= 0, got {noise}")
    if not isinstance(shuffle, (bool, np.bool_)):
        raise DataError(f"make_moons: shuffle must be a bool, got {type(shuffle).__name__}")
    rng = as_generator(seed, "make_moons: seed")

    n = int(n_samples)
    n_out = n // 2
    n_in = n - n_out
    t_out = np.linspace(0.0, np.pi, n_out)
    t_in = np.linspace(0.0, np.pi, n_in)
    X = np.empty((n, 2), dtype=np.float64)
    X[:n_out, 0] = np.cos(t_out)
    X[:n_out, 1] = np.sin(t_out)
    X[n_out:, 0] = 1.0 - np.cos(t_in)
    X[n_out:, 1] = 1.0 - np.sin(t_in) - 0.5
    y = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    if shuffle:
        perm = rng.permutation(n)
        X, y = X[perm], y[perm]
    if noise > 0:
        X += rng.normal(scale=float(noise), size=X.shape)
    return X, y
