"""polygrad.optim.lr_scheduler against PyTorch: the same rates, to the last bit.

RECORDED holds what torch 2.13's schedulers return for the same optimizer (two parameter groups,
lr 0.1 and 0.05) and the same calls; when torch is installed the same runs are also compared
with it live.
"""
from __future__ import annotations

import importlib.util
import math

import pytest

import polygrad as pg
from polygrad import optim
from polygrad.optim import lr_scheduler as S

HAVE_TORCH = importlib.util.find_spec("torch") is not None
METRICS = [1.0, 0.9, 0.95, 0.91, 0.92, 0.93, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.96, 0.97]

CASES = {  # name -> (build(scheduler module, optimizer), epochs, metrics)
    "step": (lambda S, o: S.StepLR(o, step_size=3, gamma=0.5), 10, None),
    "cosine": (lambda S, o: S.CosineAnnealingLR(o, T_max=5, eta_min=0.001), 13, None),
    "lambda": (lambda S, o: S.LambdaLR(o, lambda e: 0.95 ** e), 6, None),
    "lambda_per_group": (lambda S, o: S.LambdaLR(o, [lambda e: 1.0 / (e + 1), lambda e: 0.5 ** e]), 6, None),
    "plateau_min": (lambda S, o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, cooldown=1, min_lr=0.02),
                    len(METRICS), METRICS),
    "plateau_max_abs": (lambda S, o: S.ReduceLROnPlateau(o, mode="max", factor=0.3, patience=1, threshold=0.05,
                                                         threshold_mode="abs", min_lr=[0.0, 0.01]),
                        len(METRICS), METRICS),
}

RECORDED = {  # generated with torch 2.13.0 by running CASES on torch.optim.SGD
    'step': [[0.1, 0.05], [0.1, 0.05], [0.1, 0.05], [0.05, 0.025], [0.05, 0.025], [0.05, 0.025], [0.025, 0.0125], [0.025, 0.0125], [0.025, 0.0125], [0.0125, 0.00625], [0.0125, 0.00625]],  # noqa: E501 - recorded data
    'cosine': [[0.1, 0.05], [0.0905463412215599, 0.045320916362186214], [0.06579634122155989, 0.03307091636218621], [0.035203658778440096, 0.017929083637813786], [0.010453658778440105, 0.005679083637813789], [0.001, 0.001], [0.010453658778440102, 0.005679083637813788], [0.03520365877844012, 0.017929083637813797], [0.06579634122155993, 0.03307091636218623], [0.09054634122155995, 0.04532091636218624], [0.10000000000000005, 0.05000000000000003], [0.09054634122155998, 0.045320916362186256], [0.06579634122155995, 0.03307091636218624], [0.03520365877844014, 0.017929083637813807]],  # noqa: E501 - recorded data
    'lambda': [[0.1, 0.05], [0.095, 0.0475], [0.09025, 0.045125], [0.0857375, 0.04286875], [0.081450625, 0.0407253125], [0.07737809374999999, 0.038689046874999994], [0.07350918906249998, 0.03675459453124999]],  # noqa: E501 - recorded data
    'lambda_per_group': [[0.1, 0.05], [0.05, 0.025], [0.03333333333333333, 0.0125], [0.025, 0.00625], [0.020000000000000004, 0.003125], [0.016666666666666666, 0.0015625], [0.014285714285714285, 0.00078125]],  # noqa: E501 - recorded data
    'plateau_min': [[0.1, 0.05], [0.1, 0.05], [0.1, 0.05], [0.1, 0.05], [0.1, 0.05], [0.05, 0.025], [0.05, 0.025], [0.05, 0.025], [0.05, 0.025], [0.05, 0.025], [0.025, 0.02], [0.025, 0.02], [0.025, 0.02], [0.025, 0.02], [0.02, 0.02]],  # noqa: E501 - recorded data
    'plateau_max_abs': [[0.1, 0.05], [0.1, 0.05], [0.1, 0.05], [0.03, 0.015], [0.03, 0.015], [0.009, 0.01], [0.009, 0.01], [0.0026999999999999997, 0.01], [0.0026999999999999997, 0.01], [0.0008099999999999998, 0.01], [0.0008099999999999998, 0.01], [0.00024299999999999994, 0.01], [0.00024299999999999994, 0.01], [7.289999999999998e-05, 0.01], [7.289999999999998e-05, 0.01]],  # noqa: E501 - recorded data
}


def _rates(sched_module, make_optimizer, name):
    build, epochs, metrics = CASES[name]
    opt = make_optimizer()
    sched = build(sched_module, opt)
    out = [sched.get_last_lr()]
    for e in range(epochs):
        opt.step()
        sched.step(metrics[e]) if metrics else sched.step()
        out.append(sched.get_last_lr())
    return out, opt


def _polygrad_sgd():
    a = pg.zeros(2, requires_grad=True)
    b = pg.zeros(3, requires_grad=True)
    return optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.05}], lr=0.1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rates_match_pytorchs_recorded_rates_exactly(name):
    rates, opt = _rates(S, _polygrad_sgd, name)
    assert rates == RECORDED[name]
    assert [g["lr"] for g in opt.param_groups] == rates[-1]  # the scheduler writes the groups' rates


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_rates_match_installed_pytorch(name):
    import torch

    def torch_sgd():
        a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
        return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.05}], lr=0.1)

    theirs, _ = _rates(torch.optim.lr_scheduler, torch_sgd, name)
    ours, _ = _rates(S, _polygrad_sgd, name)
    assert ours == [[float(x) for x in row] for row in theirs]


