"""Class 2: an event hook that raises is reported once, disabled, and the computation goes on.

Each hook is attacked with a listener that raises (several exception types, including ones that
subclass polygrad's own errors and MemoryError), registered next to a healthy listener that must
keep receiving events.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import PluginWarning
from polygrad.runtime.registry import registry


class Healthy:
    def __init__(self):
        self.ops = 0
        self.backwards = 0
        self.layouts = 0

    @pg.hookimpl
    def polygrad_op_executed(self, op, backend, layout, inputs, output):
        self.ops += 1

    @pg.hookimpl
    def polygrad_backward_finished(self, num_nodes, seconds, grads):
        self.backwards += 1

    @pg.hookimpl
    def polygrad_layout_chosen(self, op, shape, nnz, density, layout, reason):
        self.layouts += 1


def _raiser(hook: str, exc: BaseException):
    class Bad:
        calls = 0
    argnames = {"polygrad_op_executed": "op, backend, layout, inputs, output",
                "polygrad_backward_finished": "num_nodes, seconds, grads",
                "polygrad_layout_chosen": "op, shape, nnz, density, layout, reason",
                "polygrad_fallback": "op, backend, layout, exception"}[hook]
    namespace: dict = {}
    exec(f"def {hook}(self, {argnames}):\n    type(self).calls += 1\n    raise EXC\n", {"EXC": exc}, namespace)
    setattr(Bad, hook, pg.hookimpl(namespace[hook]))
    return Bad()


@pytest.fixture(autouse=True)
def _forget_failures():
    """The failure record is process-wide (a disabled listener stays disabled): keep other
    tests' view of pg.stats() and `polygrad backends` clean."""
    from polygrad.runtime import events
    before = dict(events.hook_failures)
    yield
    events.hook_failures.clear()
    events.hook_failures.update(before)


@pytest.fixture
def plugins():
    registered = []

    def add(plugin, name):
        pg.register_plugin(plugin, name)
        registered.append(plugin)
        return plugin

    yield add
    for p in registered:
        pg.unregister_plugin(p)


def _workload():
    x = pg.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float64", requires_grad=True)
    y = ((x @ x).relu() * 2).sum()
    y.backward()
    adj = pg.tensor(np.eye(64), layout="auto")
    return y.item(), x.grad.numpy().copy(), adj.layout


EXCEPTIONS = [RuntimeError("boom"), ValueError("bad"), pg.errors.ShapeError("fake shape error"),
              MemoryError("fake oom"), KeyError("k"), ZeroDivisionError("zero")]


@pytest.mark.parametrize("hook", ["polygrad_op_executed", "polygrad_backward_finished",
                                  "polygrad_layout_chosen"])
@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_raising_hook_is_disabled_and_results_are_right(plugins, hook, exc):
    want = _workload()
    healthy = plugins(Healthy(), "healthy-listener")
    bad = plugins(_raiser(hook, exc), f"bad-{hook}-{type(exc).__name__}")
    with pytest.warns(PluginWarning, match=hook):
        got = _workload()
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[2] == want[2]
    assert type(bad).calls == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)   # reported once: no second warning
        _workload()
        _workload()
    assert type(bad).calls == 1                          # disabled: never called again
    assert healthy.ops > 0 and healthy.backwards == 3 and healthy.layouts >= 1
    key = f"bad-{hook}-{type(exc).__name__}/{hook}"
    assert key in pg.stats()["hook_failures"]
    assert type(exc).__name__ in pg.stats()["hook_failures"][key]


def test_raising_fallback_hook_does_not_break_the_fallback(plugins):
    from polygrad.testing import inject_fault
    bad = plugins(_raiser("polygrad_fallback", RuntimeError("listener bug")), "bad-fallback-listener")
    x = pg.tensor([1.0, -2.0, 3.0], dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pg.errors.FallbackWarning)
        with pytest.warns(PluginWarning, match="polygrad_fallback"):
            with inject_fault("numpy", "exp"):
                out = x.exp()
    np.testing.assert_allclose(out.numpy(), np.exp([1.0, -2.0, 3.0]))
    assert type(bad).calls == 1
    pg.reset_stats()  # FallbackWarning is issued once per key: let later tests see theirs


