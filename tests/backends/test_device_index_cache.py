"""Read-only host index arrays (a pattern's transpose permutation and row ids) are converted to a
device namespace once, not on every backward pass; writable arrays are converted afresh."""
from __future__ import annotations

import gc
import types

import numpy as np

import polygrad.backends.array_kernels as ak
from polygrad.sparse.pattern import Pattern


def fake_xp():
    calls = []

    def asarray(a):
        calls.append(a.shape)  # not the array: the cache must be the only thing keeping it
        return np.array(a)  # a copy, as a device upload would be

    return types.SimpleNamespace(__name__="fakecupy", asarray=asarray), calls


def test_pattern_index_arrays_are_read_only_and_converted_once():
    p = Pattern((3, 4), np.array([0, 2, 2, 4]), np.array([0, 2, 1, 2]))
    _, perm = p.transpose()
    assert not perm.flags.writeable and not p.rows.flags.writeable
    xp, calls = fake_xp()
    first = ak._index_for(xp, (perm,))[0]
    again = ak._index_for(xp, (perm,))[0]
    assert again is first and len(calls) == 1
    np.testing.assert_array_equal(first, perm)


def test_writable_indices_are_not_cached_and_cache_dies_with_the_array():
    xp, calls = fake_xp()
    user = np.array([2, 0, 1])
    ak._index_for(xp, (user,))
    user[0] = 1  # the user may change it between calls
    np.testing.assert_array_equal(ak._index_for(xp, (user,))[0], [1, 0, 1])
    assert len(calls) == 2
    frozen = np.array([1, 2])
    frozen.flags.writeable = False
    ak._index_for(xp, (frozen,))
    key = ("fakecupy", id(frozen))
    assert key in ak._DEVICE_INDEX
    del frozen
    gc.collect()
    assert key not in ak._DEVICE_INDEX
