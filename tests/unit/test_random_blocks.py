"""polygrad.runtime.random_blocks: a raw draw cut into blocks on several threads gives the words of
one serial ``random_raw`` call, and leaves the generator where that call leaves it.

The size below which draws stay serial is set to zero here, so small generated draws go through
the jumped, multi-threaded path; a spy checks that blocks were really handed out.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polygrad as pg
from polygrad.runtime import random_blocks

GENERATORS = {"pcg64": np.random.PCG64, "pcg64dxsm": np.random.PCG64DXSM, "mt19937": np.random.MT19937,
              "philox": np.random.Philox}


@pytest.fixture
def force_parallel(monkeypatch):
    monkeypatch.setattr(random_blocks, "PARALLEL_MIN_WORDS", 0)
    seen: list[int] = []
    real = random_blocks.run_blocks

    def spy(fn, blocks, threads=None):
        blocks = list(blocks)
        seen.append(threads)
        return real(fn, blocks, threads)

    monkeypatch.setattr(random_blocks, "run_blocks", spy)
    before = pg.get_num_threads()
    yield seen
    pg.set_num_threads(before)


def _drawn(kind: str, seed: int, words: int, block_words: int, threads: int):
    """(the words the blocks got, in order; the generator's next raw words and next float32s)."""
    pg.set_num_threads(threads)
    gen = GENERATORS[kind](seed)
    np.random.Generator(gen).random(1, dtype=np.float32)  # a buffered 32-bit half-word, to keep
    out = np.zeros(words, dtype=np.uint64)

    def use(first: int, block: np.ndarray) -> None:
        out[first:first + block.shape[0]] = block

    random_blocks.draw_raw_in_blocks(gen, words, block_words, use)
    after = np.random.Generator(gen).random(3, dtype=np.float32), gen.random_raw(3)
    return out, after


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(GENERATORS)), st.integers(0, 2**32), st.integers(0, 400), st.integers(1, 50))
def test_blocks_give_the_serial_words_at_any_thread_count(force_parallel, kind, seed, words, block_words):
    gen = GENERATORS[kind](seed)
    np.random.Generator(gen).random(1, dtype=np.float32)
    want = gen.random_raw(words)
    want_after = np.random.Generator(gen).random(3, dtype=np.float32), gen.random_raw(3)
    for threads in (1, 2, 3, 7):
        got, after = _drawn(kind, seed, words, block_words, threads)
        assert got.tobytes() == want.tobytes(), (kind, threads)
        assert after[0].tobytes() == want_after[0].tobytes() and after[1].tobytes() == want_after[1].tobytes()


def test_only_word_jumping_generators_use_threads(force_parallel):
    _drawn("pcg64", 1, 1000, 10, 3)
    assert force_parallel == [3]
    force_parallel.clear()
    for kind in ("mt19937", "philox"):  # Philox's advance() counts 256-bit blocks, not words
        _drawn(kind, 1, 1000, 10, 3)
    assert force_parallel == []


def test_a_block_size_below_one_is_refused():
    with pytest.raises(ValueError, match="block_words"):
        random_blocks.draw_raw_in_blocks(np.random.PCG64(0), 10, 0, lambda first, block: None)
