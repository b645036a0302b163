"""A generator's raw stream drawn in blocks on polygrad's threads, the same words at any count.

``pg.rng()`` is numpy's PCG64, which can jump ahead: ``advance(k)`` moves it as if k 64-bit words
had been drawn, in O(log k) steps (~15 us with the copy of the state).  So block b of a draw
starts from a copy of the generator advanced to the block's first word and draws its own words:
every block gets exactly the words one serial ``random_raw`` call would have given it, whichever
thread draws it and however many there are, and the generator is then moved past the whole draw.
What a user seeds with ``pg.manual_seed`` therefore reproduces bit for bit at 1, 2 or 16 threads,
and equals what the serial draw gave before this existed (dropout's masks did not change).
Only PCG64 and PCG64DXSM jump by words (Philox's ``advance`` counts 256-bit blocks); any other
generator (MT19937, Philox, a user's own BitGenerator) draws its blocks in order in the calling
thread: the same words, one core.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .threads import get_num_threads, run_blocks

__all__ = ["draw_raw_in_blocks", "PARALLEL_MIN_WORDS"]

#: words below which a draw stays in the calling thread: a block's jumped copy costs ~15 us, and
#: 2**18 words (a 1M-entry dropout mask) take ~2-5 ms to draw and use
PARALLEL_MIN_WORDS = 1 << 18
#: bit generators whose ``advance(k)`` skips exactly k ``random_raw`` words
JUMPS_BY_WORDS = (np.random.PCG64, np.random.PCG64DXSM)


def draw_raw_in_blocks(bit_generator: Any, words: int, block_words: int,
                       use: Callable[[int, np.ndarray], None]) -> None:
    """Draw ``words`` 64-bit words from ``bit_generator`` (a numpy BitGenerator) in consecutive
    blocks of ``block_words``, calling ``use(first_word, block)`` for each (on polygrad's threads,
    so ``use`` must write only its own block's outputs): the words ``bit_generator.random_raw(words)``
    gives, in order, at any thread count.  Afterwards the generator stands where that call leaves
    it (its buffered 32-bit half-word, which raw draws never touch, kept)."""
    if block_words < 1:
        raise ValueError(f"draw_raw_in_blocks: block_words must be >= 1, got {block_words}")
    starts = range(0, words, block_words)
    can_jump = type(bit_generator) in JUMPS_BY_WORDS
    threads = get_num_threads() if can_jump and words >= PARALLEL_MIN_WORDS else 1
    if threads == 1:
        for w0 in starts:
            use(w0, bit_generator.random_raw(min(block_words, words - w0)))
        return
    start = bit_generator.state

    def jumped(w0: int) -> Any:
        copy = type(bit_generator)()
        copy.state = start
        return copy.advance(w0) if w0 else copy

    def block(w0: int) -> None:
        use(w0, jumped(w0).random_raw(min(block_words, words - w0)))

    run_blocks(block, [(w0,) for w0 in starts], threads)
    end = jumped(words).state
    for key in ("has_uint32", "uinteger"):  # advance() clears them; the serial draw kept them
        if key in start:
            end[key] = start[key]
    bit_generator.state = end
