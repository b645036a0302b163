"""``matmul_grads``' path for two 2-D operands against the general one it short-cuts
(``_matmul_grads_any``): the same primitive calls, with the same arguments, in the same order, and
so the same bits -- for the rule (polygrad ops) and for a backend's fused backward (raw kernels)
alike, which both call ``matmul_grads``."""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polygrad.engine.grad_rules import _matmul_grads_any, matmul_grads

from ..helpers import assert_bitwise


def _logged(log: list) -> tuple:
    def reshape(x: Any, shape: tuple) -> Any:
        log.append(("reshape", x.shape, shape))
        return x.reshape(shape)

    def mm(x: Any, y: Any) -> Any:
        log.append(("mm", x.shape, y.shape, x.strides, y.strides))
        return x @ y

    def permute(x: Any, perm: tuple) -> Any:
        log.append(("permute", x.shape, perm, type(perm)))
        return x.transpose(perm)

    return reshape, mm, permute


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.sampled_from([(True, True), (True, False),
                                                                                  (False, True)]),
       st.integers(0, 2**32 - 1))
def test_two_matrices_take_the_general_paths_calls(n: int, k: int, m: int, needs: tuple, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, g = rng.normal(size=(n, k)), rng.normal(size=(k, m)), rng.normal(size=(n, m))
    fast_log: list = []
    any_log: list = []
    fast = matmul_grads(g, a, b, needs, *_logged(fast_log))
    general = _matmul_grads_any(g, a, b, needs, *_logged(any_log))
    assert fast_log == any_log
    assert_bitwise(list(fast), list(general), "dA, dB")


def test_other_ranks_take_the_general_path() -> None:
    rng = np.random.default_rng(0)
    for sa, sb in [((3,), (3, 2)), ((2, 3), (3,)), ((4, 2, 3), (3, 2)), ((2, 3), (4, 3, 2))]:
        a, b = rng.normal(size=sa), rng.normal(size=sb)
        g = np.ones(np.matmul(a, b).shape)
        fast_log: list = []
        any_log: list = []
        matmul_grads(g, a, b, (True, True), *_logged(fast_log))
        _matmul_grads_any(g, a, b, (True, True), *_logged(any_log))
        assert fast_log == any_log and any(e[0] == "reshape" for e in fast_log) == (1 in (len(sa), len(sb)))
