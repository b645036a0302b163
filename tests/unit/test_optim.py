"""polygrad.optim: SGD and Adam against independent numpy implementations of their update rules,
on the fast (numpy arrays) and generic (polygrad ops, scalar backend) paths; groups, schedules,
validation, state dicts, no in-place writes, sparse parameters."""
from __future__ import annotations


import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.errors import CheckpointError, DTypeError



def _grads(step: int, shape) -> np.ndarray:
    return np.random.default_rng(100 + step).normal(size=shape)


def _run(opt_factory, backend: str, steps: int = 5):
    """Run an optimizer on one parameter with prescribed gradients; return the trajectory."""
    p0 = np.random.default_rng(0).normal(size=(3, 2))
    p = pg.tensor(p0, dtype=pg.float64, requires_grad=True, backend=backend)
    opt = opt_factory([p])
    traj = []
    for k in range(steps):
        p.grad = pg.tensor(_grads(k, p0.shape), dtype=pg.float64, backend=backend)
        opt.step()
        traj.append(p.numpy().copy())
    return p0, traj


def _sgd_reference(p0, steps, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, schedule=None):
    p, buf, out = p0.copy(), None, []
    for k in range(steps):
        g = _grads(k, p0.shape) + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * (schedule(k) if schedule else 1.0) * g
        out.append(p.copy())
    return out


def _adam_reference(p0, steps, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False):
    p, m, v, out = p0.copy(), np.zeros_like(p0), np.zeros_like(p0), []
    for t in range(1, steps + 1):
        g = _grads(t - 1, p0.shape)
        if wd and not decoupled:
            g = g + wd * p
        if wd and decoupled:
            p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * mhat / (np.sqrt(vhat) + eps)
        out.append(p.copy())
    return out


BACKENDS = ["numpy", "scalar"]  # numpy: raw-array fast path; scalar: polygrad ops under no_grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.1),
                                dict(momentum=0.5, nesterov=True), dict(weight_decay=0.1, momentum=0.3)])
def test_sgd_matches_reference(backend, kw):
    p0, traj = _run(lambda ps: optim.SGD(ps, lr=0.1, **kw), backend)
    want = _sgd_reference(p0, 5, 0.1, kw.get("momentum", 0.0), kw.get("dampening", 0.0),
                          kw.get("weight_decay", 0.0), kw.get("nesterov", False))
    np.testing.assert_allclose(traj, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.05), dict(weight_decay=0.05, decoupled=True),
                                dict(betas=(0.5, 0.9), eps=1e-3)])
def test_adam_matches_reference(backend, kw):
    p0, traj = _run(lambda ps: optim.Adam(ps, lr=0.01, **kw), backend)
    b1, b2 = kw.get("betas", (0.9, 0.999))
    want = _adam_reference(p0, 5, 0.01, b1, b2, kw.get("eps", 1e-8), kw.get("weight_decay", 0.0),
                           kw.get("decoupled", False))
    np.testing.assert_allclose(traj, want, rtol=1e-10, atol=1e-13)


def test_adamw_is_adam_with_decoupled_decay():
    p0, a = _run(lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1), "numpy")
    _, b = _run(lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1, decoupled=True), "numpy")
    np.testing.assert_array_equal(a, b)


def test_float32_parameters_stay_float32():
    p = pg.tensor(np.ones(4, dtype=np.float32), requires_grad=True)
    opt = optim.Adam([p], lr=0.1)
    p.grad = pg.tensor(np.ones(4, dtype=np.float32))
    opt.step()
    assert p.dtype == pg.float32 and p.numpy().dtype == np.float32


def test_lr_schedule_is_a_multiplier_of_the_step():
    sched = lambda k: 1.0 - 0.9 * k / 100  # micrograd's
    p0, traj = _run(lambda ps: optim.SGD(ps, lr=1.0, lr_schedule=sched), "numpy", steps=4)
    np.testing.assert_allclose(traj, _sgd_reference(p0, 4, 1.0, schedule=sched), rtol=1e-12)
    p = pg.zeros(1, requires_grad=True)
    opt = optim.SGD([p], lr=0.5, lr_schedule=lambda k: 2.0 ** -k)
    assert opt.current_lr() == 0.5
    p.grad = pg.ones(1)
    opt.step()
    assert opt.current_lr() == 0.25
    bad = optim.SGD([p], lr=0.5, lr_schedule=lambda k: -1.0)
    with pytest.raises(ValueError, match="lr_schedule"):
        bad.step()
    with pytest.raises(TypeError):
        optim.SGD([p], lr_schedule=0.5)


