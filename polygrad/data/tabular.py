"""Tabular helpers used with :func:`polygrad.data.make_moons`: ``standardize`` and
``train_test_split`` (stratified or not).  Malformed arguments raise :class:`polygrad.errors.DataError`."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad.ir.errors import DataError

from .seeds import as_generator


def _as_float_matrix(X: Any, where: str) -> np.ndarray:
    try:
        a = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: X must be numeric, got {type(X).__name__}") from exc
    if a.ndim not in (1, 2):
        raise DataError(f"{where}: X must be 1-D or 2-D, got shape {a.shape}")
    if a.shape[0] == 0:
        raise DataError(f"{where}: X is empty")
    if not np.all(np.isfinite(a)):
        raise DataError(f"{where}: X contains NaN or Inf")
    return a


def standardize(X: Any, mean: Any = None, std: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre and scale the columns of ``X``: ``(X - mean) / std``.

    Statistics are computed from ``X`` (population std, ``ddof=0``) unless given, so the
    training set's ``mean``/``std`` can be reused on a test set.  A column with std 0 (or a
    given std of 0) is only centred, not scaled: the returned ``std`` holds 1 there, so the
    returned statistics always reproduce ``Xs`` when passed back in.

    Parameters
    ----------
    X:
        Array ``[n, d]`` (or ``[n]``) of finite numbers.
    mean:
        Optional per-column means, shape ``[d]`` (or scalar).
    std:
        Optional per-column standard deviations, shape ``[d]`` (or scalar), non-negative.

    Returns
    -------
    (Xs, mean, std)
        float64 arrays: the standardised data and the statistics used.
    """
    a = _as_float_matrix(X, "standardize")
    col_shape = a.shape[1:]
    if mean is None:
        mu = a.mean(axis=0)
    else:
        mu = _stat(mean, col_shape, "mean")
    if std is None:
        sd = a.std(axis=0)
    else:
        sd = _stat(std, col_shape, "std")
        if np.any(sd < 0):
            raise DataError("standardize: std must be non-negative")
    sd = np.where(sd == 0, 1.0, sd)
    return (a - mu) / sd, np.asarray(mu, dtype=np.float64), np.asarray(sd, dtype=np.float64)


def _stat(v: Any, col_shape: tuple, name: str) -> np.ndarray:
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"standardize: {name} must be numeric") from exc
    try:
        arr = np.broadcast_to(arr, col_shape).copy()
    except ValueError as exc:
        raise DataError(f"standardize: {name} has shape {arr.shape}, expected {col_shape}") from exc
    if not np.all(np.isfinite(arr)):
        raise DataError(f"standardize: {name} contains NaN or Inf")
    return arr


def train_test_split(*arrays: Any, test_size: float | int = 0.25, seed: Any = None,
                     stratify: Any = None, shuffle: bool = True) -> list[np.ndarray]:
    """Split arrays (along their first axis) into random train and test parts.

    Parameters
    ----------
    *arrays:
        One or more array-likes with the same first dimension ``n``.
    test_size:
        Fraction in ``(0, 1)`` (the test part gets ``ceil(test_size * n)`` rows, as in
        scikit-learn) or an absolute count in ``[1, n-1]``.
    seed:
        ``None``, an int or a ``numpy.random.Generator`` (see :func:`as_generator`).
    stratify:
        Optional labels of length ``n``; each class is then split in the same proportion
        (largest-remainder rounding so the total test size is exact).
    shuffle:
        If False, the last ``n_test`` rows become the test part (``stratify`` must be None).

    Returns
    -------
    list of numpy arrays
        ``[a_train, a_test, b_train, b_test, ...]`` in the order the arrays were given.
    """
    if not arrays:
        raise DataError("train_test_split: at least one array is required")
    arrs = [np.asarray(a) for a in arrays]
    for k, a in enumerate(arrs):
        if a.ndim == 0:
            raise DataError(f"train_test_split: array {k} is a scalar")
    n = arrs[0].shape[0]
    for k, a in enumerate(arrs):
        if a.shape[0] != n:
            raise DataError(f"train_test_split: arrays have different lengths "
                            f"({[x.shape[0] for x in arrs]})")
    if n < 2:
        raise DataError(f"train_test_split: need at least 2 samples, got {n}")
    n_test = _resolve_test_size(test_size, n)
    rng = as_generator(seed)
    if stratify is not None:
        if not shuffle:
            raise DataError("train_test_split: stratify requires shuffle=True")
        labels = np.asarray(stratify)
        if labels.shape[:1] != (n,) or labels.ndim != 1:
            raise DataError(f"train_test_split: stratify must be 1-D of length {n}, "
                            f"got shape {labels.shape}")
        test_idx, train_idx = _stratified_indices(labels, n_test, rng)
    elif shuffle:
        perm = rng.permutation(n)
        test_idx, train_idx = perm[:n_test], perm[n_test:]
    else:
        train_idx = np.arange(n - n_test)
        test_idx = np.arange(n - n_test, n)
    out: list[np.ndarray] = []
    for a in arrs:
        out += [a[train_idx], a[test_idx]]
    return out


def _resolve_test_size(test_size: Any, n: int) -> int:
    if isinstance(test_size, (bool, np.bool_)):
        raise DataError("train_test_split: test_size must be a float in (0, 1) or an int count")
    if isinstance(test_size, (int, np.integer)):
        if not 1 <= test_size <= n - 1:
            raise DataError(f"train_test_split: test_size={test_size} must lie in [1, {n - 1}] "
                            f"for {n} samples")
        return int(test_size)
    if isinstance(test_size, (float, np.floating)):
        if not 0.0 < test_size < 1.0:
            raise DataError(f"train_test_split: test_size={test_size} must lie in (0, 1)")
        k = math.ceil(float(test_size) * n)
        if not 1 <= k <= n - 1:
            raise DataError(f"train_test_split: test_size={test_size} leaves an empty part "
                            f"for {n} samples")
        return k
    raise DataError(f"train_test_split: test_size must be a float or int, got {type(test_size).__name__}")


def _stratified_indices(labels: np.ndarray, n_test: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = labels.shape[0]
    classes, inv, counts = np.unique(labels, return_inverse=True, return_counts=True)
    exact = counts * (n_test / n)
    alloc = np.floor(exact).astype(np.int64)
    remainder = n_test - int(alloc.sum())
    if remainder:
        # largest fractional part first; ties by class order (deterministic)
        order = np.argsort(-(exact - alloc), kind="stable")
        order = order[alloc[order] < counts[order]]
        alloc[order[:remainder]] += 1
    test_parts, train_parts = [], []
    for c in range(classes.shape[0]):
        members = rng.permutation(np.flatnonzero(inv == c))
        test_parts.append(members[:alloc[c]])
        train_parts.append(members[alloc[c]:])
    test_idx = rng.permutation(np.concatenate(test_parts))
    train_idx = rng.permutation(np.concatenate(train_parts))
    return test_idx, train_idx
