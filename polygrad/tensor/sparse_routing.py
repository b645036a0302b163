"""How the dense API reaches the sparse one.

``polygrad.sparse`` sits above this package (its SparseTensor is a Tensor), so the dense functions
route sparse operands through a table the sparse package fills when it is imported (``import
polygrad`` imports it, before any tensor exists)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeGuard


from ..ir.errors import PolygradError

from .args import Tensor

if TYPE_CHECKING:  # the sparse package sits above this one (it imports Tensor)
    from ..sparse import SparseTensor


# -- sparse operands ------------------------------------------------------------------------------
# polygrad.sparse sits above this module (its SparseTensor is a Tensor), so the dense API reaches
# the sparse one through this table, which the sparse package fills when it is imported
# (``import polygrad`` imports it, before any tensor exists).
_SPARSE_API: dict[str, Callable[..., Any]] = {}


def register_sparse_api(**functions: Callable[..., Any]) -> None:
    """Called once by ``polygrad.sparse``: the functions Tensor routes sparse operands to."""
    _SPARSE_API.update(functions)


def _sparse(name: str) -> Callable[..., Any]:
    try:
        return _SPARSE_API[name]
    except KeyError:
        raise PolygradError(f"the sparse API ({name}) is not loaded: "
                            "import polygrad, not polygrad.tensor alone") from None


def _sparse_binary(name: str, a: Any, b: Any) -> Any:
    return _sparse(name)(a, b)


def is_sparse(x: Any) -> TypeGuard[SparseTensor]:
    """Whether ``x`` is a sparse tensor (a :class:`~polygrad.sparse.SparseTensor`)."""
    return isinstance(x, Tensor) and x.layout != "dense"
