"""Class 3: the memory budget is a promise -- refused before allocating, for every allocating op.

Every case runs in a child process under RLIMIT_AS (see ``_limited.py``) with a fixed budget
(``memory.available_bytes`` pinned to 10 MiB, so the budget is 8 MiB): outputs of 12 MiB to
several TiB must raise MemoryBudgetError naming the op, and the child's peak RSS must not grow
by the refused size (nothing was allocated first).  Without the budget check, the small cases
would succeed (a silent broken promise) and the huge ones would die on the address-space limit.
"""
from __future__ import annotations

import pytest

from ._limited import run_limited

MIB = 1 << 20

CASES = """
f32 = "float32"
small = lambda *s: pg.tensor(np.ones(s, dtype=np.float32))
case("broadcast-add", lambda: small(2048, 1) + small(1, 2048))                 # 16 MiB
case("broadcast-mul-scalar-backend", lambda: pg.tensor(np.ones((2048, 1)), backend="scalar")
     * pg.tensor(np.ones((1, 2048)), backend="scalar"))                          # 32 MiB of Values
case("broadcast-where", lambda: pg.where(small(2048, 1) > 0, small(1, 2048), 0.0))
case("broadcast-pow", lambda: small(2048, 1) ** small(1, 2048))
case("maximum", lambda: small(2048, 1).maximum(small(1, 2048)))
case("dense-matmul", lambda: small(2048, 1) @ small(1, 2048))
case("batched-matmul", lambda: small(64, 256, 1) @ small(1, 1, 256))
case("expand", lambda: small(1, 4096).expand(4096, 4096))
case("expand-then-materialise", lambda: pg.expand(small(1, 4096), (4096, 4096)) * 2)
case("cast", lambda: pg.tensor(np.ones((1024, 1536), dtype=np.int8)).cast("float64"))   # 1.5 -> 12 MiB
case("cat", lambda: pg.cat([small(1024, 1024)] * 3))                              # 12 MiB
case("stack", lambda: pg.stack([small(1024, 1024)] * 3))
case("index-add", lambda: pg.index_add(small(1), ([0],), (1 << 40,)))
case("zeros-huge", lambda: pg.zeros(10 ** 6, 10 ** 6))
case("full-huge", lambda: pg.full((10 ** 7, 10 ** 7), 1.0))
coo = lambda shape: pg.sparse_coo(np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0], dtype=np.float32), shape)
case("sparse-to-dense", lambda: coo((10 ** 6, 10 ** 6)).to_dense())
case("sparse-transpose-huge-cols", lambda: coo((2, 10 ** 12)).T @ pg.ones(2, 1))
case("sparse-csr-huge-rows", lambda: coo((10 ** 12, 2)).to_sparse("csr"))
case("spmm-output", lambda: coo((10 ** 7, 2)) @ pg.ones(2, 64))
case("sparse-plus-dense-densifies", lambda: coo((2048, 2048)) + small(2048, 1))
case("sparse-plus-scalar-densifies", lambda: coo((4096, 4096)) + 1.0)
big_view = np.broadcast_to(np.float32(1), (4096, 4096))   # 4 bytes of memory, 64 MiB once copied
case("tensor-copy", lambda: pg.tensor(big_view))
case("tensor-cast-copy", lambda: pg.tensor(np.ones((1024, 1280), dtype=np.int8), dtype="float64"))
def _backward():
    x = pg.tensor(np.ones((1, 4096), dtype=np.float32), requires_grad=True)
    (x.expand(4096, 4096) * 1).sum().backward()
case("backward-through-expand", _backward)
"""


@pytest.fixture(scope="module")
def outcomes():
    return run_limited(CASES, available=10 * MIB)


NAMES = ["broadcast-add", "broadcast-mul-scalar-backend", "broadcast-where", "broadcast-pow", "maximum",
         "dense-matmul", "batched-matmul", "expand", "expand-then-materialise", "cast", "cat", "stack",
         "index-add", "zeros-huge", "full-huge", "sparse-to-dense", "sparse-transpose-huge-cols",
         "sparse-csr-huge-rows", "spmm-output", "sparse-plus-dense-densifies",
         "sparse-plus-scalar-densifies", "backward-through-expand", "tensor-copy", "tensor-cast-copy"]


@pytest.mark.parametrize("name", NAMES)
def test_refused_before_allocation(outcomes, name):
    got = outcomes.get(name)
    assert got is not None, f"case {name} did not report (child crashed?)"
    assert got["type"] == "MemoryBudgetError", got
    assert "would need" in got["message"] or "cannot allocate" in got["message"], got["message"]
    assert got["rss_growth"] < 8 * MIB, f"{name}: peak RSS grew by {got['rss_growth']} bytes before the refusal"


def test_within_budget_still_runs():
    got = run_limited("""
case("small-add", lambda: pg.tensor(np.ones((256, 256))) + 1)
case("small-matmul", lambda: pg.tensor(np.ones((256, 256))) @ pg.tensor(np.ones((256, 8))))
""", available=10 * MIB)
    assert got["small-add"]["type"] == "ok" and got["small-matmul"]["type"] == "ok"


def test_real_budget_refuses_terabytes_under_the_address_limit():
    """With the machine's real available memory: a multi-TiB op is refused, not attempted."""
    got = run_limited("""
big = pg.tensor(np.ones((1, 10 ** 6), dtype=np.float32))
case("terabyte-broadcast", lambda: big.reshape(10 ** 6, 1) + big)
case("terabyte-matmul", lambda: big.reshape(10 ** 6, 1) @ big)
""")
    for name in ("terabyte-broadcast", "terabyte-matmul"):
        assert got[name]["type"] == "MemoryBudgetError", got[name]
