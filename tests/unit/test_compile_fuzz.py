"""Differential testing of pg.compile: random training steps, compiled and eager, bit for bit.

A hypothesis generator draws a training step from the things a user's step does: a model (linear
or an MLP, dropout), a chain of ops on its output, a loss, an optimizer (SGD, momentum, Adam,
AdamW) with one or two parameter groups, a learning-rate scheduler stepped inside or outside the
step (``ReduceLROnPlateau`` bringing the groups' rates to one ``min_lr``), branches on host
values (``loss.item()``), ``clip_grad_norm_``, a warm-up computed in Python, side effects (losses
appended, a counter), leaves made inside the step (saliency, FGSM), a numpy mask, a closure
coefficient -- and events between calls (eval/train, freezing and unfreezing a parameter,
``add_param_group``, the coefficient or the mask changed, the groups' learning rates set equal or
apart, which changes how eager groups its concatenated update).

Each step runs ``CALLS`` times eagerly, under the default ``pg.compile`` and under
``pg.compile(pure=True)``.  The default mode must give eager's losses, parameters, gradients and
side effects bit for bit; the pure mode too, since whatever it cannot replay it must refuse (run
eagerly) or re-capture, never silently diverge.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad import nn, optim
from polygrad.optim import lr_scheduler

from tests.helpers import assert_bitwise, observed

CALLS = 5
EVENTS = ["eval", "train", "freeze", "unfreeze", "add_group", "coef", "mask", "lr_equal", "lr_apart"]


@st.composite
def steps(draw: Any) -> dict:
    return {
        "n_in": draw(st.integers(2, 3)),
        "hidden": draw(st.sampled_from([(), (3,), (3, 2)])),
        "dropout": draw(st.sampled_from([0.0, 0.0, 0.4])),
        "head": draw(st.lists(st.sampled_from(["relu", "tanh", "sigmoid", "square", "abs", "scale", "shift"]),
                              max_size=3)),
        "loss": draw(st.sampled_from(["mse", "margin", "mean"])),
        "opt": draw(st.sampled_from(["sgd", "momentum", "adam", "adamw"])),
        "groups": draw(st.booleans()),
        "sched": draw(st.sampled_from([None, "step_inside", "step_outside", "lambda_inside", "plateau_outside"])),
        "clip": draw(st.booleans()),
        "branch": draw(st.sampled_from([None, "item", "isfinite"])),
        "warmup": draw(st.booleans()),
        "append": draw(st.booleans()),
        "counter": draw(st.booleans()),
        "leaf": draw(st.sampled_from([None, None, "saliency", "fgsm"])),
        "mask": draw(st.booleans()),
        "events": draw(st.lists(st.tuples(st.integers(1, CALLS - 1), st.sampled_from(EVENTS)), max_size=3)),
    }


def run(spec: dict, mode: str) -> tuple[list, Any]:
    """Run the step ``spec`` describes ``CALLS`` times; (observations, the compiled function)."""
    pg.manual_seed(0)
    rng = np.random.default_rng(0)
    n = 6
    X = rng.normal(size=(n, spec["n_in"]))
    x = pg.tensor(X)
    y = pg.tensor(np.where(rng.normal(size=(n, 1)) > 0, 1.0, -1.0))
    model = nn.MLP(spec["n_in"], [*spec["hidden"], 1], activation="tanh", dropout=spec["dropout"], dtype=pg.float64)
    extra = pg.tensor(np.array([1.0]), requires_grad=True)  # joins the optimizer at an add_group event
    late = any(e == "add_group" for _, e in spec["events"])
    weights = model.parameters()  # (parameters() may leave out frozen ones: keep the list)
    params = weights + ([] if late else [extra])
    if spec["groups"] and len(params) > 1:
        groups: Any = [{"params": params[:1], "lr": 0.05}, {"params": params[1:]}]
    else:
        groups = params
    opt = {"sgd": lambda: optim.SGD(groups, lr=0.1),
           "momentum": lambda: optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=1e-3),
           "adam": lambda: optim.Adam(groups, lr=0.05),
           "adamw": lambda: optim.AdamW(groups, lr=0.05)}[spec["opt"]]()
    sched: Any = None
    if spec["sched"] in ("step_inside", "step_outside"):
        sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    elif spec["sched"] == "lambda_inside":
        sched = lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))
    elif spec["sched"] == "plateau_outside":  # every group's rate halves down to one min_lr: equal rates
        sched = lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, min_lr=0.03)
    mask = np.ones(n, dtype=bool)
    mask[1] = False
    losses: list = []
    counter = {"k": 0}
    coef = 1.0

    def step(xb):
        counter["k"] += spec["counter"]
        if spec["warmup"]:
            for g in opt.param_groups:
                g["lr"] = 0.1 * min(1.0, (len(losses) + 1) / 3) if spec["append"] else 0.07
        inp = xb
        if spec["leaf"] is not None:
            inp = pg.tensor(X, requires_grad=True)  # a leaf made inside the step
        opt.zero_grad()
        out = model(inp) * extra
        for op in spec["head"]:
            out = {"relu": lambda t: t.relu(), "tanh": lambda t: t.tanh(), "sigmoid": lambda t: t.sigmoid(),
                   "square": lambda t: t * t, "abs": lambda t: t.abs(), "scale": lambda t: t * coef,
                   "shift": lambda t: t + 0.25}[op](out)
        if spec["mask"]:
            out, target = out[mask], y[mask]
        else:
            target = y
        if spec["loss"] == "mse":
            loss = ((out - target) ** 2).mean()
        elif spec["loss"] == "margin":
            loss = (1 - target * out).relu().mean()
        else:
            loss = out.mean()
        if spec["branch"] == "item" and loss.item() > 0.5:
            loss = loss * 0.5
        if spec["branch"] == "isfinite" and not math.isfinite(loss.item()):
            return loss, None
        loss.backward()
        if spec["leaf"] == "fgsm":  # a second pass on the perturbed input
            adv = xb + 0.05 * inp.grad
            opt.zero_grad()
            loss = ((model(adv) * extra - y) ** 2).mean()
            loss.backward()
        if spec["clip"]:
            nn.utils.clip_grad_norm_(opt._params(), 0.5)
        opt.step()
        if sched is not None and spec["sched"] not in ("step_outside", "plateau_outside"):
            sched.step()
        if spec["append"]:
            losses.append(loss)
        return loss, (inp.grad if spec["leaf"] == "saliency" else None)

    f: Any = step if mode == "eager" else pg.compile(step, pure=mode == "pure")
    obs: list = []
    for k in range(CALLS):
        for at, event in spec["events"]:
            if at != k:
                continue
            if event == "eval":
                model.eval()
            elif event == "train":
                model.train()
            elif event == "freeze":
                weights[0].requires_grad_(False)
            elif event == "unfreeze":
                weights[0].requires_grad_(True)
            elif event == "add_group" and all(extra is not p for g in opt.param_groups for p in g["params"]):
                opt.add_param_group({"params": [extra], "lr": 0.02})
            elif event == "coef":
                coef = 0.5 + k  # noqa: F841 - read by step through its closure
            elif event == "mask":
                mask[k % n] = not mask[k % n]
                mask[0] = True
            elif event == "lr_equal":  # groups updated apart become one concatenation in eager
                for g in opt.param_groups:
                    g["lr"] = 0.04
            elif event == "lr_apart":
                opt.param_groups[-1]["lr"] = 0.06
        loss, sal = f(x)
        if sched is not None and spec["sched"] == "step_outside":
            sched.step()
        elif sched is not None and spec["sched"] == "plateau_outside" and len(sched.min_lrs) == len(opt.param_groups):
            sched.step(1.0)  # a metric that never improves (its min_lrs do not follow add_param_group)
        obs.append([loss, sal, [p.grad for p in weights], extra.grad])
    obs.append([weights, extra, losses, counter["k"], [g["lr"] for g in opt.param_groups]])
    return observed(obs), f


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps())
def test_random_steps_compiled_equal_eager_bit_for_bit(spec):
    want, _ = run(spec, "eager")
    got, _ = run(spec, "default")
    assert_bitwise(want, got, f"default mode, {spec}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a pure step's refusal warns: running eagerly is the point
        pure, compiled = run(spec, "pure")
    assert_bitwise(want, pure, f"pure mode, {spec} ({compiled.stats}, {compiled.reason})")