def test_scheduled_rate_is_the_rate_the_update_uses():
    x = pg.tensor([1.0], dtype="float64", requires_grad=True)
    opt = optim.SGD([x], lr=1.0)
    sched = S.StepLR(opt, step_size=1, gamma=0.5)
    for expected_lr in (1.0, 0.5, 0.25):
        before = x.item()
        x.grad = pg.tensor([1.0], dtype="float64")
        opt.step()
        sched.step()
        assert before - x.item() == expected_lr


def test_chained_schedulers_compose_like_pytorch():
    opt = _polygrad_sgd()
    s1, s2 = S.StepLR(opt, step_size=2, gamma=0.5), S.LambdaLR(opt, lambda e: 1.0)  # LambdaLR resets to base
    s1.step()
    s1.step()
    assert s1.get_last_lr() == [0.05, 0.025]
    s2.step()
    assert s2.get_last_lr() == [0.1, 0.05]


def test_state_dict_round_trip_resumes_the_schedule():
    opt = _polygrad_sgd()
    sched = S.CosineAnnealingLR(opt, T_max=5)
    for _ in range(3):
        sched.step()
    saved = sched.state_dict()
    assert "optimizer" not in saved
    opt2 = _polygrad_sgd()
    resumed = S.CosineAnnealingLR(opt2, T_max=5)
    resumed.load_state_dict(saved)
    for g, lr in zip(opt2.param_groups, sched.get_last_lr()):
        g["lr"] = lr
    sched.step()
    resumed.step()
    assert resumed.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize("bad", [
    lambda o: S.StepLR(o, step_size=0), lambda o: S.StepLR(o, step_size=1.5),
    lambda o: S.CosineAnnealingLR(o, T_max=0), lambda o: S.ReduceLROnPlateau(o, factor=1.0),
    lambda o: S.ReduceLROnPlateau(o, mode="up"), lambda o: S.ReduceLROnPlateau(o, threshold_mode="x"),
    lambda o: S.ReduceLROnPlateau(o, min_lr=[0.1]), lambda o: S.LambdaLR(o, [lambda e: 1.0]),
])
def test_bad_arguments_are_value_errors(bad):
    with pytest.raises(ValueError):
        bad(_polygrad_sgd())


def test_not_an_optimizer_or_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match="Optimizer"):
        S.StepLR(object(), step_size=1)
    with pytest.raises(TypeError, match="callable"):
        S.LambdaLR(_polygrad_sgd(), 0.5)


def test_plateau_accepts_a_tensor_metric_and_nan_counts_as_no_improvement():
    opt = _polygrad_sgd()
    sched = S.ReduceLROnPlateau(opt, patience=0)
    sched.step(pg.tensor(1.0))
    sched.step(pg.tensor(math.nan))
    assert sched.get_last_lr() == [0.1 * 0.1, 0.05 * 0.1]


def _plateau_with_added_group(sched_module, opt_module, make_param, min_lr):
    p1, p2 = make_param(2), make_param(3)
    opt = opt_module.SGD([p1], lr=0.1)
    sched = sched_module.ReduceLROnPlateau(opt, factor=0.5, patience=0, min_lr=min_lr)
    rates = []
    for epoch in range(6):
        if epoch == 2:
            opt.add_param_group({"params": [p2], "lr": 0.08})
        sched.step(1.0)
        rates.append([g["lr"] for g in opt.param_groups])
    return rates


def test_plateau_after_add_param_group_gives_the_new_group_the_one_min_lr():
    """A group added after the scheduler was made gets the single ``min_lr`` (PyTorch's
    ``default_min_lr``): polygrad used to fail with an IndexError at the first reduction."""
    got = _plateau_with_added_group(S, optim, lambda n: pg.zeros(n, requires_grad=True), 0.02)
    assert got == [[0.1], [0.05], [0.025, 0.04], [0.02, 0.02], [0.02, 0.02], [0.02, 0.02]]  # torch 2.13
    if HAVE_TORCH:
        import torch
        want = _plateau_with_added_group(torch.optim.lr_scheduler, torch.optim,
                                         lambda n: torch.nn.Parameter(torch.zeros(n)), 0.02)
        assert got == want


def test_plateau_min_lr_list_that_no_longer_fits_the_groups_is_a_clear_error():
    """A per-group ``min_lr`` list cannot cover a group added later: the reduction raises (a
    RuntimeError, as PyTorch's) naming both counts; stepping without a reduction does not."""
    p1, p2 = pg.zeros(2, requires_grad=True), pg.zeros(3, requires_grad=True)
    opt = optim.SGD([p1], lr=0.1)
    sched = S.ReduceLROnPlateau(opt, factor=0.5, patience=0, min_lr=[0.02])
    opt.add_param_group({"params": [p2], "lr": 0.08})
    sched.step(1.0)  # an improvement: nothing to reduce
    with pytest.raises(RuntimeError, match=r"2 parameter groups but min_lr gave 1") as info:
        sched.step(1.0)
    assert isinstance(info.value, S.MinLrsMismatchError) and isinstance(info.value, ValueError)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.08]  # nothing changed
    sched.min_lrs = [0.02, 0.05]  # the fix the message names
    sched.step(1.0)
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.05]
