"""polygrad: automatic differentiation for sparse, irregular data.

    import polygrad as pg
    x = pg.tensor([[1.0, 2.0]], requires_grad=True)
    (x @ x.T).sum().backward()

Backends (scalar, numpy, cupy, third-party) arrive through the pluggy entry-point group
``polygrad``; see ``pg.list_backends()``.
"""
from __future__ import annotations

from . import errors
from .engine.autodiff import backward, enable_grad, grad, no_grad
from .runtime.backend import Backend, KernelOverride
from .runtime.config import config
from .engine.dispatch import is_grad_enabled, reset_stats, stats
from .ir.dtypes import bool_, default_float, float32, float64, int32, int64
from .ir.errors import FallbackWarning
from .runtime.hookspecs import hookimpl
from .tensor.interop import from_dlpack
from .ir.ops import Op, list_ops
from .runtime.registry import (
    get_backend, get_kernel, kernel_table, list_backends, register_plugin, set_backend, unregister_plugin,
    use_backend,
)
from .tensor import (
    Tensor, abs, arange, argmax, argmin, cat, clip, concat, cross_entropy, div, expand, flatten, full, index_add,
    index_put, masked_fill, nonzero,
    log_softmax, logsumexp, manual_seed, matmul, max, maximum, mean, min, minimum, mse, mul, ones,
    ones_like, permute, pow, rand, randn, reshape, rng, sigmoid, softmax, squeeze, stack, sub, sum, tensor,
    transpose, unsqueeze, where, zeros, zeros_like, add,
)
from .tensor import from_numpy
from .engine.value import Value
from .tensor.lazy import materialize
from .runtime.monitor import monitor
from .tensor.draw import draw_graph
from .io.checkpoint import load, save
from .compile import compile  # noqa: A004 - pg.compile, like torch.compile
from .runtime.threads import get_num_threads, set_num_threads

__version__ = "0.1.0"

# Sparse API: constructors, layout policy (polygrad.sparse).
from .sparse import *  # noqa: E402,F401,F403
from .sparse import __all__ as _sparse_all  # noqa: E402
# Graph primitives (SDDMM, edge softmax, gather/scatter) and activations: composites of the above.
from .tensor.activations import elu, gelu, leaky_relu, softplus  # noqa: E402
from .sparse.graph_ops import edge_softmax, gather, scatter, sddmm  # noqa: E402
from .sparse import maybe_sparsify_for_matmul  # noqa: E402  (the layout policy, for nn layers)

__all__ = [
    "Backend", "KernelOverride", "Op", "Tensor", "Value", "FallbackWarning", "abs", "add", "arange",
    "argmax", "argmin", "backward", "bool_", "from_numpy", "cat", "clip", "concat", "config", "cross_entropy",
    "default_float",
    "div", "enable_grad", "errors", "expand", "flatten", "float32", "float64", "full", "get_backend",
    "from_dlpack", "grad", "hookimpl", "index_add", "index_put", "masked_fill", "nonzero", "int32", "int64",
    "is_grad_enabled", "list_backends", "list_ops",
    "log_softmax", "logsumexp", "manual_seed", "matmul", "max", "maximum", "mean", "min", "minimum",
    "mse", "mul", "no_grad", "ones", "ones_like", "permute", "pow", "rand", "randn", "register_plugin",
    "reset_stats", "reshape", "set_backend", "sigmoid", "softmax", "squeeze", "stack", "stats", "sub",
    "sum", "tensor", "transpose", "unregister_plugin", "unsqueeze", "use_backend", "where", "zeros",
    "zeros_like", "save", "load", "materialize", "monitor", "draw_graph", "compile", "get_kernel", "kernel_table",
    "rng", "maybe_sparsify_for_matmul", *_sparse_all,
    "elu", "gelu", "leaky_relu", "softplus", "edge_softmax", "gather", "scatter", "sddmm",
    "get_num_threads", "set_num_threads",
]


import sys as _sys  # noqa: E402
from . import engine, io, ir, runtime  # noqa: E402
from . import sparse as _sparse_pkg  # noqa: E402
_tensor_pkg = _sys.modules[f"{__name__}.tensor"]  # pg.tensor is the function


def _keep_old_module_paths() -> None:
    """The core's modules moved into subpackages (ir, runtime, engine, tensor, sparse, io); their
    old paths (``polygrad.ir.ops``, ``polygrad.runtime.registry``, ...) still import, as the same module
    objects, so code written against them keeps working, and stay attributes of ``polygrad``
    (``pg.registry``) except where a public name took that attribute before the move too
    (``pg.monitor`` and ``pg.config`` stay the function and the settings)."""
    moved = {
        "ops": ir.ops, "dtypes": ir.dtypes, "backend": runtime.backend, "hookspecs": runtime.hookspecs,
        "registry": runtime.registry, "events": runtime.events, "config": runtime.config, "memory": runtime.memory,
        "array_pool": runtime.pool, "threads": runtime.threads, "sharing": runtime.sharing,
        "monitor": runtime.monitor, "inference": engine.inference, "grad_rules": engine.grad_rules,
        "reference": engine.reference, "value": engine.value, "scalar_math": engine.scalar_math,
        "graph": engine.graph, "autodiff": engine.autodiff, "dispatch": engine.dispatch,
        "torch_names": _tensor_pkg.torch_names, "activations": _tensor_pkg.activations, "interop": _tensor_pkg.interop,
        "lazy": _tensor_pkg.lazy, "draw": _tensor_pkg.draw, "pattern": _sparse_pkg.pattern,
        "graph_ops": _sparse_pkg.graph_ops, "checkpoint": io.checkpoint,
    }
    package = _sys.modules[__name__]
    for old, module in moved.items():
        _sys.modules.setdefault(f"{__name__}.{old}", module)
        if not hasattr(package, old):
            setattr(package, old, module)



_keep_old_module_paths()
