"""polygrad.nn: Module discovery and state, layers, dropout, losses, GCNConv (clip_grad_norm_:
test_clip_grad_norm.py).

Gradients are checked against central differences in float64 (polygrad.testing.check_grads) and
across backends (scalar vs numpy), never against themselves.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.data import normalized_adjacency, stochastic_block_model
from polygrad.errors import CheckpointError, ShapeError
from polygrad.testing import assert_backends_agree, check_grads



def _setter(model: nn.Module):
    """A function swapping the model's parameters for given tensors (order of model.parameters()).

    The names are taken once: the numerical pass hands in tensors without requires_grad, which
    named_parameters() would not list."""
    names = [n for n, _ in model.named_parameters()]
    return lambda tensors: _set_params(model, names, tensors)


def _set_params(model: nn.Module, names, tensors) -> None:
    for name, t in zip(names, tensors):
        *path, attr = name.split(".")
        obj = model
        for part in path:
            obj = obj[int(part)] if isinstance(obj, list) else getattr(obj, part)
        setattr(obj, attr, t)


# ---------------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------------

class Tiny(nn.Module):
    def __init__(self):
        self.a = pg.tensor([1.0, 2.0], requires_grad=True)
        self.blocks = [nn.Linear(2, 3), nn.Linear(3, 1)]
        self.table = {"x": nn.Linear(1, 1)}
        self.buf = pg.tensor([5.0])               # buffer: saved, not optimised
        self.shared = self.a                      # the same tensor twice appears once
        self._cache = pg.tensor([9.0], requires_grad=True)   # private: never discovered


def test_module_discovers_parameters_in_order_and_skips_private():
    m = Tiny()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["a", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
                     "table.x.weight", "table.x.bias"]
    assert [n for n, _ in m.named_buffers()] == ["buf"]
    assert m.num_parameters() == 2 + 6 + 3 + 3 + 1 + 1 + 1
    assert "_cache" not in m.state_dict()
    assert list(m.state_dict())[-1] == "buf"


class Odd(nn.Module):
    """Containers discovery must walk as named_parameters() does (or skip as it does)."""

    def __init__(self):
        self.pair = (nn.Linear(2, 2), pg.tensor([1.0], requires_grad=True))
        self.numbered = {1: nn.Linear(1, 1), "kept": nn.Linear(1, 2)}  # a non-str key is not discovered
        self.frozen = pg.tensor([3.0])
        self.inner = Tiny()
        self.again = self.inner.blocks[1]         # a module reached twice: its tensors listed once
        self.nested = [[nn.Linear(1, 1)]]         # a list inside a list is not walked
        self.derived = self.pair[1] * 2.0         # not a leaf: not a parameter


@pytest.mark.parametrize("make", [Tiny, Odd, lambda: nn.GIN(3, 8, 3, 2), lambda: nn.GAT(5, 16, 2, 3),
                                  lambda: nn.MLP(2, [4, 4, 1], dropout=0.1)])
def test_parameters_lists_named_parameters_tensors_in_order(make):
    m = make()
    assert [id(p) for p in m.parameters()] == [id(p) for _, p in m.named_parameters()]
    m.parameters()[0].requires_grad = False  # frozen now: gone from both
    assert [id(p) for p in m.parameters()] == [id(p) for _, p in m.named_parameters()]


def test_train_eval_propagates_to_submodules():
    m = nn.MLP(2, [4, 1], dropout=0.5)
    m.eval()
    assert all(not sub.training for sub in m.modules())
    m.train()
    assert all(sub.training for sub in m.modules())


def test_zero_grad_clears_every_gradient():
    m = nn.MLP(2, [3, 1])
    m(pg.randn(4, 2)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_state_dict_roundtrip_and_snapshot_semantics():
    pg.manual_seed(0)
    a = nn.MLP(3, [4, 2])
    pg.manual_seed(1)
    b = nn.MLP(3, [4, 2])
    sd = a.state_dict()
    before = {k: v.numpy().copy() for k, v in sd.items()}
    b.load_state_dict(sd)
    for (k, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=k)
    # an optimizer step replaces storage: the earlier state dict keeps its values
    a(pg.randn(2, 3)).sum().backward()
    optim.SGD(a.parameters(), lr=0.5).step()
    for k, v in sd.items():
        np.testing.assert_array_equal(v.numpy(), before[k])
    assert not np.array_equal(a.layers[0].weight.numpy(), before["layers.0.weight"])


def test_load_state_dict_errors_name_the_keys():
    m = nn.MLP(2, [3, 1])
    sd = m.state_dict()
    missing = dict(sd)
    del missing["layers.1.bias"]
    with pytest.raises(CheckpointError, match="layers.1.bias"):
        m.load_state_dict(missing)
    with pytest.raises(CheckpointError, match="extra"):
        m.load_state_dict({**sd, "extra": pg.zeros(1)})
    m.load_state_dict(missing, strict=False)  # non-strict: loads what is there
    with pytest.raises(ShapeError, match="layers.0.weight"):
        m.load_state_dict({**sd, "layers.0.weight": pg.zeros(3, 3)})
    with pytest.raises(CheckpointError):
        m.load_state_dict([1, 2, 3])


def test_load_state_dict_converts_dtype_and_accepts_arrays():
    m = nn.Linear(2, 2, dtype=pg.float32)
    m.load_state_dict({"weight": np.eye(2, dtype=np.float64), "bias": [1, 2]})
    assert m.weight.dtype == pg.float32
    np.testing.assert_array_equal(m.weight.numpy(), np.eye(2))
    np.testing.assert_array_equal(m.bias.numpy(), [1.0, 2.0])


# ---------------------------------------------------------------------------------------------
# Linear / MLP / init
# ---------------------------------------------------------------------------------------------

def test_linear_matches_numpy_and_checks_shapes():
    lin = nn.Linear(3, 2, dtype=pg.float64)
    x = np.random.default_rng(0).normal(size=(5, 3))
    want = x @ lin.weight.numpy() + lin.bias.numpy()
    np.testing.assert_allclose(lin(pg.tensor(x)).numpy(), want, rtol=1e-12)
    with pytest.raises(ShapeError, match=r"Linear\(3 -> 2\)"):
        lin(pg.zeros(5, 4, dtype=pg.float64))
    assert nn.Linear(3, 2, bias=False).bias is None


def test_inits_have_the_documented_ranges_and_are_seeded():
    pg.manual_seed(7)
    mg = nn.Linear(50, 40, init="micrograd")
    w = mg.weight.numpy()
    assert w.min() >= -1 and w.max() <= 1 and w.std() > 0.5  # U(-1, 1): std ~0.577
    np.testing.assert_array_equal(mg.bias.numpy(), 0)
    gl = nn.Linear(50, 40, init="glorot").weight.numpy()
    bound = math.sqrt(6 / 90)
    assert np.abs(gl).max() <= bound and np.abs(gl).max() > 0.9 * bound
    pg.manual_seed(7)
    np.testing.assert_array_equal(nn.Linear(50, 40, init="micrograd").weight.numpy(), w)
    custom = nn.Linear(2, 2, init=lambda shape: np.full(shape, 0.25))
    np.testing.assert_array_equal(custom.weight.numpy(), 0.25)
    with pytest.raises(ValueError, match="unknown init"):
        nn.Linear(2, 2, init="nope")
    with pytest.raises(ShapeError):
        nn.Linear(2, 2, init=lambda shape: np.zeros((3, 3)))


def test_mlp_has_micrograds_structure():
    pg.manual_seed(0)  # the weights (and so the sign check below) must not depend on earlier tests
    m = nn.MLP(2, [16, 16, 1], init="micrograd")
    assert [(l.in_features, l.out_features) for l in m.layers] == [(2, 16), (16, 16), (16, 1)]
    assert m.num_parameters() == 2 * 16 + 16 + 16 * 16 + 16 + 16 + 1  # micrograd's 337
    assert m(pg.randn(7, 2)).shape == (7, 1)
    assert m([0.5, -1.0]).shape == (1,)          # one sample given as a list, like micrograd
    # the last layer is linear: outputs go negative (a ReLU output could not)
    out = m(pg.randn(200, 2) * 3)
    assert out.numpy().min() < 0


def test_mlp_gradients_match_central_differences():
    pg.manual_seed(3)
    model = nn.MLP(3, [4, 4, 1], activation="tanh", dtype=pg.float64)
    x = np.random.default_rng(1).normal(size=(6, 3))
    y = np.sign(np.random.default_rng(2).normal(size=6))
    set_params = _setter(model)

    def loss(*params):
        set_params(params)
        return nn.max_margin(model(pg.tensor(x)), y, margin=3.0) + 1e-2 * nn.l2_penalty(params)

    check_grads(loss, [p.numpy() for p in model.parameters()])


def test_mlp_agrees_across_backends():
    pg.manual_seed(4)
    model = nn.MLP(2, [3, 1], dtype=pg.float64)
    params = [p.numpy() for p in model.parameters()]
    x = np.random.default_rng(5).normal(size=(4, 2))
    set_params = _setter(model)

    def fwd(x_t, *ps):
        set_params(ps)
        return model(x_t).tanh().sum()

    assert_backends_agree(fwd, [x] + params, backends=["scalar", "numpy"], rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------

def test_dropout_is_identity_in_eval_and_scales_in_train():
    d = nn.Dropout(0.25)
    x = pg.ones(200, 50)
    d.eval()
    assert d(x) is x
    d.train()
    pg.manual_seed(0)
    out = d(x).numpy()
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(out[kept], 1 / 0.75)
    assert nn.Dropout(0.0)(x) is x
    np.testing.assert_array_equal(nn.dropout(x, 1.0).numpy(), 0)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_dropout_is_seeded_and_gradient_flows_through_kept_entries_only():
    x = pg.ones(10, 10, dtype=pg.float64, requires_grad=True)
    pg.manual_seed(5)
    y = nn.dropout(x, 0.5)
    pg.manual_seed(5)
    np.testing.assert_array_equal(nn.dropout(x, 0.5).numpy(), y.numpy())
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), y.numpy())  # d(x*mask)/dx = mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1e-6, 1 - 1e-6])
def test_dropout_rate_is_honoured_to_one_part_in_65536(p):
    from polygrad.nn.layers import DROPOUT_LEVELS
    pg.manual_seed(11)
    n = 400_000
    kept = nn.dropout(pg.ones(n), p).numpy() != 0
    effective = min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1) / DROPOUT_LEVELS
    assert abs(effective - p) <= 1 / DROPOUT_LEVELS
    sigma = max((effective * (1 - effective) / n) ** 0.5, 1e-9)
    assert abs((1 - kept.mean()) - effective) < 6 * sigma + 1e-12


@pytest.mark.parametrize("shape", [(1,), (3,), (5, 3), (4, 0), (2, 3, 7)])
def test_dropout_draws_any_shape_and_reproduces_from_the_seed(shape):
    x = pg.ones(*shape, dtype=pg.float64)
    pg.manual_seed(3)
    a = nn.dropout(x, 0.5).numpy()
    pg.manual_seed(3)
    b = nn.dropout(x, 0.5).numpy()
    assert a.shape == shape and a.dtype == np.float64 and set(np.unique(a)) <= {0.0, 2.0}
    np.testing.assert_array_equal(a, b)


def test_dropout_on_sparse_keeps_the_pattern():
    dense = np.zeros((20, 30), dtype=np.float32)
    dense[::2, ::3] = 1.0
    sp = pg.tensor(dense, layout="csr")
    pg.manual_seed(1)
    out = nn.dropout(sp, 0.5)
    assert out.layout == sp.layout and out.nnz == sp.nnz
    vals = out.values.numpy()
    assert set(np.unique(vals)) <= {0.0, 2.0} and 0 < (vals == 0).mean() < 1


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------

def test_max_margin_values_and_shapes():
    scores = pg.tensor([[2.0], [-0.5], [0.3]], dtype=pg.float64)
    y = [1, 1, -1]
    # relu(1 - y*s): 0, 1.5, 1.3
    np.testing.assert_allclose(nn.max_margin(scores, y).item(), (0 + 1.5 + 1.3) / 3)
    np.testing.assert_allclose(nn.max_margin(scores, y, reduction="sum").item(), 2.8)
    assert nn.max_margin(scores, y, reduction="none").shape == (3, 1)
    with pytest.raises(ShapeError):
        nn.max_margin(scores, [1, -1])
    with pytest.raises(ValueError):
        nn.max_margin(scores, y, reduction="median")


def test_mse_refuses_silent_broadcasting():
    p = pg.tensor([[1.0], [2.0]])
    with pytest.raises(ShapeError, match="broadcasting"):
        nn.mse(p, [1.0, 2.0])
    np.testing.assert_allclose(nn.mse(p, [[0.0], [0.0]]).item(), 2.5)


def test_cross_entropy_mask_forms_agree_and_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 3))
    y = np.array([0, 2, 1, 1, 0, 2])
    mask = np.array([True, False, True, False, True, True])
    t = pg.tensor(logits)
    a = nn.cross_entropy(t, y, mask=mask).item()
    b = nn.cross_entropy(t, y, mask=np.flatnonzero(mask)).item()
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    want = -lp[np.flatnonzero(mask), y[mask]].mean()
    np.testing.assert_allclose([a, b], [want, want], rtol=1e-12)


def test_accuracy_by_argmax_and_by_sign():
    assert nn.accuracy(np.array([[0.1, 0.9], [2.0, 1.0]]), np.array([1, 1])) == 0.5
    assert nn.accuracy(np.array([[0.5], [-0.5]]), np.array([1, -1])) == 1.0
    assert nn.accuracy(np.array([0.5, -0.5]), np.array([1, 0])) == 1.0
    assert nn.accuracy(np.array([[0.1, 0.9], [2.0, 1.0]]), np.array([1, 1]), mask=np.array([False, True])) == 0.0


# ---------------------------------------------------------------------------------------------
# GCNConv
# ---------------------------------------------------------------------------------------------

def _small_graph():
    edge_index = np.array([[0, 1, 1, 2, 2, 3, 3, 4], [1, 0, 2, 1, 3, 2, 4, 3]])
    x = np.random.default_rng(0).normal(size=(5, 3))
    return edge_index, x


def test_gcnconv_matches_the_numpy_reference():
    edge_index, x = _small_graph()
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    conv.bias = pg.tensor([0.1, -0.2], dtype=pg.float64, requires_grad=True)
    out = conv(pg.tensor(x), edge_index).numpy()
    a_hat = normalized_adjacency(edge_index, 5).to_dense()
    want = a_hat @ (x @ conv.weight.numpy()) + conv.bias.numpy()
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


def test_gcnconv_gradients_match_central_differences():
    edge_index, x = _small_graph()
    conv = nn.GCNConv(3, 2, dtype=pg.float64)

    def fwd(x_t, w, b):
        conv.weight, conv.bias = w, b
        return conv(x_t, edge_index).tanh()

    check_grads(fwd, [x, conv.weight.numpy(), np.array([0.1, -0.3])])


def test_gcnconv_caches_per_graph_object():
    edge_index, x = _small_graph()
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    a1 = conv.adjacency(edge_index, 5)
    assert conv.adjacency(edge_index, 5) is a1          # cached
    other = edge_index[:, :4].copy()
    a2 = conv.adjacency(other, 5)                      # another graph: recomputed, not stale
    assert a2 is not a1 and a2.nnz != a1.nnz
    nocache = nn.GCNConv(3, 2, cached=False)
    assert nocache.adjacency(edge_index, 5) is not nocache.adjacency(edge_index, 5)
    with pytest.raises(ShapeError):
        conv(pg.tensor(x), np.array([[0, 9], [9, 0]]))
    with pytest.raises(ShapeError):
        conv(pg.tensor(x), np.array([0, 1, 2]))


def test_gcnconv_sparse_features_equal_dense_features():
    ds = stochastic_block_model(num_nodes=80, num_classes=2, num_features=12, num_train_per_class=5, seed=3)
    dense = ds.x.to_dense(np.float64)
    conv = nn.GCNConv(12, 4, dtype=pg.float64)
    a = conv(pg.tensor(dense), ds.edge_index).numpy()
    b = conv(nn.csr_to_tensor(ds.x, dtype=np.float64), ds.edge_index).numpy()
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_gcn_learns_the_synthetic_graph():
    from polygrad.apps.demos import load_graph, train_gcn
    ds = load_graph(None)
    res = train_gcn(ds, seed=0, epochs=100)
    assert res["test_accuracy"] > 0.6  # chance is 0.25; features alone reach ~0.27


def test_sparse_parameters_live_in_state_dicts_and_snapshots(tmp_path):
    from polygrad.apps.train import fit

    class EdgeWeights(nn.Module):
        def __init__(self):
            self.adj = pg.sparse_coo(np.array([[0, 1, 2], [1, 2, 0]]), np.array([1.0, 2.0, 3.0]), (3, 3),
                                     dtype=pg.float64, requires_grad=True)

        def loss(self):
            return ((self.adj @ pg.ones(3, 1, dtype=pg.float64)) ** 2).sum()

    m = EdgeWeights()
    assert [n for n, _ in m.named_parameters()] == ["adj"]
    pg.save(m.state_dict(), tmp_path / "sp.npz")
    hist = fit(m, optim.SGD(m.parameters(), lr=0.1), m.loss, 3)
    assert hist.losses[-1] < hist.losses[0]
    m.load_state_dict(pg.load(tmp_path / "sp.npz"))
    np.testing.assert_array_equal(m.adj.values.numpy(), [1.0, 2.0, 3.0])
    with pytest.raises(ShapeError, match="same pattern"):
        m.load_state_dict({"adj": pg.tensor(np.eye(3))})


def test_gcnconv_accepts_a_sparse_adjacency_like_an_edge_index():
    edge_index, x = _small_graph()
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    adj = pg.from_edge_index(edge_index, num_nodes=5, dtype=pg.float64)
    a = conv(pg.tensor(x), edge_index).numpy()
    b = nn.GCNConv(3, 2, dtype=pg.float64)
    b.weight, b.bias = conv.weight, conv.bias
    np.testing.assert_allclose(b(pg.tensor(x), adj).numpy(), a, rtol=1e-12)
    prenorm = nn.GCNConv(3, 2, normalize=False, dtype=pg.float64)
    prenorm.weight, prenorm.bias = conv.weight, conv.bias
    np.testing.assert_allclose(prenorm(pg.tensor(x), pg.gcn_norm(adj)).numpy(), a, rtol=1e-12)
    with pytest.raises(ShapeError):
        b(pg.tensor(x[:4]), adj)


def test_gcnconv_agrees_across_backends():
    edge_index, x = _small_graph()
    conv = nn.GCNConv(3, 2, dtype=pg.float64)
    w = conv.weight.numpy()

    def fwd(x_t, w_t):
        layer = nn.GCNConv(3, 2, bias=False, dtype=pg.float64, backend=x_t.backend)
        layer.weight = w_t
        return layer(x_t, edge_index).relu().sum()

    assert_backends_agree(fwd, [x, w], backends=["scalar", "numpy"], rtol=1e-9, atol=1e-12)
