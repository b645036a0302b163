"""The polygrad exception hierarchy.

Every error polygrad raises on purpose is a :class:`PolygradError`.  The ones caused by bad
user input also subclass the matching builtin (``ValueError``, ``TypeError``, ``MemoryError``)
so ordinary Python handling keeps working.  Messages name the op, the shapes, layouts and
backends involved, and what was expected.
"""
from __future__ import annotations


class PolygradError(Exception):
    """Base class of every error polygrad raises on purpose."""


class ShapeError(PolygradError, ValueError):
    """Operand shapes do not fit the op (raised before any kernel runs)."""


class DTypeError(PolygradError, TypeError):
    """Operand dtypes do not fit the op (raised before any kernel runs)."""


class SparseIndexError(PolygradError, ValueError):
    """Sparse indices / indptr are malformed, out of range or of an unusable dtype."""


class MixedBackendError(PolygradError, ValueError):
    """Operands of one op live on different backends; move one explicitly with ``t.to(name)``."""


class BackendUnavailableError(PolygradError, RuntimeError):
    """The requested backend is unknown, failed to load, or cannot run on this machine."""


class BackendError(PolygradError, RuntimeError):
    """A backend kernel failed and no fallback could serve the op."""


class GraphError(PolygradError, RuntimeError):
    """Misuse of the autodiff graph (second backward without retain_graph, grad of a non-scalar...)."""


class MemoryBudgetError(PolygradError, MemoryError):
    """An op would need more memory than ``pg.config.memory_fraction`` of what is available."""


class NonFiniteError(PolygradError, ValueError):
    """Input values contain NaN or Inf where they are not allowed."""


class CheckpointError(PolygradError, ValueError):
    """A checkpoint file is missing, corrupt, or holds something polygrad will not load."""


class DataError(PolygradError, ValueError):
    """A dataset file is missing, malformed, or unsafe to load."""


class ConformanceError(PolygradError, AssertionError):
    """A backend disagrees with the reference (raised by polygrad.testing)."""


class FallbackWarning(UserWarning):
    """A backend kernel failed and polygrad recomputed the op by scalar decomposition."""


class PluginWarning(UserWarning):
    """A plugin misbehaved (e.g. an event hook raised) and polygrad disabled the faulty part."""


class IndexOutOfRangeError(PolygradError, IndexError):
    """An index (getitem, gather) is outside the tensor's shape."""


class ArgumentError(PolygradError, ValueError):
    """An argument's value is outside what the op accepts (a reduction name, a smoothing factor,
    one of PyTorch's deprecated options that polygrad does not take)."""


__all__ = [name for name in dir() if name.endswith(("Error", "Warning"))]


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``: how a plugin's or a device's failure is reported
    in one line (``pg.list_backends()`` reasons, fallback events)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
