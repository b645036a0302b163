"""Row blocks: how every array and every sparse pattern of the ``dask`` backend is split.

The split is a function of the number of rows only (``partitions`` near-equal blocks), so all
``N x F`` arrays of one graph share their row blocks, a pattern's row blocks line up with its
outputs and its column blocks with its dense operand, and elementwise ops never re-chunk.
"""
from __future__ import annotations

import os

#: row blocks per array; ``DaskBackend.connect`` raises it to the number of workers
partitions: int = int(os.environ.get("POLYGRAD_DASK_PARTITIONS", "2"))
#: fewest rows per block: smaller arrays (weights, biases, optimizer state) stay one block, since
#: splitting them only adds tasks (and per-task scheduling costs more than the work)
min_block_rows: int = int(os.environ.get("POLYGRAD_DASK_MIN_BLOCK_ROWS", "1024"))


def set_partitions(n: int) -> None:
    global partitions
    if int(n) < 1:
        raise ValueError(f"polygrad-dask: partitions must be >= 1, got {n}")
    partitions = int(n)


def row_chunks(n: int) -> tuple[int, ...]:
    """Block sizes of ``n`` rows: ``partitions`` blocks, fewer when blocks would be smaller than
    ``min_block_rows``."""
    blocks = max(1, min(partitions, n // max(min_block_rows, 1)))
    base, extra = divmod(n, blocks)
    return tuple(base + (1 if i < extra else 0) for i in range(blocks))


def bounds(n: int) -> list[int]:
    """Row boundaries ``[0, b1, ..., n]`` of :func:`row_chunks`."""
    out = [0]
    for size in row_chunks(n):
        out.append(out[-1] + size)
    return out


def chunks_for(shape: tuple[int, ...]) -> tuple:
    """dask ``chunks`` for an array of ``shape``: row blocks on axis 0, whole along the others."""
    if not shape:
        return ()
    return (row_chunks(shape[0]),) + tuple((s,) for s in shape[1:])
