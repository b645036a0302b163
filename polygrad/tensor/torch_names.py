"""PyTorch's argument names where they mean what numpy's do: ``dim=`` for ``axis=``, ``keepdim=``
for ``keepdims=``.

polygrad's ops take numpy's names (``x.sum(axis=0, keepdims=True)``); PyTorch users write
``x.sum(dim=0, keepdim=True)``.  Rather than widening every signature, :func:`accept_torch_names`
wraps a function once: a ``dim=``/``keepdim=`` keyword is renamed to the parameter it means, and
giving both spellings of one argument is a ``TypeError`` naming the function.

Where polygrad means something else on purpose, the name is *not* aliased and the docstring says
so: ``max(dim=...)``/``min(dim=...)`` return the values only (numpy's ``amax``, PyTorch's
``torch.amax``), not PyTorch's ``(values, indices)`` pair -- use ``argmax``/``argmin`` for the
indices.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

__all__ = ["accept_torch_names", "TORCH_NAMES"]

#: PyTorch's name -> polygrad's (numpy's) name of the same argument
TORCH_NAMES = {"dim": "axis", "keepdim": "keepdims"}

F = TypeVar("F", bound=Callable[..., Any])


def accept_torch_names(fn: F, name: str | None = None) -> F:
    """``fn`` also accepting PyTorch's ``dim=``/``keepdim=`` for its ``axis=``/``keepdims=``."""
    params = list(inspect.signature(fn).parameters)
    renames = {torch: ours for torch, ours in TORCH_NAMES.items() if ours in params and torch not in params}
    if not renames:
        return fn
    position = {ours: params.index(ours) for ours in renames.values()}
    label = name or fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            for torch, ours in renames.items():
                if torch in kwargs:
                    if ours in kwargs or len(args) > position[ours]:
                        raise TypeError(f"{label}() got both {torch}= (PyTorch's name) and {ours}= (numpy's) "
                                        "for the same argument; pass one of them")
                    kwargs[ours] = kwargs.pop(torch)
        return fn(*args, **kwargs)

    wrapper.__torch_names__ = renames  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
