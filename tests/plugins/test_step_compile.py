"""The polygrad_compile_kernels hook: a backend compiles a captured step's kernels into one callable;
polygrad keeps guards, the rest of the step, and falls back (reported) when the callable fails."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import polygrad as pg
from polygrad.errors import FallbackWarning
from polygrad.runtime.registry import registry
from polygrad.compile import Call, Kernel
from polygrad.compile.backend_compile import COMPILED_STEP, CompiledStep, KernelProgram
from polygrad.testing.temporary import registry_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_compile import _gcn, _moons  # noqa: E402 - the compile tests' steps


def _interpret(program: KernelProgram):
    """A 'compiler' for the numpy backend: the kernels called in order (what a jax.jit traces)."""
    tables, vjps = registry.tables[program.backend.name], registry.vjp_tables[program.backend.name]

    def run(*arrays):
        *arrays, numbers = arrays
        calls = iter(numbers)
        buf = dict(zip(program.inputs, arrays))
        for e in program.entries:
            if isinstance(e, Kernel):
                buf[e[5]] = tables[e[2]](*[buf[i] for i in e[3]], **e[4])
            elif isinstance(e, Call):   # an optimizer's update, a keyed draw
                for slot, a in zip(e.outs, e.fn(*[buf[i] for i in e.inputs], *next(calls), **e.attrs)):
                    buf[slot] = a
            else:           # Fused
                for slot, a in zip(e[5], vjps[e[2]](*[buf[i] for i in e[3]], **e[4])):
                    if slot >= 0:
                        buf[slot] = a
        return [buf[s] for s in program.outputs]
    return run


class Compiler:
    def __init__(self, mode: str = "ok", backend_name: str = "numpy") -> None:
        self.mode, self.programs, self.calls, self.events = mode, [], 0, []
        self.backend_name = backend_name

    @pg.hookimpl
    def polygrad_compile_kernels(self, program, backend):
        if backend.name != self.backend_name:
            return None
        if self.mode == "raise-at-compile":
            raise RuntimeError("cannot compile")
        self.programs.append(program)
        inner = _interpret(program)

        def compiled(*arrays):
            self.calls += 1
            if self.mode == "raise":
                raise RuntimeError("device lost")
            out = inner(*arrays)
            return out[:-1] if self.mode == "short" else out
        return compiled

    @pg.hookimpl
    def polygrad_fallback(self, op, backend, layout, exception):
        self.events.append((op, backend, str(exception)))


def _run(make, compiler: Compiler | None, steps: int):
    eager_model, eager_step = make()         # eager first: both draw from the global generator
    eager = [eager_step().item() for _ in range(steps)]
    model, step = make()
    with registry_snapshot():
        if compiler is not None:
            pg.register_plugin(compiler, f"compiler-{id(compiler)}")
        c = pg.compile(step, pure=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k in range(steps):
                assert c().item() == eager[k], f"step {k}"
    for a, b in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    return c, caught


def test_compiled_kernels_run_the_step_and_give_the_eager_numbers() -> None:
    compiler = Compiler()
    c, _ = _run(_moons, compiler, 12)
    assert len(compiler.programs) == 2            # the capture and its check capture
    assert compiler.calls == c.stats["replays"] == 12 - 3
    program = compiler.programs[-1]
    assert program.backend.name == "numpy" and program.inputs and program.outputs
    cap = next(iter(c._cache.values())).capture
    assert isinstance(cap.fast, CompiledStep) and cap.fast.calls == compiler.calls


def test_dropout_and_adam_stay_exact_through_a_compiled_step() -> None:
    compiler = Compiler()
    c, _ = _run(lambda: _gcn(0), compiler, 6)
    assert compiler.calls == c.stats["replays"] > 0


@pytest.mark.parametrize("mode", ["raise", "short"])
def test_a_failing_compiled_step_falls_back_reported_with_eager_numbers(mode: str) -> None:
    compiler = Compiler(mode)
    c, caught = _run(_moons, compiler, 10)
    assert compiler.calls == 1                    # disabled after its failure, for that capture
    assert c.stats["replays"] == 10 - 3 and c.stats["dropped"] == 0
    assert [e[:2] for e in compiler.events] == [(COMPILED_STEP, "numpy")]
    assert any(issubclass(w.category, FallbackWarning) and "compiled step" in str(w.message) for w in caught)
    assert pg.stats()["fallbacks"].get(f"{COMPILED_STEP}/numpy/-", 0) >= 1


def test_a_compiler_that_raises_leaves_the_plain_replay() -> None:
    compiler = Compiler("raise-at-compile")
    c, _ = _run(_moons, compiler, 8)
    assert c.stats["replays"] == 8 - 3
    assert compiler.events and compiler.events[0][0] == COMPILED_STEP
    cap = next(iter(c._cache.values())).capture
    assert not isinstance(cap.fast, CompiledStep)


def test_no_compiler_installed_changes_nothing() -> None:
    c, _ = _run(_moons, None, 6)
    cap = next(iter(c._cache.values())).capture
    assert not isinstance(cap.fast, CompiledStep)
