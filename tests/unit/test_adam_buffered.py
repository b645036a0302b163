"""Adam's buffered numpy update (``polygrad.optim.adam._adam_buffered``) against the expression it
replaces, bit for bit: the same ufuncs in the same order, written into scratch buffers instead of
fresh temporaries.  The reference is ``_adam`` itself on an ndarray subclass, which the fast path
does not take."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.optim import adam
from tests.helpers import assert_bitwise


class Plain(np.ndarray):
    """An ndarray subclass: ``_adam`` runs its plain expression on it (the slow path)."""


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3e38, -3e38])
numbers = st.floats(-2.0, 2.0, allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-8, 0.999, 1e30])


def _array(rng: np.random.Generator, shape: tuple, dtype: type, specials: float) -> np.ndarray:
    a = (rng.standard_normal(shape) * rng.choice([1e-6, 1.0, 1e6], size=shape)).astype(dtype)
    where = rng.random(shape) < specials
    a[where] = SPECIALS[rng.integers(0, len(SPECIALS), int(where.sum()))].astype(dtype)
    return a


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from([np.float32, np.float64]),
       rows=st.integers(64, 200), cols=st.sampled_from([64, 65, 96]), specials=st.sampled_from([0.0, 0.01, 0.2]),
       nums=st.lists(numbers, min_size=9, max_size=9), coupled=st.booleans(), decoupled=st.booleans(),
       fortran=st.booleans())
def test_buffered_adam_equals_its_expression_bit_for_bit(seed, dtype, rows, cols, specials, nums, coupled,
                                                        decoupled, fortran):
    rng = np.random.default_rng(seed)
    x, g, m, v = (_array(rng, (rows, cols), dtype, specials) for _ in range(4))
    if fortran:  # the layout of the inputs does not change a value
        x, m = np.asfortranarray(x), np.asfortranarray(m)
    assert x.size >= adam.NUMPY_BUFFERED_MIN
    before = [a.copy() for a in (x, g, m, v)]
    with np.errstate(all="ignore"):
        fast = adam._adam(x, g, m, v, *nums, coupled=coupled, decoupled=decoupled)
        slow = adam._adam(*(a.view(Plain) for a in (x, g, m, v)), *nums, coupled=coupled, decoupled=decoupled)
    assert all(type(a) is np.ndarray for a in fast)  # the fast path ran
    assert_bitwise([np.asarray(a) for a in fast], [np.asarray(a) for a in slow])
    assert_bitwise([x, g, m, v], before)  # the inputs are never written (fit's undo holds them)
    assert not any(np.shares_memory(a, b) for a in fast for b in (x, g, m, v))


def test_the_fast_path_leaves_what_it_cannot_promise_to_the_expression():
    """A numpy-scalar number (strong under NEP 50: it may widen the result), mixed dtypes or a small
    parameter run the expression itself: the same results as before, dtype included."""
    rng = np.random.default_rng(0)
    x, g, m, v = (np.abs(rng.standard_normal((64, 64))).astype(np.float32) for _ in range(4))
    nums = [5e-4, 0.9, 0.1, 0.999, 0.001, 1.3, 1e-8, 0.99, 0.05]
    for case in ([*nums[:8], np.float64(0.05)], nums):
        for args in ((x, g, m, v), (x, g.astype(np.float64), m, v), (x[:8], g[:8], m[:8], v[:8])):
            fast = adam._adam(*args, *case, coupled=True, decoupled=False)
            slow = adam._adam(*(a.view(Plain) for a in args), *case, coupled=True, decoupled=False)
            assert_bitwise([np.asarray(a) for a in fast], [np.asarray(a) for a in slow])
