"""executor.profile_entries: a timed replay gives the untimed one's bits and times every entry of the
captures prepared inside the block (and only those)."""
from __future__ import annotations

import importlib

import numpy as np

import polygrad as pg
from polygrad import optim
from tests.helpers import assert_bitwise, observed

executor = importlib.import_module("polygrad.compile.executor")


def _run(timed: bool) -> tuple[list, dict[str, float], object]:
    rng = np.random.default_rng(0)
    w = pg.tensor(rng.normal(size=(4, 3)), requires_grad=True)
    x = pg.tensor(rng.normal(size=(5, 4)))
    opt = optim.Adam([w], lr=0.1)

    def step():
        opt.zero_grad()
        loss = ((x @ w).relu() * 2.0).sum()
        loss.backward()
        return loss

    f = pg.compile(step, pure=True)
    times: dict[str, float] = {}
    seen = []
    if timed:
        with executor.profile_entries() as times:
            for _ in range(4):
                seen.append([observed(f()), observed(w)])
                opt.step()
    else:
        for _ in range(4):
            seen.append([observed(f()), observed(w)])
            opt.step()
    return seen, times, f


def test_timed_replay_equals_untimed_and_times_each_entry():
    (want, _, _), (got, times, f) = _run(False), _run(True)
    assert_bitwise(got, want)
    caps = [entry.capture for entry in f._cache.values() if entry.capture is not None]
    assert caps and f.stats["replays"] >= 1
    # the capture that replays (an earlier one, compared against it, may have labels of its own)
    replayed = {label for label in times if label.startswith(f"{id(caps[0]):x}:")}
    indices = {int(label.split(":", 1)[1].split(" ", 1)[0]) for label in replayed}
    assert indices and max(indices) < len(caps[0].program)
    assert len(indices) >= len(caps[0].program) // 2  # nearly every entry generates a line
    assert all(times[label] > 0.0 for label in replayed if " Kernel " in label)  # replays ran the timed code
    assert any(" matmul:" in label for label in times)


def test_replays_prepared_outside_the_block_are_untimed():
    with executor.profile_entries() as times:
        pass
    _run(False)
    assert times == {} and executor._profile is None
