"""Class 4 (optimizer): load_state_dict validates what the constructor validates.

A crafted checkpoint (an lr of NaN, negative betas, a NaN moment, a bogus step count) must be
refused with CheckpointError and leave the optimizer exactly as it was.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import polygrad as pg
import polygrad.nn as nn
from polygrad.errors import CheckpointError
from polygrad.optim import SGD, Adam, AdamW


def _trained(opt_cls, **kw):
    pg.manual_seed(0)
    model = nn.Linear(3, 2, dtype="float64")
    opt = opt_cls(model.parameters(), **kw)
    model(pg.ones(4, 3, dtype="float64")).sum().backward()
    opt.step()
    return model, opt


def _mutate_group(sd, **changes):
    sd = copy.deepcopy(sd)
    sd["param_groups"][0].update(changes)
    return sd


BAD_GROUPS = [
    dict(lr=math.nan), dict(lr=math.inf), dict(lr=-1.0), dict(lr="0.1"), dict(lr=None),
    dict(weight_decay=math.nan), dict(weight_decay=-0.5),
    dict(betas=[0.9, 1.5]), dict(betas=[-0.1, 0.9]), dict(betas=[0.9]), dict(eps=0.0), dict(eps=math.nan),
    dict(decoupled="yes"), dict(unknown_knob=1.0),
]


@pytest.mark.parametrize("change", BAD_GROUPS, ids=lambda c: repr(c))
def test_adam_refuses_what_its_constructor_refuses(change):
    model, opt = _trained(Adam, lr=0.01)
    sd = opt.state_dict()
    before = copy.deepcopy(opt.param_groups[0]["lr"]), opt.step_count
    with pytest.raises(CheckpointError):
        opt.load_state_dict(_mutate_group(sd, **change))
    assert (opt.param_groups[0]["lr"], opt.step_count) == before
    key = next(iter(change))
    if key in ("lr", "weight_decay", "betas", "eps"):   # and the constructor refuses it too
        with pytest.raises((ValueError, TypeError)):
            Adam(model.parameters(), **{key: tuple(change[key]) if key == "betas" else change[key]})


@pytest.mark.parametrize("change", [dict(lr=math.nan), dict(momentum=-1.0), dict(momentum=math.inf),
                                    dict(nesterov=True, momentum=0.0)], ids=repr)
def test_sgd_refuses_invalid_hyper_parameters(change):
    _, opt = _trained(SGD, lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError):
        opt.load_state_dict(_mutate_group(opt.state_dict(), **change))
    assert opt.param_groups[0]["lr"] == 0.1


def test_nan_lr_checkpoint_never_reaches_the_parameters(tmp_path):
    model, opt = _trained(Adam, lr=0.01)
    sd = _mutate_group(opt.state_dict(), lr=math.nan)
    pg.save(sd, tmp_path / "opt.npz")
    with pytest.raises(CheckpointError):
        opt.load_state_dict(pg.load(tmp_path / "opt.npz"))
    model(pg.ones(4, 3, dtype="float64")).sum().backward()
    opt.step()
    assert all(np.isfinite(p.numpy()).all() for p in model.parameters())


@pytest.mark.parametrize("poison", ["nan-moment", "inf-moment", "string-step", "negative-step",
                                    "bad-shape", "not-a-dict"])
def test_state_entries_are_validated(poison):
    _, opt = _trained(Adam, lr=0.01)
    sd = copy.deepcopy(opt.state_dict())
    st = sd["state"]["0"]
    if poison == "nan-moment":
        st["exp_avg"] = pg.tensor(np.full(st["exp_avg"].shape, np.nan))
    elif poison == "inf-moment":
        st["exp_avg_sq"] = pg.tensor(np.full(st["exp_avg_sq"].shape, np.inf))
    elif poison == "string-step":
        st["step"] = "1"
    elif poison == "negative-step":
        st["step"] = -3
    elif poison == "bad-shape":
        st["exp_avg"] = pg.zeros(7)
    else:
        sd["state"]["0"] = [1, 2]
    old_state = opt.state
    with pytest.raises(CheckpointError):
        opt.load_state_dict(sd)
    assert opt.state is old_state


@pytest.mark.parametrize("step_count", [-1, 1.5, "3", True, None])
def test_step_count_is_validated(step_count):
    _, opt = _trained(AdamW)
    sd = opt.state_dict()
    sd["step_count"] = step_count
    with pytest.raises(CheckpointError):
        opt.load_state_dict(sd)


@pytest.mark.parametrize("sd", [None, 5, "state", [], {"param_groups": 3}])
def test_not_a_state_dict(sd):
    _, opt = _trained(SGD, lr=0.1)
    with pytest.raises(CheckpointError):
        opt.load_state_dict(sd)


def test_valid_round_trip_still_works(tmp_path):
    _, opt = _trained(Adam, lr=0.02, betas=(0.8, 0.9))
    pg.save(opt.state_dict(), tmp_path / "o.npz")
    _, fresh = _trained(Adam, lr=0.5)
    fresh.load_state_dict(pg.load(tmp_path / "o.npz"))
    assert fresh.param_groups[0]["lr"] == 0.02 and fresh.param_groups[0]["betas"] == (0.8, 0.9)
    assert fresh.step_count == opt.step_count
