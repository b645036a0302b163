"""The layout policy (choose_layout, layout="auto", automatic sparsification of a matmul operand and
its cache), its event hook, and the memory budget (polygrad.runtime.memory)."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime import memory
from polygrad import sparse
from polygrad.errors import MemoryBudgetError


@pytest.fixture
def config_guard():
    saved = (pg.config.sparse_threshold, pg.config.sparse_min_elements, pg.config.memory_fraction)
    yield pg.config
    pg.config.sparse_threshold, pg.config.sparse_min_elements, pg.config.memory_fraction = saved


class Recorder:
    """An event-hook plugin recording every layout decision."""

    def __init__(self):
        self.events: list[dict] = []

    @pg.hookimpl
    def polygrad_layout_chosen(self, op, shape, nnz, density, layout, reason):
        self.events.append(dict(op=op, shape=shape, nnz=nnz, density=density, layout=layout, reason=reason))


@pytest.fixture
def recorder():
    rec = Recorder()
    pg.register_plugin(rec, name="sparse-layout-recorder")
    yield rec
    pg.unregister_plugin(rec)


def sparse_matrix(n: int, m: int, density: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.normal(size=(n, m))
    out[rng.random((n, m)) >= density] = 0.0
    return out


# -- the cost model ------------------------------------------------------------------------------------

def test_break_even_density_falls_with_feature_width():
    assert sparse.break_even_density(16) == pytest.approx(sparse.BREAK_EVEN_F16)
    assert sparse.break_even_density(1433) == pytest.approx(sparse.BREAK_EVEN_F1433)
    widths = [1, 4, 16, 64, 256, 1433, 10_000]
    values = [sparse.break_even_density(f) for f in widths]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert all(sparse.BREAK_EVEN_MIN <= v <= sparse.BREAK_EVEN_MAX for v in values)


def test_a_kernel_may_declare_its_own_break_even(monkeypatch):
    from polygrad.ir.ops import Op
    from polygrad.runtime.registry import registry
    registry.load()
    table = registry.tables["numpy"]
    original = table[(Op.SPMM, "csr")]

    def faster(*args, **kwargs):
        return original(*args, **kwargs)

    faster.polygrad_break_even = (0.2, 0.07)
    monkeypatch.setitem(table, (Op.SPMM, "csr"), faster)
    assert sparse.break_even_density(16, "numpy") == pytest.approx(0.2)
    assert sparse.break_even_density(1433, "numpy") == pytest.approx(0.07)
    assert sparse.break_even_density(16) == pytest.approx(sparse.BREAK_EVEN_F16)  # no backend: the default
    a = pg.tensor(sparse_matrix(300, 300, 0.1, seed=12))  # 10%: sparse for this kernel at F=16
    assert sparse.maybe_sparsify_for_matmul(a, pg.ones(300, 16, dtype=pg.float64)) is not None
    faster.polygrad_break_even = ("fast", None)  # malformed: ignored
    assert sparse.break_even_density(16, "numpy") == pytest.approx(sparse.BREAK_EVEN_F16)


def test_choose_layout_rules_in_order(config_guard, recorder):
    thr = sparse.break_even_density(16)
    big = (1000, 1000)
    assert pg.choose_layout((10, 10), 1, feature_width=16) == "dense"                 # tiny
    assert pg.choose_layout(big, int(thr * 0.5 * 1e6), feature_width=16) == "csr"      # sparse enough
    assert pg.choose_layout(big, int(thr * 1.5 * 1e6), feature_width=16) == "dense"    # too dense
    assert pg.choose_layout(big, 10, feature_width=16, dense_grad=True) == "dense"     # needs a dense grad
    assert pg.choose_layout(big, 10, feature_width=16, layout="coo") == "coo"
    assert pg.choose_layout((10, 10, 10), 1) == "dense"
    config_guard.sparse_threshold = 0.9  # the user's threshold overrides the cost model
    assert pg.choose_layout(big, 800_000, feature_width=16) == "csr"
    config_guard.sparse_threshold = 0.0
    assert pg.choose_layout(big, 1, feature_width=16) == "dense"
    config_guard.sparse_min_elements = 0
    config_guard.sparse_threshold = 0.5
    assert pg.choose_layout((2, 2), 1) == "csr"
    reasons = [e["reason"] for e in recorder.events]
    assert "sparse_min_elements" in reasons[0] and "cost-model break-even at F=16" in reasons[1]
    assert "gradient at every entry" in reasons[3] and "sparse_threshold" in reasons[6]
    assert recorder.events[1]["nnz"] == int(thr * 0.5 * 1e6) and recorder.events[1]["layout"] == "csr"
    assert recorder.events[0]["density"] == pytest.approx(0.01)


def test_choose_layout_keeps_sparse_when_dense_would_not_fit(config_guard, monkeypatch, recorder):
    monkeypatch.setattr(memory, "available_bytes", lambda backend=None: 50 << 20)
    # 4000 x 4000 float32 = 64 MB dense > 0.8 * 50 MB, although the density (60%) says dense
    assert pg.choose_layout((4000, 4000), 9_600_000, feature_width=16) == "csr"
    assert "memory budget" in recorder.events[-1]["reason"]


def test_nnz_is_counted_lazily():
    calls = []

    def count():
        calls.append(1)
        return 5

    assert pg.choose_layout((10, 10), count) == "dense" and calls == []  # the size rule needs no count
    assert pg.choose_layout((1000, 1000), count, feature_width=16) == "csr" and calls == [1]


# -- layout="auto" ----------------------------------------------------------------------------------

def test_tensor_layout_auto(recorder):
    sparse_data = sparse_matrix(200, 200, 0.01)
    a = pg.tensor(sparse_data, layout="auto")
    assert pg.is_sparse(a) and a.layout == "csr" and a.nnz == np.count_nonzero(sparse_data)
    np.testing.assert_array_equal(a.to_dense().numpy(), sparse_data)
    d = pg.tensor(sparse_matrix(200, 200, 0.5), layout="auto")
    assert d.layout == "dense"
    assert pg.tensor(np.eye(10), layout="auto").layout == "dense"          # tiny
    assert pg.tensor(np.zeros((3, 100, 100)), layout="auto").layout == "dense"  # 3-D
    g = pg.tensor(sparse_data, layout="auto", requires_grad=True)          # a dense leaf's grad is dense
    assert g.layout == "dense" and g.requires_grad
    forced = pg.tensor(np.eye(3), layout="coo", requires_grad=True)
    assert forced.layout == "coo" and forced.nnz == 3 and forced.requires_grad and forced.is_leaf
    assert [e["op"] for e in recorder.events] == ["tensor"] * 5
    assert pg.tensor(a, layout="auto") is a


def test_constructor_layout_auto():
    small = pg.sparse_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), layout="auto")
    assert small.layout == "dense"
    np.testing.assert_array_equal(small.numpy(), [[0, 1], [2, 0]])
    ei = np.stack([np.arange(300), (np.arange(300) + 1) % 300])
    a = pg.from_edge_index(ei, layout="auto")
    assert a.layout == "csr" and a.nnz == 300


# -- automatic sparsification of a dense matmul operand ---------------------------------------------

def test_low_density_dense_operand_is_sparsified_once_and_cached(recorder):
    a_np = sparse_matrix(300, 300, 0.01, seed=1)
    b_np = np.random.default_rng(2).normal(size=(300, 16))
    a = pg.tensor(a_np)
    b = pg.tensor(b_np, requires_grad=True)
    y = a @ b
    np.testing.assert_allclose(y.numpy(), a_np @ b_np, rtol=1e-12)
    assert y.op == "spmm"
    y.sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), a_np.T @ np.ones((300, 16)), rtol=1e-12)
    form = sparse.maybe_sparsify_for_matmul(a, b)
    assert form is sparse.maybe_sparsify_for_matmul(a, b)  # converted once
    assert (a @ b).op == "spmm"
    assert recorder.events[0]["op"] == "matmul" and recorder.events[0]["layout"] == "csr"
    assert recorder.events[0]["nnz"] == np.count_nonzero(a_np)


def test_cache_is_invalidated_when_data_is_reassigned():
    a_np = sparse_matrix(300, 300, 0.01, seed=3)
    b_np = np.random.default_rng(4).normal(size=(300, 8))
    a = pg.tensor(a_np)
    b = pg.tensor(b_np)
    first = sparse.maybe_sparsify_for_matmul(a, b)
    assert first is not None
    new_np = sparse_matrix(300, 300, 0.01, seed=5)
    a.data = pg.tensor(new_np)
    np.testing.assert_allclose((a @ b).numpy(), new_np @ b_np, rtol=1e-12)
    assert sparse.maybe_sparsify_for_matmul(a, b) is not first
    dense_np = sparse_matrix(300, 300, 0.9, seed=6)
    a.data = pg.tensor(dense_np)  # now dense: the policy must say so again
    assert sparse.maybe_sparsify_for_matmul(a, b) is None
    np.testing.assert_allclose((a @ b).numpy(), dense_np @ b_np, rtol=1e-12)


def test_cache_entries_die_with_their_tensor():
    before = len(sparse._matmul_cache)
    a = pg.tensor(sparse_matrix(300, 300, 0.01, seed=7))
    sparse.maybe_sparsify_for_matmul(a, pg.ones(300, 4, dtype=pg.float64))
    assert len(sparse._matmul_cache) == before + 1
    del a
    assert len(sparse._matmul_cache) == before


def test_operand_that_requires_grad_is_not_sparsified():
    """A dense leaf's gradient is dense (nonzero at its zeros): sparsifying it would be wrong."""
    a_np = sparse_matrix(300, 300, 0.01, seed=8)
    b_np = np.random.default_rng(9).normal(size=(300, 4))
    a = pg.tensor(a_np, requires_grad=True)
    y = a @ pg.tensor(b_np)
    assert y.op == "matmul"
    y.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.ones((300, 4)) @ b_np.T, rtol=1e-12)
    with pg.no_grad():
        assert (a @ pg.tensor(b_np)).op is None and sparse.maybe_sparsify_for_matmul(a, pg.tensor(b_np)) is not None