def test_disabled_hook_stays_disabled_after_reregistration(plugins):
    bad = _raiser("polygrad_op_executed", RuntimeError("again"))
    plugins(bad, "bad-reregistered")
    with pytest.warns(PluginWarning):
        pg.tensor([1.0]) + 1
    pg.unregister_plugin(bad)
    plugins(bad, "bad-reregistered")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)
        pg.tensor([1.0]) + 1
    assert type(bad).calls == 1


def test_last_listener_disabled_costs_nothing_again(plugins):
    plugins(_raiser("polygrad_op_executed", RuntimeError("x")), "bad-only-listener")
    with pytest.warns(PluginWarning):
        pg.tensor([1.0]) * 2
    assert registry.events["polygrad_op_executed"] is None


def test_hook_raising_in_threads_is_disabled_once(plugins):
    import threading
    bad = plugins(_raiser("polygrad_op_executed", RuntimeError("threaded")), "bad-threaded")
    errors = []

    def work():
        try:
            for _ in range(50):
                assert ((pg.tensor([1.0, 2.0]) * 3).sum()).item() == 9.0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        threads = [threading.Thread(target=work) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert 1 <= type(bad).calls <= 6   # at most one call per thread raced in before the disable


def test_cli_backends_reports_a_raising_installed_plugin(tmp_path):
    """A plugin installed through an entry point whose hook raises: `polygrad backends` names it."""
    pkg = tmp_path / "site"
    (pkg / "badhook_plugin").mkdir(parents=True)
    (pkg / "badhook_plugin" / "__init__.py").write_text(textwrap.dedent("""
        import polygrad as pg

        @pg.hookimpl
        def polygrad_op_executed(op, backend, layout, inputs, output):
            raise RuntimeError("listener exploded")
        """))
    dist = pkg / "badhook_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: badhook-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[polygrad]\nbadhook = badhook_plugin\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(pkg)}
    run = subprocess.run([sys.executable, "-m", "polygrad", "backends"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert "badhook/polygrad_op_executed" in run.stdout
    assert "listener exploded" in run.stdout
    # and a user program with that plugin installed computes correctly
    prog = "import polygrad as pg, warnings; warnings.simplefilter('ignore'); print((pg.tensor([2.0]) * 3).item())"
    run = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "6.0", run.stderr


class Wrappers:
    """Event-hook wrappers in both pluggy styles: they still run around the plain listeners."""

    def __init__(self):
        self.log = []

    @pg.hookimpl(wrapper=True)
    def polygrad_backward_finished(self, num_nodes, seconds, grads):
        self.log.append("new-before")
        result = yield
        self.log.append(("new-after", result))
        return result

    @pg.hookimpl(hookwrapper=True)
    def polygrad_op_executed(self, op, backend, layout, inputs, output):
        self.log.append("old-before")
        outcome = yield
        self.log.append(("old-after", outcome.get_result()))


class RaisingWrapper:
    @pg.hookimpl(wrapper=True)
    def polygrad_backward_finished(self, num_nodes, seconds, grads):
        yield
        raise RuntimeError("after the yield")


def test_wrappers_still_run(plugins):
    w = plugins(Wrappers(), "wrapping-listener")
    healthy = plugins(Healthy(), "healthy-inside-wrappers")
    x = pg.tensor([1.0], requires_grad=True)
    (x * 2).sum().backward()
    assert w.log.count("new-before") == 1 and ("new-after", None) in w.log
    assert "old-before" in w.log and ("old-after", None) in w.log
    assert healthy.backwards == 1


def test_raising_wrapper_is_disabled(plugins):
    bad = plugins(RaisingWrapper(), "raising-wrapper")
    healthy = plugins(Healthy(), "healthy-next-to-wrapper")
    x = pg.tensor([1.0], requires_grad=True)
    with pytest.warns(PluginWarning, match="after the yield"):
        (x * 2).sum().backward()
    (x * 2).sum().backward()
    assert healthy.backwards == 2 and x.grad.numpy().tolist() == [4.0]
    assert "raising-wrapper/polygrad_backward_finished" in pg.stats()["hook_failures"]
    del bad
