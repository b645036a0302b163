"""PyTorch's names where polygrad means the same thing: dim=/keepdim=, Module.to, lr_scheduler."""
from __future__ import annotations

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((24, 4))
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5)
    return pg.tensor(X, dtype="float64"), pg.tensor(y)


def _train(first_backend: str, then_backend: str, X, y):
    pg.manual_seed(0)
    # ---- PyTorch-style code, unchanged: dim=, keepdim=, .to(), a scheduler ----------------------
    model = nn.Sequential(nn.Linear(4, 8, dtype="float64"), nn.ReLU(), nn.Linear(8, 3, dtype="float64"))
    model = model.to(first_backend)
    opt = optim.Adam(model.parameters(), lr=0.05)
    sched = optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    for epoch in range(12):
        if epoch == 6:
            model.to(then_backend)                       # mid-training: Adam's state follows
            X, y = X.to(then_backend), y.to(then_backend)
        opt.zero_grad()
        logits = model(X)
        loss = -logits.log_softmax(dim=-1)[pg.arange(X.size(0)), y].mean()
        loss.backward()
        opt.step()
        sched.step()
    probs = logits.softmax(dim=1)
    assert np.allclose(probs.sum(dim=1, keepdim=True).numpy(), 1.0)
    pred = logits.argmax(dim=1)
    acc = (pred == y).float().mean(dim=0).item()
    both = pg.cat([probs, probs], dim=0).max(dim=0, keepdim=True)
    # ----------------------------------------------------------------------------------------------
    assert both.shape == (1, 3) and sched.get_last_lr() == [0.05 * 0.5 ** 2]
    return loss.item(), acc, [p.numpy() for p in model.parameters()], model


def test_pytorch_style_training_loop_runs_unchanged_and_moving_backends_changes_nothing():
    X, y = _data()
    loss_np, acc_np, params_np, _ = _train("numpy", "numpy", X, y)
    loss_sc, acc_sc, params_sc, model = _train("numpy", "scalar", X, y)
    assert all(p.backend == "scalar" for p in model.parameters())
    assert loss_sc == pytest.approx(loss_np, rel=1e-9) and acc_sc == acc_np
    for a, b in zip(params_np, params_sc):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert acc_np > 0.7


@pytest.mark.parametrize("call, same_as", [
    (lambda x: x.sum(dim=0), lambda x: x.sum(axis=0)),
    (lambda x: x.sum(dim=(0, 1), keepdim=True), lambda x: x.sum(axis=(0, 1), keepdims=True)),
    (lambda x: x.mean(dim=-1, keepdim=True), lambda x: x.mean(axis=-1, keepdims=True)),
    (lambda x: x.max(dim=1), lambda x: x.max(axis=1)),
    (lambda x: x.min(dim=0, keepdim=True), lambda x: x.min(axis=0, keepdims=True)),
    (lambda x: x.argmax(dim=1, keepdim=True), lambda x: x.argmax(axis=1, keepdims=True)),
    (lambda x: pg.argmin(x, dim=0), lambda x: x.argmin(axis=0)),
    (lambda x: x.logsumexp(dim=1), lambda x: x.logsumexp(axis=1)),
    (lambda x: pg.softmax(x, dim=0), lambda x: x.softmax(axis=0)),
    (lambda x: x.log_softmax(dim=0), lambda x: pg.log_softmax(x, axis=0)),
    (lambda x: pg.cat([x, x], dim=1), lambda x: pg.concat([x, x], axis=1)),
    (lambda x: pg.stack([x, x], dim=-1), lambda x: pg.stack([x, x], axis=-1)),
    (lambda x: pg.sum(x, dim=1, keepdim=True), lambda x: pg.sum(x, 1, True)),
    (lambda x: pg.to_sparse(x).sum(dim=0), lambda x: x.sum(0)),
])
def test_dim_and_keepdim_mean_axis_and_keepdims(call, same_as):
    x = pg.tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
    a, b = call(x), same_as(x)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("call", [
    lambda x: x.sum(0, dim=1), lambda x: pg.sum(x, axis=0, dim=1), lambda x: x.mean(dim=0, axis=0),
    lambda x: x.sum(dim=0, keepdim=True, keepdims=True), lambda x: pg.cat([x], 0, dim=0),
    lambda x: x.argmax(dim=0, axis=0), lambda x: x.softmax(0, dim=0),
])
def test_both_spellings_of_one_argument_is_a_type_error_naming_the_function(call):
    x = pg.tensor([[1.0, 2.0]])
    with pytest.raises(TypeError, match=r"\(\) got both (dim|keepdim)= .* and (axis|keepdims)="):
        call(x)


