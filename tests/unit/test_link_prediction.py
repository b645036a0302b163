"""Link prediction: negative_sampling and RandomLinkSplit properties (hypothesis), the BCE / NLL
losses against PyTorch and numerical gradients, roc_auc_score, LinkNeighborLoader."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import polygrad as pg
from polygrad import nn
from polygrad.data import Data, LinkNeighborLoader, negative_sampling
from polygrad.data import transforms as T
from polygrad.data import utils as U
from polygrad.errors import DataError, ShapeError
from polygrad.testing import check_grads

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed (optional baseline)")


@st.composite
def graphs(draw, max_nodes: int = 12, max_edges: int = 40):
    n = draw(st.integers(2, max_nodes))
    e = draw(st.integers(0, max_edges))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    return n, np.array([src, dst], dtype=np.int64).reshape(2, e)


def _pairs(ei: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(ei[0].tolist(), ei[1].tolist()))


# -- negative_sampling -----------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(graphs(), st.integers(0, 60), st.integers(0, 2**31), st.booleans())
def test_negatives_are_never_edges_and_distinct(g, wanted, seed, undirected):
    n, ei = g
    neg = negative_sampling(ei, n, num_neg_samples=wanted, seed=seed, force_undirected=undirected)
    edges = _pairs(ei) | ({(b, a) for a, b in _pairs(ei)} if undirected else set())
    got = list(zip(neg[0].tolist(), neg[1].tolist()))
    assert not set(got) & edges                                   # no negative is an edge
    assert all(a != b for a, b in got)                            # nor a self loop
    assert len(set(got)) == len(got)                              # nor repeated
    non_edges = n * (n - 1) - len({(a, b) for a, b in edges if a != b})
    if undirected:  # every pair both ways, wanted // 2 pairs (as PyG) while non-edge pairs last
        assert neg.shape[1] == 2 * min(wanted // 2, non_edges // 2)
        assert _pairs(neg) == {(b, a) for a, b in _pairs(neg)}
    else:
        assert neg.shape[1] == min(wanted, non_edges)             # exactly as many as exist
    again = negative_sampling(ei, n, num_neg_samples=wanted, seed=seed, force_undirected=undirected)
    np.testing.assert_array_equal(neg, again)                     # reproducible by seed


def test_negative_sampling_large_sparse_graph_uses_rejection():
    rng = np.random.default_rng(0)
    n = 5000
    ei = rng.integers(0, n, size=(2, 20000))
    neg = negative_sampling(ei, n, seed=1)
    assert neg.shape == (2, 20000)
    assert not _pairs(neg) & _pairs(ei) and len(_pairs(neg)) == 20000
    assert (neg[0] != neg[1]).all()
    assert negative_sampling(ei, n, num_neg_samples=0.5, seed=1).shape == (2, 10000)  # float: a ratio of E


def test_negative_sampling_bipartite_and_full_graph():
    ei = np.array([[0, 0, 1], [0, 1, 2]])
    neg = negative_sampling(ei, (2, 3), num_neg_samples=10, seed=0)
    assert sorted(_pairs(neg)) == [(0, 2), (1, 0), (1, 1)]        # self pairs allowed when bipartite
    full = np.array([[0, 1], [1, 0]])
    assert negative_sampling(full, 2, seed=0).shape == (2, 0)
    with pytest.raises(DataError, match="method"):
        negative_sampling(full, 2, method="fast")
    with pytest.raises(DataError, match="seed"):
        negative_sampling(full, 2, seed=1.5)


# -- RandomLinkSplit -------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:RandomLinkSplit. not enough negative edges")
@settings(max_examples=40, deadline=None)
@given(st.integers(8, 30), st.floats(0.05, 0.9), st.integers(0, 2**31), st.booleans(), st.booleans())
def test_random_link_split_has_no_leakage(n, p, seed, undirected, neg_train):
    rng = np.random.default_rng(seed)
    upper = np.array([(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]).T.reshape(2, -1)
    ei = U.to_undirected(upper, num_nodes=n) if undirected else upper
    if (ei[0] <= ei[1]).sum() < 4:
        return
    split = T.RandomLinkSplit(num_val=0.2, num_test=0.2, is_undirected=undirected,
                              add_negative_train_samples=neg_train, seed=seed)
    train, val, test = split(Data(x=np.ones((n, 1)), edge_index=ei))
    edges = _pairs(ei)

    def pos(d):
        return _pairs(d.edge_label_index[:, d.edge_label == 1])

    def neg(d):
        return list(zip(*d.edge_label_index[:, d.edge_label == 0].tolist()))

    def both(s):
        return s | {(b, a) for a, b in s}

    p_tr, p_va, p_te = pos(train), pos(val), pos(test)
    key = both if undirected else (lambda s: s)
    assert not key(p_tr) & key(p_va) and not key(p_tr) & key(p_te) and not key(p_va) & key(p_te)
    assert key(p_tr | p_va | p_te) == edges if undirected else (p_tr | p_va | p_te) == edges
    assert _pairs(train.edge_index) == key(p_tr)                  # train passes messages over train edges
    assert _pairs(val.edge_index) == key(p_tr)                    # val: still only train edges
    assert _pairs(test.edge_index) == key(p_tr | p_va)            # test: train and val edges
    negatives = neg(train) + neg(val) + neg(test)
    assert not set(negatives) & edges and len(set(negatives)) == len(negatives)
    assert (len(neg(train)) > 0) == (neg_train and len(negatives) > 0) or not neg_train
    again = T.RandomLinkSplit(num_val=0.2, num_test=0.2, is_undirected=undirected,
                              add_negative_train_samples=neg_train, seed=seed)(Data(x=np.ones((n, 1)), edge_index=ei))
    for a, b in zip((train, val, test), again):
        np.testing.assert_array_equal(a.edge_label_index, b.edge_label_index)


def test_random_link_split_sizes_follow_pyg():
    n = 40
    ei = U.to_undirected(np.array([np.arange(n - 1), np.arange(1, n)]), num_nodes=n)  # a path: 39 edges
    train, val, test = T.RandomLinkSplit(num_val=0.1, num_test=0.2, is_undirected=True, seed=0)(
        Data(x=np.ones((n, 2)), edge_index=ei, edge_weight=np.arange(78.0)))
    # PyG: int(0.1 * 39) = 3 val, int(0.2 * 39) = 7 test, 29 train; one negative per positive
    assert train.edge_index.shape[1] == 58 and train.edge_label.shape[0] == 58
    assert val.edge_label.tolist() == [1.0] * 3 + [0.0] * 3
    assert test.edge_label.shape[0] == 14 and test.edge_index.shape[1] == 64
    assert train.edge_weight.shape == (58,)  # edge attributes follow their edges
    with pytest.raises(DataError, match="insufficient"):
        T.RandomLinkSplit(num_val=20, num_test=19)(Data(edge_index=ei[:, :39], num_nodes=n))


# -- losses ---------------------------------------------------------------------------------------

def _bce_ref(x, y, w=None, pw=None):
    p = 1.0 if pw is None else pw
    out = (1 - y) * x + (1 + (p - 1) * y) * (np.maximum(-x, 0) + np.log1p(np.exp(-np.abs(x))))
    return out * (1.0 if w is None else w)


def test_bce_with_logits_hand_and_stable():
    x = np.array([-800.0, -3.0, 0.0, 2.0, 800.0])
    y = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    out = nn.binary_cross_entropy_with_logits(pg.tensor(x), y, reduction="none").numpy()
    np.testing.assert_allclose(out, [800.0, np.log1p(np.exp(-3.0)), np.log(2.0), np.log1p(np.exp(-2.0)), 800.0],
                               rtol=1e-12)
    assert np.isfinite(out).all()
    with pytest.raises(ShapeError, match="must match"):
        nn.binary_cross_entropy_with_logits(pg.tensor(np.zeros((3, 1))), np.zeros(3))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_gradients_numerically(reduction):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)) * 4
    y = rng.random((5, 3))
    w = rng.random((5, 3))
    pw = rng.random(3) * 3
    check_grads(lambda a, t: nn.binary_cross_entropy_with_logits(a, t, weight=w, pos_weight=pw, reduction=reduction),
                [x, y])


@needs_torch
def test_bce_with_logits_matches_pytorch():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 2)) * 10
    y = (rng.random((6, 2)) > 0.5).astype(np.float64)
    w, pw = rng.random((6, 2)), rng.random(2) * 4
    for kwargs in ({}, {"weight": w}, {"pos_weight": pw}, {"weight": w, "pos_weight": pw, "reduction": "sum"}):
        t = pg.tensor(x, requires_grad=True)
        ours = nn.binary_cross_entropy_with_logits(t, y, **kwargs)
        ours.backward()
        tt = torch.tensor(x, requires_grad=True)
        tk = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        theirs = F.binary_cross_entropy_with_logits(tt, torch.tensor(y), **tk)
        theirs.backward()
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-10, atol=1e-15)


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_pytorch(reduction):
    rng = np.random.default_rng(2)
    logp = np.log(rng.dirichlet(np.ones(4), size=7))
    target = np.array([0, 3, -100, 1, 2, 2, -100])
    w = rng.random(4) + 0.5
    for weight in (None, w):
        t = pg.tensor(logp, requires_grad=True)
        ours = nn.nll_loss(t, target, weight=weight, reduction=reduction)
        ours.sum().backward()
        tt = torch.tensor(logp, requires_grad=True)
        theirs = F.nll_loss(tt, torch.tensor(target), weight=None if weight is None else torch.tensor(weight),
                            reduction=reduction)
        theirs.sum().backward()
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-12)


def test_nll_loss_gradients_and_errors():
    rng = np.random.default_rng(3)
    logp = rng.normal(size=(5, 3))
    check_grads(lambda a: nn.nll_loss(a, np.array([0, 2, 1, 1, 0]), weight=np.array([1.0, 2.0, 0.5])), [logp])
    check_grads(lambda a: nn.nll_loss(a.log_softmax(-1), np.array([0, 2, 1, 1, 0])), [logp])
    with pytest.raises(ShapeError, match="out of range"):
        nn.nll_loss(pg.tensor(logp), np.array([0, 3, 1, 1, 0]))
    with pytest.raises(pg.errors.DTypeError, match="integer"):
        nn.nll_loss(pg.tensor(logp), np.array([0.0, 1, 1, 1, 0]))


# -- AUC ------------------------------------------------------------------------------------------

def _auc_by_pairs(y, s):
    pos, neg = s[y == 1], s[y == 0]
    diff = pos[:, None] - neg[None, :]
    return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=40))
def test_roc_auc_counts_ties_as_half(rows):
    y = np.array([int(a) for a, _ in rows])
    s = np.array([float(b) for _, b in rows])  # few distinct scores: many ties
    if len(set(y)) < 2:
        with pytest.raises(ValueError, match="two classes"):
            nn.roc_auc_score(y, s)
        return
    assert nn.roc_auc_score(y, s) == pytest.approx(_auc_by_pairs(y, s), abs=1e-12)


def test_roc_auc_matches_sklearn_when_installed():
    metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn not installed (optional baseline)")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.random(200), 1)
    assert nn.roc_auc_score(y, s) == pytest.approx(metrics.roc_auc_score(y, s), abs=1e-12)


# -- LinkNeighborLoader ---------------------------------------------------------------------------

def test_link_neighbor_loader_batches():
    rng = np.random.default_rng(0)
    n = 30
    ei = U.to_undirected(rng.integers(0, n, size=(2, 60)), num_nodes=n)
    x = rng.normal(size=(n, 3))
    data = Data(x=x, edge_index=ei, y=np.arange(n))
    loader = LinkNeighborLoader(data, [3, 2], batch_size=8, shuffle=True, neg_sampling_ratio=1.0, seed=0)
    seen = 0
    for b in loader:
        glob = b.n_id[b.edge_label_index]
        pos = glob[:, b.edge_label == 1]
        neg = glob[:, b.edge_label == 0]
        assert _pairs(pos) <= _pairs(ei) and not _pairs(neg) & _pairs(ei)
        np.testing.assert_array_equal(b.x, x[b.n_id])
        np.testing.assert_array_equal(b.y, b.n_id)
        assert b.edge_index.max() < b.num_nodes
        seen += pos.shape[1]
    assert seen == ei.shape[1] and len(loader) == -(-ei.shape[1] // 8)
    with pytest.raises(DataError, match="labels must be 1"):
        LinkNeighborLoader(data, [2], edge_label=np.zeros(ei.shape[1]), neg_sampling_ratio=1.0)
