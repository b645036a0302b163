"""polygrad's exceptions, at their public path (``from polygrad.errors import ShapeError``).

They are defined in :mod:`polygrad.ir.errors`, the bottom layer every other one imports; named here
one by one so type checkers and editors see them (tests/unit/test_architecture.py keeps the list whole)."""
from .ir.errors import (  # noqa: F401  (re-exported)
    ArgumentError, BackendError, BackendUnavailableError, CheckpointError, ConformanceError, DTypeError, DataError,
    FallbackWarning, GraphError, IndexOutOfRangeError, MemoryBudgetError, MixedBackendError, NonFiniteError,
    PluginWarning, PolygradError, ShapeError, SparseIndexError, describe_exception,
)

__all__ = [
    "ArgumentError", "BackendError", "BackendUnavailableError", "CheckpointError", "ConformanceError", "DTypeError",
    "DataError", "FallbackWarning", "GraphError", "IndexOutOfRangeError", "MemoryBudgetError",
    "MixedBackendError", "NonFiniteError", "PluginWarning", "PolygradError", "ShapeError", "SparseIndexError",
    "describe_exception",
]
