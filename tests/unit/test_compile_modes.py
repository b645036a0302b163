"""pg.compile's two modes against eager, one test per class of divergence issue 20 found.

Each case builds a fresh training (or scoring) step, runs it several times with whatever the user
changes between calls, and returns what a user would observe: losses, parameters, side effects.
The default mode must give eager's observations bit for bit (it runs the step's Python every
call); ``pure=True`` must either give them too or have refused (run eagerly) -- never diverge.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import polygrad as pg
from polygrad import nn, optim
from polygrad.compile import Compiled, CompileError
from tests.helpers import assert_bitwise, observed, sparse_dropout_step

CALLS = 8


class Mode:
    """How a case wraps its step: eagerly, pg.compile (default) or pg.compile(pure=True)."""

    def __init__(self, name: str):
        self.name = name
        self.compiled: list[Compiled] = []

    def __call__(self, fn: Callable) -> Callable:
        if self.name == "eager":
            return fn
        c = pg.compile(fn, pure=self.name == "pure")
        self.compiled.append(c)
        return c

    def stats(self) -> dict:
        out: dict = {}
        for c in self.compiled:
            for k, v in c.stats.items():
                out[k] = out.get(k, 0) + v
        return out


def _linear(seed: int = 0, n_in: int = 3, n_out: int = 1) -> nn.Linear:
    pg.manual_seed(seed)
    return nn.Linear(n_in, n_out, dtype=pg.float64)


def _data(seed: int = 1, n: int = 6, n_in: int = 3) -> tuple[pg.Tensor, pg.Tensor]:
    rng = np.random.default_rng(seed)
    return pg.tensor(rng.normal(size=(n, n_in))), pg.tensor(rng.normal(size=(n, 1)))


def _regression() -> tuple[nn.Linear, optim.SGD, pg.Tensor, pg.Tensor]:
    """The model, optimizer and data most cases train: a seeded Linear under SGD on seeded data."""
    model = _linear()
    return model, optim.SGD(model.parameters(), lr=0.1), *_data()


def _mse_step(model: nn.Linear, opt: optim.SGD, x: pg.Tensor, y: pg.Tensor) -> Callable:
    """The plain training step (no impurity): one SGD step on the mean squared error."""
    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    return step


CHANGE_AT = 5  # the call before which a case's user changes something (after capture and replays)


def _calls(f: Callable, change: Callable[[], None]) -> list:
    """CALLS results of ``f()``, with ``change()`` run once before call CHANGE_AT."""
    out = []
    for k in range(CALLS):
        if k == CHANGE_AT:
            change()
        out.append(f())
    return out


# -- the cases (each returns its observations) ------------------------------------------------------

def case_clip_grad_norm_inside_step(mode: Mode) -> list:
    model, opt, x, y = _regression()

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() * 100.0
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    f = mode(step)
    out = []
    for _ in range(CALLS):
        out.append(f())
        out.append([p.grad for p in model.parameters()])
    return observed(out + list(model.parameters()))


def case_isfinite_check_on_loss_item(mode: Mode) -> list:
    model, opt, x, y = _regression()
    skipped = [0]

    def step(xb):
        opt.zero_grad()
        loss = ((model(xb) - y) ** 2).mean()
        if not math.isfinite(loss.item()):
            skipped[0] += 1
            return loss
        loss.backward()
        opt.step()
        return loss

    f = mode(step)
    bad = pg.tensor(np.where(np.arange(18).reshape(6, 3) == 4, np.inf, x.numpy()))
    out = [f(bad if k in (5, 6) else x) for k in range(CALLS)]
    return observed(out + list(model.parameters())) + [skipped[0]]


def case_lr_warmup_computed_in_step(mode: Mode) -> list:
    model, opt, x, y = _regression()
    state = {"k": 0}

    def step():
        state["k"] += 1
        for g in opt.param_groups:
            g["lr"] = 0.1 * min(1.0, state["k"] / 6)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    f = mode(step)
    out = [f() for _ in range(CALLS)]
    return observed(out + list(model.parameters())) + [state["k"], opt.param_groups[0]["lr"]]


def case_losses_appended_to_a_list(mode: Mode) -> list:
    model, opt, x, y = _regression()
    losses: list = []

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss)
        return loss

    f = mode(step)
    for _ in range(CALLS):
        f()
    return observed(losses + list(model.parameters())) + [len(losses)]


def case_requires_grad_false_after_capture(mode: Mode) -> list:
    model, opt, x, y = _regression()
    f = mode(_mse_step(model, opt, x, y))
    out = _calls(f, lambda: model.weight.requires_grad_(False))  # freeze the weight: only the bias trains
    return observed(out + list(model.parameters()))


def case_add_param_group_after_capture(mode: Mode) -> list:
    pg.manual_seed(0)
    w1 = pg.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    w2 = pg.tensor(np.array([1.5]), requires_grad=True)
    opt = optim.SGD([w1], lr=0.1)
    x, y = _data()

    def step():
        opt.zero_grad()
        loss = (((x @ w1)[:, None] + w2 - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    f = mode(step)
    out = _calls(f, lambda: opt.add_param_group({"params": [w2], "lr": 0.05}))
    return observed(out + [w1, w2])


class _Trainer:
    """Reaches its model through ``self.model`` (not a Module itself)."""

    def __init__(self, mode: Mode):
        pg.manual_seed(3)
        self.model = nn.MLP(3, [5, 1], dropout=0.5, dtype=pg.float64)
        self.score = mode(self._score)

    def _score(self, x):
        return self.model(x).sum()


def case_eval_mode_reached_through_self_model(mode: Mode) -> list:
    trainer = _Trainer(mode)
    x, _ = _data()
    pg.manual_seed(11)
    return observed(_calls(lambda: trainer.score(x), trainer.model.eval))


def case_decorator_before_the_model_exists(mode: Mode) -> list:
    @mode
    def score(x):
        return model(x).sum()

    pg.manual_seed(3)
    model = nn.MLP(3, [5, 1], dropout=0.5, dtype=pg.float64)
    x, _ = _data()
    pg.manual_seed(11)
    return observed(_calls(lambda: score(x), model.eval))


def case_numpy_mask_edited_in_place(mode: Mode) -> list:
    model, opt, x, y = _regression()
    mask = np.array([True, False, True, True, False, True])

    def step():
        opt.zero_grad()
        loss = ((model(x)[mask] - y[mask]) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def edit_mask():
        mask[1] = True  # the user edits the mask in place

    out = _calls(mode(step), edit_mask)
    return observed(out + list(model.parameters()))


def case_closure_coefficient_swapped(mode: Mode) -> list:
    model, opt, x, y = _regression()
    coef = 0.5

    def step():
        opt.zero_grad()
        loss = coef * ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    def swap_coefficient():
        nonlocal coef
        coef = 2.0  # read by step through its closure

    out = _calls(mode(step), swap_coefficient)
    return observed(out + list(model.parameters()))


GRAPH = pg.tensor(np.eye(6))


def _graph_step(model: nn.Linear, opt: optim.SGD, x: pg.Tensor, y: pg.Tensor) -> Callable:
    def step():
        opt.zero_grad()
        loss = ((GRAPH @ model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    return step


def case_global_graph_swapped(mode: Mode) -> list:
    global GRAPH
    model, opt, x, y = _regression()
    f = mode(_graph_step(model, opt, x, y))
    saved = GRAPH

    def swap_graph():
        global GRAPH
        GRAPH = pg.tensor(np.roll(np.eye(6), 1, axis=1))  # another graph, same shape

    try:
        out = _calls(f, swap_graph)
    finally:
        GRAPH = saved
    return observed(out + list(model.parameters()))


def case_saliency_leaf_created_in_step(mode: Mode) -> list:
    model, opt, xs, y = _regression()
    data = xs.numpy().copy()

    def step():
        x = pg.tensor(data, requires_grad=True)  # a leaf made inside the step
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss, x.grad

    f = mode(step)
    out = [f() for _ in range(CALLS)]
    return observed(out + list(model.parameters()))


def case_fgsm_leaf_created_in_step(mode: Mode) -> list:
    model, opt, xs, y = _regression()

    def step(xb):
        x = xb.detach().requires_grad_(True)
        ((model(x) - y) ** 2).mean().backward()
        x_adv = xb + 0.1 * x.grad  # (a gradient step rather than its sign: same structure)
        opt.zero_grad()
        loss = ((model(x_adv) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    f = mode(step)
    out = [f(xs) for _ in range(CALLS)]
    return observed(out + list(model.parameters()))


CASES = [case_clip_grad_norm_inside_step, case_isfinite_check_on_loss_item, case_lr_warmup_computed_in_step,
         case_losses_appended_to_a_list, case_requires_grad_false_after_capture,
         case_add_param_group_after_capture, case_eval_mode_reached_through_self_model,
         case_decorator_before_the_model_exists, case_numpy_mask_edited_in_place,
         case_closure_coefficient_swapped, case_global_graph_swapped, case_saliency_leaf_created_in_step,
         case_fgsm_leaf_created_in_step]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_default_mode_gives_eagers_numbers_bit_for_bit(case):
    want = case(Mode("eager"))
    mode = Mode("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the default mode never needs to refuse
        got = case(mode)
    assert_bitwise(want, got, case.__name__)
    assert mode.stats()["eager"] == CALLS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__[5:])
def test_pure_mode_refuses_or_recaptures_never_diverges(case):
    want = case(Mode("eager"))
    mode = Mode("pure")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a refusal warns once; its eager runs are the point
        got = case(mode)
    assert_bitwise(want, got, case.__name__)
    s = mode.stats()
    assert s["refused"] + s["recaptures"] > 0, f"{case.__name__}: no guard fired ({s})"


def test_pure_mode_replays_a_step_that_only_issues_ops():
    """The control: the same step without any of the impurities above replays (and agrees)."""
    def run(mode: Mode) -> list:
        model, opt, x, y = _regression()
        f = mode(_mse_step(model, opt, x, y))
        return observed([f() for _ in range(CALLS)] + list(model.parameters()))

    pure = Mode("pure")
    assert_bitwise(run(Mode("eager")), run(pure))
    assert pure.stats()["replays"] == CALLS - 3


# -- decoration and arguments (issue 23) ----------------------------------------------------------

@pytest.mark.parametrize("pure", [False, True])
def test_compile_of_a_non_callable_fails_at_decoration(pure):
    with pytest.raises(CompileError, match=r"pg.compile expects a function.*int 42"):
        pg.compile(42, pure=pure)
    with pytest.raises(CompileError, match="expects a function"):
        pg.compile(pure=pure)("not a function")


@pytest.mark.parametrize("pure", [False, True])
def test_set_argument_is_a_clear_error_naming_it(pure):
    def f(x, groups):
        return x * 2.0

    c = pg.compile(f, pure=pure)
    with pytest.raises(CompileError, match=r"argument 'groups' is a set.*tuples, lists and dicts"):
        c(pg.ones(2), {1, 2})
    with pytest.raises(CompileError, match=r"argument 'groups'\[1\] is a frozenset"):
        c(pg.ones(2), [1, frozenset({2})])
    with pytest.raises(CompileError, match=r"argument 'groups'\['a'\] is an unhashable bytearray"):
        c(x=pg.ones(2), groups={"a": bytearray(b"x")})
    np.testing.assert_array_equal(c(pg.ones(2), (1, 2)).numpy(), [2.0, 2.0])  # what is supported still runs


# -- the demos use the pure mode: it must give their eager numbers -------------------------------------

def test_moons_demo_pure_mode_equals_eager_bit_for_bit():
    from polygrad.apps.demos import run_moons

    eager = run_moons(steps=12, progress=False, compile=False)
    pure = run_moons(steps=12, progress=False, compile=True)
    assert pure["compile_mode"] == "pure" and pure["compiled"] is True and eager["compile_mode"] == "eager"
    assert (pure["loss"], pure["accuracy"]) == (eager["loss"], eager["accuracy"])


def test_gcn_demo_pure_mode_equals_eager_bit_for_bit():
    from polygrad.apps.demos import load_graph, train_gcn

    ds = load_graph(None, "cora", False)  # Cora where POLYGRAD_PLANETOID_DIR says, else the embedded graph
    eager = train_gcn(ds, seed=0, epochs=8, compile=False)
    pure = train_gcn(ds, seed=0, epochs=8, compile=True)
    assert pure["history"].compile_mode == "pure" and pure["history"].replays == 8 - 3
    assert pure["curves"] == eager["curves"]
    assert (pure["test_accuracy"], pure["val_accuracy"]) == (eager["test_accuracy"], eager["val_accuracy"])


def test_fit_reports_its_mode_and_the_default_mode_equals_eager():
    from polygrad.apps.train import fit

    def run(compile: Any) -> tuple:
        model, opt, x, y = _regression()
        history = fit(model, opt, lambda: ((model(x) - y) ** 2).mean(), 6, rollback_threshold=None, compile=compile)
        return history, observed(list(model.parameters()))

    (h0, p0), (h1, p1), (h2, p2) = run(False), run(True), run("pure")
    assert (h0.compile_mode, h1.compile_mode, h2.compile_mode) == ("eager", "default", "pure")
    assert h0.losses == h1.losses == h2.losses and h2.replays == 3
    assert_bitwise(p0, p1)
    assert_bitwise(p0, p2)
    with pytest.raises(ValueError, match="compile must be"):
        run("fast")


def test_default_mode_gradient_written_in_place_does_not_reach_the_next_call():
    """A rule's gradient can be a view of a constant it made (reshape of the seed); eager makes that
    constant afresh every call, so a backward plan must not hand out the one it keeps."""
    def run(mode: Mode) -> list:
        w = pg.tensor(np.array([2.0]), requires_grad=True)

        def step():
            w.grad = None
            loss = w.reshape(())
            loss.backward()
            g = w.grad.numpy()
            g *= 3.0  # the user scales the gradient in place (numpy() shares the storage)
            return w.grad

        f = mode(step)
        return observed([f() for _ in range(5)])

    default = Mode("default")
    assert_bitwise(run(Mode("eager")), run(default))
    assert default.compiled[0].plans.stats["planned"] == 4


def test_gat_demo_default_mode_equals_eager_bit_for_bit():
    from polygrad.apps.demos import graph_tensors, load_graph
    from polygrad.apps.gnn_demos import build_gat, train_node_model

    ds = load_graph(None, "cora", False)
    x = graph_tensors(ds)[0]
    eager = train_node_model(lambda: build_gat(ds), ds, x, 0, 4, compile=False)
    default = train_node_model(lambda: build_gat(ds), ds, x, 0, 4)
    assert default["compile_mode"] == "default" and eager["compile_mode"] == "eager"
    assert default["curves"] == eager["curves"] and default["test_accuracy"] == eager["test_accuracy"]


@pytest.mark.parametrize("mode", ["raise", "wrong_shape"])
def test_default_mode_kernel_fault_during_a_backward_plan_runs_the_pass_eagerly(mode):
    from polygrad.errors import FallbackWarning
    from polygrad.testing import inject_fault

    def run(wrap: Mode) -> list:
        model, opt, x, y = _regression()
        f = wrap(_mse_step(model, opt, x, y))
        out = [f() for _ in range(3)]  # the plan is recorded, then used
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)  # eager falls back as well: the point is equality
            with inject_fault("numpy", "matmul", mode=mode) as fault:
                out += [f() for _ in range(2)]
        assert fault.triggered >= 1
        out += [f() for _ in range(3)]
        return observed(out + list(model.parameters()))

    default = Mode("default")
    assert_bitwise(run(Mode("eager")), run(default))
    assert default.compiled[0].plans.stats["planned"] >= 3


@pytest.mark.parametrize("learn_values", [False, True])
def test_default_mode_sparse_step_equals_eager_bit_for_bit(learn_values):
    """An SpMM step, its fused backward planned; with learnable sparse values too (their gradient,
    at the nonzeros only, is delivered by the plan like any other)."""
    def run(mode: Mode) -> list:
        pg.manual_seed(5)
        rng = np.random.default_rng(5)
        dense = rng.random((12, 12)) * (rng.random((12, 12)) < 0.3)
        a = pg.tensor(dense, layout="csr", requires_grad=learn_values)
        x = pg.tensor(rng.random((12, 4)))
        lin = nn.Linear(4, 3, dtype=pg.float64)
        opt = optim.Adam(lin.parameters() + ([a] if learn_values else []), lr=0.05)
        f = mode(sparse_dropout_step(a, lin, x, opt))
        out = []
        for k in range(6):
            pg.manual_seed(k)  # the same dropout masks eagerly and compiled
            out.append(f())
        return observed(out + list(lin.parameters()) + ([a.values] if learn_values else []))

    default = Mode("default")
    assert_bitwise(run(Mode("eager")), run(default))
    stats = default.compiled[0].plans.stats
    assert stats["planned"] == 5