def test_dense_operand_stays_dense_with_threshold_zero(config_guard):
    config_guard.sparse_threshold = 0.0
    a = pg.tensor(sparse_matrix(300, 300, 0.01, seed=10))
    assert sparse.maybe_sparsify_for_matmul(a, pg.ones(300, 4, dtype=pg.float64)) is None
    assert (a @ pg.ones(300, 4, dtype=pg.float64)).op is None  # no grad needed: plain result


def test_clearly_dense_operand_is_rejected_from_a_sample(recorder):
    a = pg.tensor(np.random.default_rng(11).normal(size=(400, 400)))
    assert sparse.maybe_sparsify_for_matmul(a, pg.ones(400, 4, dtype=pg.float64)) is None
    assert recorder.events[-1]["nnz"] == -1 and "sampled density" in recorder.events[-1]["reason"]


# -- memory budget ------------------------------------------------------------------------------------

def test_available_bytes_from_psutil_or_the_backend():
    assert memory.available_bytes() > 0
    assert 0 < memory.budget_bytes() <= memory.available_bytes() * 1.05  # psutil's figure moves a little

    class Reporting:
        name = "fake"

        def memory_available(self):
            return 12345

    class Broken:
        name = "broken"

        def memory_available(self):
            raise RuntimeError("driver gone")

    assert memory.available_bytes(Reporting()) == 12345
    assert memory.available_bytes(Broken()) > 12345  # falls back to host memory
    assert memory.available_bytes("numpy") > 0
    assert memory.format_bytes(1536) == "1.5 KiB" and memory.format_bytes(10) == "10 B"


