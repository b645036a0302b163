"""pg.monitor(): per-step nnz ratios, gradient norms, memory, layouts, fallbacks, warnings; zero
hooks registered when not enabled; and the per-epoch report on a GCN over Cora."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.monitor import Monitor
from polygrad.runtime.registry import registry
from polygrad.tensor import spmm
from polygrad.testing import inject_fault
from polygrad.testing.cases import sample_pattern
from tests.conftest import planetoid_dir


def _events() -> dict:
    return {k: v is not None for k, v in registry.events.items()}


def test_hooks_registered_only_while_enabled():
    registry.load()
    before = _events()
    m = pg.monitor()
    assert isinstance(m, Monitor) and not m.enabled and _events() == before
    with m:
        assert all(_events().values())
        m.pause()
        assert _events() == before
        m.resume()
        assert all(_events().values())
    assert _events() == before and not m.enabled


def test_records_ops_sparse_density_grad_norm_and_memory():
    p = sample_pattern()
    rng = np.random.default_rng(0)
    w = pg.tensor(rng.normal(size=(3, 2)), requires_grad=True)
    x = pg.tensor(rng.normal(size=(5, 3)))
    v = pg.tensor(rng.random(p.nnz))
    with pg.monitor() as m:
        loss = spmm(v, x @ w, p).tanh().sum()
        loss.backward()
        rec = m.step(loss=loss, epoch=0)
    assert rec.step == 0 and rec.metrics == {"loss": pytest.approx(loss.item()), "epoch": 0}
    if pg.get_kernel("numpy", pg.Op.MATMUL, "dense", kind="vjp") is None:
        assert rec.ops[("matmul", "numpy", "dense")] >= 2   # forward and backward
    else:  # the backward's products run inside the fused kernel, not through dispatch
        assert rec.ops[("matmul", "numpy", "dense")] == 1
    s = rec.sparse["spmm/csr 4x5"]
    assert s.nnz == p.nnz and s.calls == 1
    if pg.get_kernel("numpy", pg.Op.SPMM, "csr", kind="vjp") is None:
        assert rec.sparse["spmm/csr 5x4"].calls == 1       # the backward's Aᵀ @ dY, through dispatch
    assert s.density == pytest.approx(p.nnz / (p.shape[0] * p.shape[1]))
    assert rec.grad_norm == pytest.approx(np.linalg.norm(w.grad.numpy()))
    assert rec.rss_bytes > 0 and rec.peak_rss_bytes >= rec.rss_bytes
    line = str(rec)
    assert line.startswith("step 0 | loss") and "grad_norm" in line and "spmm/csr 4x5 nnz 7 (35%) x1" in line
    assert m.epoch_report() == line
    table = m.summary()
    assert table.splitlines()[0].split()[:3] == ["step", "loss", "epoch"] and "spmm/csr 4x5 nnz%" in table
    data = json.loads(json.dumps(m.to_dict()))
    assert data["steps"][0]["ops"]["spmm/numpy/csr"] >= 1
    assert data["steps"][0]["sparse"]["spmm/csr 4x5"]["nnz"] == p.nnz and data["current"] is None


def test_steps_are_separate_and_stop_closes_the_open_step():
    x = pg.tensor([1.0, 2.0], requires_grad=True)
    with pg.monitor() as m:
        (x * x).sum().backward()
        m.step()
        (x * 3).sum().backward()
    assert [r.step for r in m.steps] == [0, 1]
    assert m.steps[0].grad_norm == pytest.approx(np.hypot(2, 4))
    assert m.steps[1].grad_norm == pytest.approx(np.hypot(5, 7))  # .grad accumulates: 2+3, 4+3


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_warns_on_non_finite_gradient(caplog):
    x = pg.tensor([0.0, 1.0], requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="polygrad.runtime.monitor"), pg.monitor() as m:
        (x ** 0.5).sum().backward()          # d sqrt(x)/dx at 0 is inf
    assert "non-finite (NaN/Inf) gradient in 1 tensor" in caplog.text
    assert m.steps[0].warnings and not np.isfinite(m.steps[0].grad_norm)


def test_warns_on_exploding_gradient_norm(caplog):
    x = pg.tensor(np.ones(3), requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="polygrad.runtime.monitor"), pg.monitor(explode_factor=10) as m:
        for scale in (1.0, 1.2, 0.9, 1.1, 500.0):
            x.grad = None
            (x * scale).sum().backward()
            m.step()
    assert "exploding gradient" in caplog.text
    assert [len(r.warnings) for r in m.steps] == [0, 0, 0, 0, 1]


def test_warns_on_absolute_norm_limit_and_memory_budget(caplog):
    x = pg.tensor(np.ones(4), requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="polygrad.runtime.monitor"), \
            pg.monitor(max_grad_norm=1.0, memory_budget=1) as m:
        (x * 2).sum().backward()
        m.step()
    text = caplog.text
    assert "exceeds max_grad_norm" in text and "memory above the budget" in text
    assert len(m.steps[0].warnings) == 2


def test_records_fallbacks_and_layout_decisions():
    x = pg.tensor(np.linspace(0.1, 1.0, 6))
    with pg.monitor() as m, inject_fault("numpy", "exp", mode="raise"), pytest.warns(pg.FallbackWarning):
        x.exp()
        registry.pm.hook.polygrad_layout_chosen(op="matmul", shape=(100, 100), nnz=30, density=0.003,
                                                layout="csr", reason="density below threshold")
        rec = m.step()
    assert sum(rec.fallbacks.values()) == 1 and next(iter(rec.fallbacks)).startswith("exp/numpy/dense")
    assert rec.layouts == {"matmul->csr": 1} and "density 0.003" in rec.layout_reasons["matmul->csr"]
    assert "layouts matmul->csr:1" in str(rec) and "fallbacks 1" in str(rec)
    assert "fallbacks: exp/numpy/dense" in m.summary()


def test_summary_with_nothing_recorded():
    assert m_summary_empty() == "polygrad monitor: nothing recorded"


def m_summary_empty() -> str:
    with pg.monitor() as m:
        pass
    return m.summary()


# -- the GCN on Cora -----------------------------------------------------------------------------------



@pytest.mark.skipif(planetoid_dir() is None, reason="Cora not found (set POLYGRAD_PLANETOID_DIR)")
def test_monitor_report_on_cora_gcn():
    """Two-layer GCN (A relu(A X W1) W2) on Cora: per epoch, nnz ratio, gradient norm and memory."""
    from polygrad.data import load_planetoid, normalized_adjacency
    from polygrad.sparse.pattern import Pattern

    ds = load_planetoid(planetoid_dir(), "cora")
    adj = normalized_adjacency(ds.edge_index, ds.num_nodes, dtype=np.float32)
    pattern = Pattern(adj.shape, adj.indptr.astype(np.int64), adj.indices.astype(np.int64), "csr")
    a = pg.tensor(adj.data)
    x = pg.tensor(ds.x_dense(np.float32))
    pg.manual_seed(0)
    w1 = pg.tensor(np.random.default_rng(0).normal(0, 0.05, (ds.num_features, 16)).astype(np.float32),
                   requires_grad=True)
    w2 = pg.tensor(np.random.default_rng(1).normal(0, 0.3, (16, ds.num_classes)).astype(np.float32),
                   requires_grad=True)
    train = np.flatnonzero(ds.train_mask)
    with pg.monitor() as m:
        for epoch in range(3):
            w1.grad = w2.grad = None
            h = spmm(a, x @ w1, pattern).relu()
            loss = pg.cross_entropy(spmm(a, h @ w2, pattern), ds.y, mask=train)
            loss.backward()
            with pg.no_grad():
                w1.data = w1 - 0.5 * w1.grad
                w2.data = w2 - 0.5 * w2.grad
            line = str(m.step(epoch=epoch, loss=loss.item()))
            assert "spmm/csr 2708x2708 nnz 13264 (0.181%)" in line and "grad_norm" in line and "rss" in line
    for rec in m.steps:
        # A in both layers (and Aᵀ in the backward unless a fused backward kernel serves it)
        s = rec.sparse["spmm/csr 2708x2708"]
        assert s.calls >= 2 and s.nnz == 13264 and s.density == pytest.approx(13264 / 2708 ** 2)
        assert np.isfinite(rec.grad_norm) and rec.grad_norm > 0
        assert rec.peak_rss_bytes > 50 * 2**20
    assert m.steps[-1].metrics["loss"] < m.steps[0].metrics["loss"]
    assert len(m.summary().splitlines()) == 2 + 3