def test_param_groups_apply_weight_decay_to_the_first_layer_only():
    pg.manual_seed(0)
    gcn_like = nn.MLP(3, [4, 2])
    first, second = gcn_like.layers
    opt = optim.SGD([{"params": first.parameters(), "weight_decay": 0.5},
                     {"params": second.parameters()}], lr=0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    before = [p.numpy().copy() for p in gcn_like.parameters()]
    for p in gcn_like.parameters():
        p.grad = pg.zeros_like(p)  # zero loss gradient: only weight decay moves anything
    opt.step()
    after = [p.numpy() for p in gcn_like.parameters()]
    np.testing.assert_allclose(after[0], before[0] * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(after[2], before[2])
    np.testing.assert_array_equal(after[3], before[3])


def test_parameters_without_gradient_are_left_alone_and_zero_grad_clears():
    a = pg.ones(2, requires_grad=True)
    b = pg.ones(2, requires_grad=True)
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = pg.ones(2)
    opt.step()
    np.testing.assert_array_equal(b.numpy(), [1, 1])
    assert not np.allclose(a.numpy(), 1)
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_invalid_construction_is_refused_clearly():
    p = pg.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    with pytest.raises(ValueError, match="more than one group"):
        optim.SGD([p, p])
    with pytest.raises(ValueError, match="requires_grad"):
        optim.SGD([pg.ones(2)])
    with pytest.raises(ValueError, match="requires_grad"):
        optim.SGD([p * 2])                          # not a leaf
    with pytest.raises(DTypeError):
        optim.SGD([pg.tensor([1, 2])])
    with pytest.raises(TypeError):
        optim.SGD([np.ones(2)])
    with pytest.raises(ValueError, match="lr"):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError, match="weight_decay"):
        optim.Adam([p], weight_decay=float("nan"))
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="eps"):
        optim.Adam([p], eps=0)
    with pytest.raises(ValueError, match="unknown hyper-parameters"):
        optim.SGD([{"params": [p], "betas": (0.9, 0.9)}])
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], nesterov=True)


def test_modules_can_be_passed_directly():
    m = nn.Linear(2, 2)
    assert len(optim.SGD(m, lr=0.1).param_groups[0]["params"]) == 2


def test_updates_never_write_into_existing_storage():
    user = np.array([1.0, 2.0])
    p = pg.tensor(user, requires_grad=True)     # may share memory with `user`
    lin = nn.Linear(2, 1)
    snap = lin.state_dict()
    snap_w = snap["weight"].numpy().copy()
    opt = optim.SGD([p, *lin.parameters()], lr=0.1, momentum=0.9)
    for _ in range(2):
        p.grad = pg.ones(2, dtype=p.dtype)
        for q in lin.parameters():
            q.grad = pg.ones_like(q)
        opt.step()
    np.testing.assert_array_equal(user, [1.0, 2.0])
    np.testing.assert_array_equal(snap["weight"].numpy(), snap_w)


def test_state_dict_resume_reproduces_the_uninterrupted_run(tmp_path):
    def make():
        pg.manual_seed(3)
        model = nn.MLP(2, [3, 1], dtype=pg.float64)
        return model, optim.Adam([{"params": model.layers[0].parameters(), "weight_decay": 1e-2},
                                  {"params": model.layers[1].parameters()}], lr=0.05)

    x = pg.tensor(np.random.default_rng(1).normal(size=(8, 2)))

    def step(model, opt):
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()

    full_model, full_opt = make()
    for _ in range(6):
        step(full_model, full_opt)

    model, opt = make()
    for _ in range(3):
        step(model, opt)
    pg.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.npz")
    restored = pg.load(tmp_path / "ck.npz")
    model2, opt2 = make()
    model2.load_state_dict(restored["model"])
    opt2.load_state_dict(restored["opt"])
    assert opt2.step_count == 3
    for _ in range(3):
        step(model2, opt2)
    for p, q in zip(full_model.parameters(), model2.parameters()):
        np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-12)


def test_load_state_dict_rejects_mismatches():
    p = pg.ones(2, requires_grad=True)
    q = pg.ones(3, requires_grad=True)
    a = optim.Adam([p])
    p.grad = pg.ones(2)
    a.step()
    with pytest.raises(CheckpointError, match="parameters per group"):
        optim.Adam([p, q]).load_state_dict(a.state_dict())
    with pytest.raises(CheckpointError, match="shape"):
        optim.Adam([q]).load_state_dict(a.state_dict())
    with pytest.raises(CheckpointError, match="from a Adam"):
        optim.SGD([p]).load_state_dict(a.state_dict())
    with pytest.raises(CheckpointError):
        optim.Adam([p]).load_state_dict({"nonsense": 1})


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: optim.Adam(ps, lr=0.1)])
def test_optimizers_minimise_a_quadratic(make):
    target = np.array([3.0, -2.0])
    p = pg.zeros(2, dtype=pg.float64, requires_grad=True)
    opt = make([p])
    for _ in range(300):
        opt.zero_grad()
        ((p - pg.tensor(target)) ** 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(p.numpy(), target, atol=1e-2)


def test_sparse_parameter_updates_values_and_keeps_pattern():
    w = pg.sparse_coo(np.array([[0, 1, 2], [1, 2, 0]]), np.array([0.5, -1.0, 2.0]), (3, 3),
                      dtype=pg.float64, requires_grad=True)
    pattern = w.pattern
    x = pg.tensor(np.arange(6.0).reshape(3, 2))
    opt = optim.SGD([w], lr=0.1)
    (w @ x).sum().backward()
    g = w.grad.values.numpy().copy()
    before = w.values.numpy().copy()
    opt.step()
    assert w.pattern is pattern
    np.testing.assert_allclose(w.values.numpy(), before - 0.1 * g)
    # a clipped sparse gradient keeps its pattern too
    opt.zero_grad()
    (w @ x).sum().backward()
    norm = nn.clip_grad_norm_([w], max_norm=1e-3)
    assert norm > 1e-3 and w.grad.nnz == 3
    np.testing.assert_allclose(np.linalg.norm(w.grad.values.numpy()), 1e-3, rtol=1e-4)