def test_densifying_a_huge_sparse_matrix_is_refused():
    huge = pg.sparse_coo([[0, 999_999], [5, 999_999]], [1.0, 2.0], (1_000_000, 1_000_000))
    with pytest.raises(MemoryBudgetError, match=r"op 'to_dense' would need 4000000000000 bytes .*memory_fraction"):
        huge.to_dense()
    with pytest.raises(MemoryBudgetError, match="to_dense"):
        huge.numpy()
    with pytest.raises(MemoryBudgetError, match="op 'add'"):
        huge + 1.0
    with pytest.raises(MemoryError):  # still an ordinary MemoryError for generic handlers
        huge.to_dense()
    # ops that can stay sparse do
    assert pg.is_sparse(huge * 3.0) and pg.is_sparse(huge + huge) and pg.is_sparse(huge.T)
    assert huge.sum().item() == 3.0


def test_budget_follows_memory_fraction_and_available_memory(config_guard, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda backend=None: 100 << 20)
    a = pg.sparse_coo([[0], [0]], [1.0], (3000, 3000), dtype=pg.float64)  # dense: 72 MB
    assert a.to_dense().shape == (3000, 3000)                              # 72 MB < 80 MB
    config_guard.memory_fraction = 0.5
    with pytest.raises(MemoryBudgetError, match=r"72000000 bytes.*memory_fraction=0.5"):
        a.to_dense()
    tall = pg.sparse_coo([[0], [0]], [1.0], (30_000, 3), dtype=pg.float64)
    with pytest.raises(MemoryBudgetError, match=r"op 'matmul'.*72000000 bytes.*\(30000, 300\) result"):
        tall @ pg.ones(3, 300, dtype=pg.float64)   # a small operand, but the dense SpMM output would not fit
    with pytest.raises(ValueError):
        config_guard.memory_fraction = 0.0


def test_sparse_at_sparse_expansion_is_checked(monkeypatch):
    n = 2000
    dense_block = pg.sparse_coo(np.stack(np.divmod(np.arange(n * 200), 200)) % n, np.ones(n * 200), (n, n),
                                dtype=pg.float64)
    monkeypatch.setattr(memory, "available_bytes", lambda backend=None: 20 << 20)
    with pytest.raises(MemoryBudgetError, match="partial products"):
        dense_block @ dense_block


def test_check_below_the_floor_never_asks(monkeypatch):
    def boom(backend=None):
        raise AssertionError("psutil consulted for a tiny allocation")

    monkeypatch.setattr(memory, "available_bytes", boom)
    memory.check("x", 1024)
    assert memory.fits(1024)
    a = pg.sparse_coo([[0], [0]], [1.0], (10, 10))
    assert (a @ pg.ones(10, 3)).shape == (10, 3) and a.to_dense().shape == (10, 10)
