"""Keep the C heap's top between training steps (glibc): a step that frees its intermediates at its
end must not hand the pages back to the system only to fault them in again at the next step.

A training step allocates its intermediate arrays and frees them at its end, every step, the same
sizes -- a pure replay (``pg.compile(step, pure=True)``) all of them at once.  Arrays below the
numpy backend's pool (``polygrad.runtime.pool``, 8 MiB) come from malloc; when the freed block at
the top of glibc's heap exceeds its trim threshold (about twice the largest array it has served by
mmap: ~0.4 MB on Cora), ``free`` gives that memory back to the kernel, and the next step's first
touches fault it in again.  Whether it happens depends on where the heap's top lands, so it differs
from process to process: measured on the Cora GCN demo (compiled, fresh processes), 2 of 8
processes took 156-191 minor page faults per epoch and ran their epochs at 1.7-1.9 ms, the others
none at 1.2-1.4 ms (earlier runs: 119-186 faults, 2.0-3.2 ms; eager epochs: 1 process of 10, 42
faults per epoch) -- on a virtual machine a fault can cost a host fault too.

With ``M_TOP_PAD`` at 16 MiB (glibc keeps that much of the heap's top when it trims, and grows it
by as much) no process faulted (8 of 8).  Setting it freezes glibc's mmap threshold, which otherwise
rises to the largest block it has freed (an array above the threshold is a fresh mmap, every page
faulted in at each allocation: 59 faults per 240 KB array at the default 128 KiB), so the threshold
is set too, to the pool's floor (``MIN_BYTES``, 8 MiB): arrays below it come from the heap, larger
ones from mmap and the pool, as the pool expects.

:func:`keep_heap_top` sets both once per process, the first time a pure replay is prepared or
``fit`` trains (in any mode, so that eager and compiled epochs run on the same allocator settings);
it costs at most 16 MiB of resident memory a process would otherwise return.  Only with glibc
(other C libraries: nothing); ``POLYGRAD_MALLOC_TOP_PAD=0`` turns it off, another number of bytes
sets the padding.
"""
from __future__ import annotations

import ctypes
import os
import sys
import warnings

from .pool import MIN_BYTES

#: glibc's ``mallopt`` parameters (malloc.h): the heap's top padding, the mmap threshold
M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3
#: bytes glibc keeps at the top of the heap when trimming (and adds when growing it)
TOP_PAD_BYTES = 16 << 20
ENV_VAR = "POLYGRAD_MALLOC_TOP_PAD"

_done = False


def _glibc() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # the name is unknown where the C library is not glibc
        return False


def top_pad_bytes() -> int:
    """The padding to set: ``POLYGRAD_MALLOC_TOP_PAD`` (0: leave malloc alone), else 16 MiB."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return TOP_PAD_BYTES
    try:
        pad = int(value)
    except ValueError:
        pad = -1
    if pad < 0:
        warnings.warn(f"{ENV_VAR}={value!r} is not a number of bytes >= 0 (0 leaves malloc alone): "
                      f"using the default, {TOP_PAD_BYTES}", stacklevel=2)
        return TOP_PAD_BYTES
    return pad


def keep_heap_top() -> bool:
    """Set glibc's ``M_TOP_PAD`` once per process (see the module docstring); whether it was set."""
    global _done
    if _done:
        return False
    _done = True
    pad = top_pad_bytes()
    return bool(pad) and _glibc() and _set_top_pad(pad)


def _set_top_pad(pad: int) -> bool:
    try:
        mallopt = ctypes.CDLL(None).mallopt
        # the threshold first: setting either stops glibc from raising it as blocks are freed
        return bool(mallopt(M_MMAP_THRESHOLD, ctypes.c_int(MIN_BYTES))
                    and mallopt(M_TOP_PAD, ctypes.c_int(min(pad, 2**31 - 1))))
    except (OSError, AttributeError):  # no mallopt to call
        return False
