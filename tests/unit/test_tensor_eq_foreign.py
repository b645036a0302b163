"""``==`` / ``!=`` with an operand no tensor compares with return NotImplemented (Python then
compares identities), as PyTorch's tensors do; numbers, lists, arrays and tensors compare elementwise."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg


@pytest.mark.parametrize("other", [None, "a", object(), {"k": 1}])
def test_a_foreign_operand_falls_back_to_identity(other):
    t = pg.tensor([1.0, 2.0])
    assert (t == other) is False and (other == t) is False
    assert (t != other) is True and (other != t) is True
    assert t.__eq__(other) is NotImplemented
    assert t in [t] and t not in [None, "a"]  # list membership no longer raises


@pytest.mark.parametrize("other", [1.0, 2, [1.0, 3.0], np.array([1.0, 3.0]), np.float64(1.0)])
def test_operands_a_tensor_compares_with_still_compare_elementwise(other):
    t = pg.tensor([1.0, 2.0])
    np.testing.assert_array_equal((t == other).numpy(), np.asarray(t.numpy() == np.asarray(other)))
    np.testing.assert_array_equal((t != other).numpy(), np.asarray(t.numpy() != np.asarray(other)))
