"""scikit-learn's ``make_moons`` as micrograd's demo calls it (``make_moons(n_samples=100, noise=0.1)``
after ``np.random.seed(1337)``), for machines without scikit-learn.

Same construction and the same draws from numpy's *global legacy* generator, in the same order
(``shuffle`` of an index permutation, then the Gaussian noise), so it returns scikit-learn's
arrays bit for bit; polygrad.data.make_moons uses a seeded ``Generator`` instead and cannot.
"""
from __future__ import annotations

import numpy as np


def make_moons(n_samples: int = 100, noise: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    n_out = n_samples // 2
    n_in = n_samples - n_out
    generator = np.random.mtrand._rand  # what sklearn's check_random_state(None) returns
    outer = np.linspace(0, np.pi, n_out)
    inner = np.linspace(0, np.pi, n_in)
    X = np.vstack([np.append(np.cos(outer), 1 - np.cos(inner)),
                   np.append(np.sin(outer), 1 - np.sin(inner) - 0.5)]).T
    y = np.hstack([np.zeros(n_out, dtype=np.intp), np.ones(n_in, dtype=np.intp)])
    order = np.arange(n_samples)
    generator.shuffle(order)
    X, y = X[order], y[order]
    if noise is not None:
        X += generator.normal(scale=noise, size=X.shape)
    return X, y
