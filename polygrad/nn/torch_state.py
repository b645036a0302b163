"""PyTorch / PyG state dicts: load them into polygrad modules and export polygrad modules as them.

polygrad stores a linear map as ``y = x @ W`` with ``W`` of shape ``[in, out]`` (no transpose in
the forward or backward pass); PyTorch's ``Linear.weight`` is ``[out, in]``.  The layers that take
PyG's names also take PyG's parameter names, so a PyG checkpoint maps onto them key by key with
three adjustments, applied here and nowhere else:

* every ``Linear.weight`` (and GCNConv's / GATConv's weight matrix) is transposed;
* a few parameters that polygrad names or shapes differently are renamed or given torch's shape
  (:data:`TORCH_LAYOUT`: GCNConv's ``weight`` is PyG's ``lin.weight``; GATConv's ``att_src`` is
  ``[H, C]`` where PyG's is ``[1, H, C]``);
* a polygrad ``Sequential`` keeps its modules in ``layers``; torch's ``Sequential`` numbers them
  directly (``nn.layers.0.weight`` is torch's ``nn.0.weight``).

    sd = pyg_model.state_dict()
    nn.load_torch_state_dict(pg_model, sd)                    # torch tensors or numpy arrays
    pyg_model.load_state_dict(nn.torch_state_dict(pg_model, as_torch=True))

torch is never imported here unless ``as_torch=True`` is asked for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from polygrad.ir.errors import CheckpointError, ShapeError
from polygrad.tensor import Tensor

from .convs import GATConv
from .gcn import GCNConv
from .layers import Linear, Sequential
from .module import Module

__all__ = ["load_torch_state_dict", "torch_state_dict", "torch_names", "TORCH_LAYOUT"]

#: per module type: polygrad attribute -> (torch attribute, how the array changes)
#: "transpose": polygrad [in, out] <-> torch [out, in]; "lead1": torch's shape has a leading 1
TORCH_LAYOUT: dict[type, dict[str, tuple[str, str]]] = {
    Linear: {"weight": ("weight", "transpose")},
    GCNConv: {"weight": ("lin.weight", "transpose")},
    GATConv: {"weight": ("lin.weight", "transpose"), "att_src": ("att_src", "lead1"),
              "att_dst": ("att_dst", "lead1")},
}


@dataclass(frozen=True)
class _Entry:
    name: str            # polygrad state-dict key
    torch_name: str      # PyTorch / PyG state-dict key
    change: str          # "", "transpose" or "lead1"
    shape: tuple         # polygrad shape


def _module_torch_names(module: Module) -> dict[str, tuple[str, Module]]:
    """polygrad module name -> (torch module name, module), parents before children."""
    out: dict[str, tuple[str, Module]] = {"": ("", module)}
    for name, sub in module.named_modules():
        if not name:
            continue
        parent = name.rpartition(".")[0]
        while parent not in out:  # a module inside a list: "lins.0" has parent "" via "lins"
            parent = parent.rpartition(".")[0]
        torch_parent, parent_module = out[parent]
        rel = name[len(parent) + 1:] if parent else name
        if isinstance(parent_module, Sequential) and rel.startswith("layers."):
            rel = rel[len("layers."):]
        out[name] = (f"{torch_parent}.{rel}" if torch_parent else rel, sub)
    return out


def _plan(module: Module) -> list[_Entry]:
    modules = _module_torch_names(module)
    entries = []
    for name, value in module.state_dict().items():
        owner, _, attr = name.rpartition(".")
        while owner not in modules:  # a tensor inside a list attribute ("weights.0")
            owner, _, head = owner.rpartition(".")
            attr = f"{head}.{attr}"
        torch_owner, owner_module = modules[owner]
        torch_attr, change = attr, ""
        for kind in type(owner_module).__mro__:
            rule = TORCH_LAYOUT.get(kind, {}).get(attr)
            if rule is not None:
                torch_attr, change = rule
                break
        if change == "transpose" and len(value.shape) != 2:
            change = ""
        torch_name = f"{torch_owner}.{torch_attr}" if torch_owner else torch_attr
        entries.append(_Entry(name, torch_name, change, tuple(value.shape)))
    return entries


def torch_names(module: Module) -> dict[str, str]:
    """``{polygrad state-dict key: PyTorch/PyG key}`` for ``module``."""
    return {e.name: e.torch_name for e in _plan(module)}


def _host(value: Any, key: str) -> np.ndarray:
    """A torch tensor, polygrad tensor or array-like as a numpy array (torch is not imported)."""
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - anything unconvertible is a bad checkpoint
        raise CheckpointError(f"load_torch_state_dict: entry {key!r} is not array-like: {exc}") from None


def _to_polygrad(array: np.ndarray, entry: _Entry) -> np.ndarray:
    if entry.change == "transpose":
        array = array.T
    elif entry.change == "lead1" and array.shape[:1] == (1,):
        array = array[0]
    if tuple(array.shape) != entry.shape:
        raise ShapeError(f"load_torch_state_dict: {entry.torch_name!r} has shape {tuple(array.shape)} "
                         f"({'transposed, ' if entry.change == 'transpose' else ''}as polygrad stores it) but "
                         f"polygrad's {entry.name!r} is {entry.shape}")
    return array


def load_torch_state_dict(module: Module, state: Mapping[str, Any], strict: bool = True) -> Module:
    """Load a PyTorch / PyG ``state_dict`` (torch tensors or arrays) into ``module``; returns it.

    Keys are mapped by :func:`torch_names`, weights transposed to polygrad's ``[in, out]``.
    ``strict`` (default) raises :class:`~polygrad.errors.CheckpointError` naming the torch keys
    the module lacks and those the state has no use for; a shape that does not fit is a
    :class:`~polygrad.errors.ShapeError` naming both keys.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"load_torch_state_dict expects a mapping of names to tensors, got "
                              f"{type(state).__name__}")
    plan = _plan(module)
    wanted = {e.torch_name for e in plan}
    missing = [e.torch_name for e in plan if e.torch_name not in state]
    unexpected = [k for k in state if k not in wanted]
    if strict and (missing or unexpected):
        raise CheckpointError(f"load_torch_state_dict into {type(module).__name__}: missing torch keys "
                              f"{missing}, unexpected torch keys {unexpected}")
    converted = {e.name: _to_polygrad(_host(state[e.torch_name], e.torch_name), e)
                 for e in plan if e.torch_name in state}
    module.load_state_dict(converted, strict=False)
    return module


def torch_state_dict(module: Module, as_torch: bool = False,
                     values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``module``'s state under PyTorch / PyG keys and layouts (numpy arrays; torch tensors when
    ``as_torch=True``, which imports torch).  ``values`` (polygrad key -> tensor/array, e.g. the
    parameters' gradients) replaces the module's own state: the same keys, converted alike."""
    source = module.state_dict() if values is None else values
    out: dict[str, Any] = {}
    for entry in _plan(module):
        if entry.name not in source or source[entry.name] is None:
            continue
        array = np.array(_host(source[entry.name], entry.name))
        if entry.change == "transpose":
            array = np.ascontiguousarray(array.T)
        elif entry.change == "lead1":
            array = array[None]
        out[entry.torch_name] = array
    if as_torch:
        import torch  # optional: only when asked for torch tensors
        convert: Callable[[np.ndarray], Any] = torch.from_numpy
        out = {k: convert(v) for k, v in out.items()}
    return out