def test_argmin_argmax_edge_cases():
    x = pg.tensor([[3.0, 1.0, 1.0], [0.0, 0.0, 5.0]])
    assert x.argmin(dim=1).tolist() == [1, 0]      # ties: the first index (numpy and PyTorch)
    assert x.argmax().item() == 5 and x.argmin().item() == 3
    assert pg.argmin(pg.tensor(2.0)).item() == 0
    with pytest.raises(pg.errors.ShapeError, match="argmin"):
        pg.zeros(2, 0).argmin(dim=1)
    with pytest.raises(pg.errors.ShapeError, match="argmin: dim 2 is out of range"):
        x.argmin(dim=2)


def test_module_to_moves_parameters_in_place_with_their_gradients():
    model = nn.Linear(3, 2)
    w = model.weight
    (model(pg.ones(1, 3)).sum()).backward()
    assert model.to("scalar") is model
    assert model.weight is w and w.backend == "scalar" and w.grad.backend == "scalar"
    assert model.bias.backend == "scalar"
    model.to("scalar")  # already there: nothing moves
    assert model.weight is w


def test_module_to_moves_buffers_and_nested_lists_and_keeps_shared_weights_shared():
    m = nn.Module()
    shared = pg.randn(2, requires_grad=True)
    m.a, m.b = shared, [shared, pg.ones(2)]          # a parameter twice, and a buffer in a list
    m.stats = {"count": pg.zeros(1)}
    m.child = nn.Linear(2, 2)
    m.to("scalar")
    assert m.a is m.b[0] is shared and shared.backend == "scalar"
    assert m.b[1].backend == "scalar" and m.stats["count"].backend == "scalar"
    assert all(p.backend == "scalar" for p in m.parameters())


def test_module_to_moves_gcn_cached_adjacency_and_keeps_using_it():
    edge_index = np.array([[0, 1, 1, 2], [1, 0, 2, 1]])
    conv = nn.GCNConv(4, 2, dtype="float64")
    x = pg.randn(3, 4, dtype="float64")
    before = conv(x, edge_index).numpy()
    cache = conv._cache
    conv.to("scalar")
    assert conv._cache is not cache and conv._cache.backend == "scalar" and cache.backend == "numpy"
    moved_cache = conv._cache
    after = conv(x.to("scalar"), edge_index)
    assert conv._cache is moved_cache  # reused, not rebuilt
    np.testing.assert_allclose(after.numpy(), before, rtol=1e-12)


def test_module_to_leaves_a_users_sparse_adjacency_where_it_is():
    A = pg.from_edge_index([[0, 1], [1, 0]], num_nodes=2, dtype="float64")
    conv = nn.GCNConv(2, 2, normalize=False, dtype="float64")
    conv(pg.ones(2, 2, dtype="float64"), A)
    conv.to("scalar")
    assert A.backend == "numpy"  # the cache held the user's tensor: it got a copy


def test_module_to_unknown_backend_is_a_clear_error():
    with pytest.raises(pg.errors.BackendUnavailableError, match="unknown backend 'nope'"):
        nn.Linear(2, 2).to("nope")


def test_sparse_parameter_moves_in_place():
    A = pg.from_edge_index([[0, 1], [1, 0]], num_nodes=2, dtype="float64").requires_grad_()
    m = nn.Module()
    m.adj = A
    m.to("scalar")
    assert m.adj is A and A.backend == "scalar" and A.values.backend == "scalar"
    (A @ pg.ones(2, 1, dtype="float64", backend="scalar")).sum().backward()
    assert A.grad.backend == "scalar"


def test_optimizer_state_follows_parameters_both_ways():
    for opt_cls in (lambda p: optim.Adam(p, lr=0.1), lambda p: optim.SGD(p, lr=0.1, momentum=0.9)):
        model = nn.Linear(2, 1, dtype="float64")
        opt = opt_cls(model.parameters())
        for backend in ("numpy", "scalar", "numpy"):
            model.to(backend)
            opt.zero_grad()
            model(pg.ones(3, 2, dtype="float64", backend=backend)).sum().backward()
            opt.step()
            for p in model.parameters():
                assert p.backend == backend
        state = opt.state_dict()
        assert state["state"]


def test_tensor_to_docstring_says_it_differs_from_pytorch():
    assert "Differs from PyTorch on purpose" in pg.Tensor.to.__doc__
    assert "values only" in pg.max.__doc__
