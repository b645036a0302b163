"""The Backend contract: what a backend (built-in or third-party) supplies.

A backend owns an array type and a table of *forward kernels* keyed by ``(op, layout)``.  It does
not implement gradients: every op's VJP is written once in polygrad ops (``grad_rules.py``), so a
backend that can run the forward kernels can run the backward too.  It may add *fused backward
kernels* (``vjp_kernels``) where that is faster; polygrad prefers them and the conformance kit
checks them against the rule.

Kernel calling convention: ``kernel(*input_arrays, **attrs) -> array``; the attrs of each op are
documented in ``polygrad.ir.ops`` / ``polygrad.engine.inference``.  A kernel may return anything the backend's
``shape``/``dtype`` understand; dispatch checks the result against the op's inference.

Fused backward convention: ``vjp(grad_out, *input_arrays, needs=(bool, ...), **attrs)`` returns a
tuple with one array (or None) per input; ``needs[i]`` says whether input i wants a gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..ir.errors import BackendError
from ..ir.ops import ELEMENTWISE, Op, array_function_names

Kernel = Callable[..., Any]

#: DLPack device types (``DLDeviceType`` in dlpack.h), for :attr:`Backend.dlpack_devices`
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLROCM, KDLCUDAMANAGED = 1, 2, 3, 10, 13
#: device types whose memory the host can read directly (numpy imports them zero-copy)
HOST_DLPACK_DEVICES = (KDLCPU, KDLCUDAHOST)


class Backend:
    """Base class for backends.  Subclass, set ``name``, fill ``kernels`` and the array methods."""

    #: unique name users select it by (``pg.set_backend(name)``, ``t.to(name)``)
    name: str = ""
    #: one-line human description shown by ``polygrad backends``
    description: str = ""
    #: install hint shown when the backend is unavailable
    install_hint: str = ""
    #: whether ``pg.compile`` may replay this backend's kernels: they must be pure functions of
    #: their inputs and attrs (docs/writing-a-backend.md, "Replay"); False keeps steps eager
    supports_replay: bool = True
    #: the default backend (no ``use_backend``/``set_backend``/``$POLYGRAD_BACKEND``) is the
    #: registered one with the highest priority, ties broken by name
    default_priority: int = 0
    #: backends a failing kernel is rerouted to, in order, before scalar decomposition
    #: (``pg.config.fallback_chain[name]`` overrides it)
    fallback_chain: tuple[str, ...] = ()
    #: DLPack device types (``KDLCPU``, ``KDLCUDA``, ...) whose data :meth:`from_dlpack` imports
    #: without a copy; ``pg.from_dlpack`` puts data on such a device here by default
    dlpack_devices: tuple[int, ...] = ()
    #: the dtypes (numpy names) this backend's arrays and kernels support; None (the default):
    #: every dtype polygrad does.  A float32-only backend is valid (``("float32", "int32", "bool")``):
    #: the contract probe and the conformance kit test exactly what is declared, and ``pg.tensor``
    #: refuses to put another dtype on it (:class:`~polygrad.errors.DTypeError` naming the declared
    #: ones) instead of computing in it
    dtypes: tuple[str, ...] | None = None
    #: True when nothing ever writes into this backend's arrays (JAX arrays, task graphs): polygrad
    #: then shares them where it would otherwise copy through the host -- ``fit()``'s best-epoch
    #: snapshots, ``pg.tensor`` of one of its arrays.  ``lazy`` backends are treated as immutable too
    immutable: bool = False
    #: optional: ``random_mask(k0, k1, *, shape, dtype, drop_below, scale)``, dropout's mask drawn by
    #: the backend itself (on its device) from a key: ``scale`` where a 16-bit random draw is
    #: ``>= drop_below``, else 0, of ``shape`` and ``dtype``.  It must be a pure function of its
    #: arguments (the same key gives the same mask, traced or not); ``k0``, ``k1`` are numbers in
    #: ``[0, 2**31)`` drawn from ``pg.manual_seed``'s generator, one word per mask.  Declared, dropout
    #: uses it instead of drawing on the host and uploading (its stream is then the backend's own, still
    #: reproducible from a seed), and a backend that compiles whole steps traces it into the step.
    random_mask: Callable[..., Any] | None = None

    def __init__(self) -> None:
        # keyed by (op, layout); op is a polygrad.ir.ops.Op (a str enum) or its name
        self.kernels: dict[tuple[Any, str], Kernel] = {}
        self.vjp_kernels: dict[tuple[Any, str], Kernel] = {}

    # -- availability -----------------------------------------------------------------------
    def is_available(self) -> bool:
        """True when this backend can run here.  Called lazily; may be slow the first time."""
        return True

    def unavailable_reason(self) -> str:
        """Why ``is_available()`` is False (shown by ``pg.list_backends()``)."""
        return "not available"

    # -- arrays -------------------------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        """Make a backend array from a numpy array (dtype preserved)."""
        raise NotImplementedError

    def to_numpy(self, array: Any) -> np.ndarray:
        """Copy (or view) a backend array as a numpy array."""
        raise NotImplementedError

    def owns(self, array: Any) -> bool:
        """Whether ``array`` is this backend's native array type (lets pg.tensor accept it as is)."""
        return False

    def shape(self, array: Any) -> tuple[int, ...]:
        return tuple(array.shape)

    def dtype(self, array: Any) -> np.dtype:
        return np.dtype(array.dtype)

    def from_dlpack(self, obj: Any) -> Any:
        """A backend array over a DLPack producer's data on one of :attr:`dlpack_devices`
        (zero-copy).  The default reads host memory through numpy and hands it to
        :meth:`from_numpy`.  Raise TypeError/BufferError/ValueError when the data cannot be taken."""
        return self.from_numpy(np.from_dlpack(obj))

    # -- memory -------------------------------------------------------------------------------
    def memory_used(self, device: int = 0) -> int | None:
        """Bytes this backend's arrays hold on ``device``; None when they live in host memory
        (the process's RSS already counts them).  Shown by ``pg.monitor``."""
        return None

    def memory_available(self, device: int = 0) -> int | None:
        """Bytes this backend can still allocate on ``device``, or None to use host memory (psutil)."""
        return None

    # -- lazy and remote backends -------------------------------------------------------------
    #: True when kernels only *describe* work (a task graph) that runs later, on ``to_numpy`` or
    #: ``materialize``.  ``fit`` then runs backward before reading the loss, so one
    #: materialisation computes the forward pass once for the loss and the gradients.  A lazy
    #: backend's arrays are immutable values (nothing writes into them), so a snapshot may share them.
    lazy: bool = False

    def materialize(self, arrays: list) -> list:
        """Compute ``arrays`` (and keep the results where they are: device, workers) in one go.

        Returns arrays equal in value whose pending work is done, so an array that is reused
        step after step (a parameter, a gradient, optimizer state) does not carry the whole
        history of its computation.  Optimizers call it once per ``step()`` on every parameter
        and state array, ``fit`` once per epoch on the loss and the gradients; arrays computed
        together share their common work.  Eager backends keep the default: the identity.
        """
        return list(arrays)

    def submit(self, arrays: list) -> list:
        """Start computing ``arrays`` and return at once: arrays equal in value whose work is under
        way (``pg.materialize(..., wait=False)``).  ``fit`` submits the next epoch's step before it
        reads this epoch's loss, so the next step's task graph is built and handed over while the
        workers still compute.  A later :meth:`materialize` of the returned arrays waits for them and
        raises what failed; reading one (``to_numpy``) waits too.  The default computes them now
        (:meth:`materialize`): correct for any backend, only without the overlap."""
        return self.materialize(arrays)

    def apply_update(self, fn: Callable[..., tuple], arrays: tuple, numbers: tuple, attrs: dict) -> tuple | None:
        """An optimizer's elementwise update rule, ``fn(*arrays, *numbers, **attrs)`` (a tuple of
        arrays shaped as ``arrays``, which all have one shape), run as a whole on this backend's
        arrays, or None: the optimizer then applies it op by op.  A lazy backend may run the rule as
        one task per block instead of a task per op; its numbers must be those ``fn`` gives.
        The default is None."""
        return None

    def connect(self, *, scheduler: str | None = None, workers: int | None = None) -> Any:
        """Start or join the cluster a distributed backend runs on (``polygrad demo --workers N``
        / ``--scheduler ADDRESS``); returns an object whose ``close()`` releases it.  Raises
        :class:`~polygrad.errors.BackendUnavailableError` naming the address when it cannot be
        reached.  Single-process backends keep the default, which refuses."""
        raise BackendError(f"backend {self.name!r} runs in this process: --workers/--scheduler need a "
                           "backend that runs on a cluster")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


@dataclass(frozen=True)
class KernelOverride:
    """A kernel a plugin contributes to an existing backend (see hook ``polygrad_kernels``)."""
    backend: str
    op: str
    layout: str
    kernel: Kernel
    priority: int = 10
    #: "forward" (a forward kernel) or "vjp" (a fused backward kernel)
    kind: str = "forward"


# -- the array contract, checked once per backend -------------------------------------------------------
# Every op goes through from_numpy / shape / dtype / to_numpy, so a backend that gets one of them
# wrong fails *every* op with an error naming none of them (e.g. a dtype() left returning the
# framework's own dtype: "Cannot interpret 'torch.float64' as a data type").  The registry probes
# them once, when the backend is first checked, and reports the method and what it must return.
_PROBES = (np.arange(6, dtype=np.float64).reshape(2, 3), np.array([3, -1, 7], dtype=np.int64),
           np.array(0.5, dtype=np.float32))
_KNOWN_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


#: the dtypes a backend that declares none (``dtypes = None``) is checked at
DEFAULT_DTYPES = ("float64", "float32", "int64", "int32", "bool")


def declared_dtypes(backend: "Backend") -> tuple[str, ...]:
    """The dtypes ``backend`` declares, or :data:`DEFAULT_DTYPES` when it declares none."""
    return DEFAULT_DTYPES if backend.dtypes is None else tuple(backend.dtypes)


def sum_dtype(backend: "Backend", dtype: np.dtype) -> np.dtype:
    """The dtype of an integer ``sum`` on ``backend`` where inference says ``dtype`` (int64:
    PyTorch's rule): on a backend that does not declare it, the widest integer dtype it declares
    (JAX without its 64-bit mode sums ints in int32, and so does polygrad there)."""
    if backend.dtypes is None or dtype.name in backend.dtypes:
        return dtype
    ints = [np.dtype(d) for d in backend.dtypes if np.dtype(d).kind == dtype.kind]
    return max(ints, key=lambda d: d.itemsize) if ints else dtype


def supports_dtype(backend: "Backend", dtype: np.dtype) -> bool:
    """Whether ``backend`` may hold arrays of ``dtype`` (every dtype when it declares none)."""
    return backend.dtypes is None or dtype.name in backend.dtypes


def overrides(backend: "Backend", method: str) -> bool:
    """Whether ``backend``'s class defines ``method`` itself rather than inheriting
    :class:`Backend`'s default (``submit``: it starts work without waiting for it)."""
    return getattr(type(backend), method) is not getattr(Backend, method)


def shares_arrays(backend: "Backend") -> bool:
    """Whether ``backend``'s arrays are immutable values (``immutable`` or ``lazy``): sharing one
    is as good as copying it."""
    return bool(backend.immutable or backend.lazy)


def dtype_problem(backend: "Backend") -> str:
    """"" when ``backend.dtypes`` is a valid declaration, else why not."""
    declared = getattr(backend, "dtypes", None)
    if declared is None:
        return ""
    if (not isinstance(declared, tuple) or not declared
            or any(not isinstance(d, str) or d not in _KNOWN_DTYPES for d in declared)):
        return (f"backend {backend.name!r}: dtypes must be a tuple of numpy dtype names among "
                f"{', '.join(_KNOWN_DTYPES)}, got {declared!r}")
    if not any(np.dtype(d).kind == "f" for d in declared):
        return f"backend {backend.name!r}: dtypes {declared!r} declares no float dtype (gradients need one)"
    return ""


def _probes(backend: "Backend") -> list[np.ndarray]:
    """The probe arrays for the dtypes ``backend`` declares (the widest float and int it has)."""
    declared = set(declared_dtypes(backend))
    floats = [d for d in ("float64", "float32", "float16") if d in declared]
    ints = [d for d in ("int64", "int32", "int16", "int8", "uint8") if d in declared]
    out = [_PROBES[0].astype(floats[0])]
    if ints:
        out.append(np.array([3, 1, 7], dtype=ints[0]))
    out.append(np.array(0.5, dtype=floats[-1]))
    return out


def _kind(x: Any) -> str:
    return f"{x!r:.80} (a {type(x).__module__}.{type(x).__qualname__})"


def contract_problem(backend: Backend) -> str:
    """"" when ``backend``'s array methods keep the contract, else one line naming the first method
    that breaks it and what it must return.  Runs ``from_numpy`` on three tiny arrays of the
    dtypes the backend declares (``Backend.dtypes``)."""
    name = f"backend {backend.name!r}"
    problem = dtype_problem(backend)
    if problem:
        return problem
    for probe in _probes(backend):
        what = f"a {probe.dtype} array of shape {probe.shape}"
        try:
            array = backend.from_numpy(probe)
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            return f"{name}: from_numpy({what}) raised {type(exc).__name__}: {exc}"
        if array is None:
            return f"{name}: from_numpy({what}) returned None; it must return the backend's array"
        for method, want, check in (
                ("shape", f"the shape as a tuple of ints, here {probe.shape}",
                 lambda r: isinstance(r, tuple) and r == probe.shape
                 and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in r)),
                ("dtype", f"a numpy.dtype, here numpy.dtype({str(probe.dtype)!r})",
                 lambda r: isinstance(r, np.dtype) and r == probe.dtype),
                ("to_numpy", f"a numpy.ndarray equal to the array given to from_numpy ({what})",
                 lambda r: isinstance(r, np.ndarray) and r.shape == probe.shape and r.dtype == probe.dtype
                 and np.array_equal(r, probe))):
            try:
                result = getattr(backend, method)(array)
            except Exception as exc:  # noqa: BLE001
                return f"{name}: {method}() raised {type(exc).__name__}: {exc}; it must return {want}"
            if not check(result):
                return f"{name}: {method}() returned {_kind(result)}; it must return {want}"
    return ""


def elementwise_kernels(xp: Any) -> dict[Op, Callable[..., Any]]:
    """The kernels of every elementwise primitive that the array namespace ``xp`` (numpy, cupy,
    dask.array, jax.numpy, an array-API namespace) computes with one of its own functions:
    ``{Op.EXP: xp.exp, Op.NEG: xp.negative, Op.LT: xp.less, ...}``.

    The one elementwise table: the built-in backends, the plugins and the backend guide start from
    it and add what a namespace lacks (``relu``, ``cast``) or computes differently, so a new
    elementwise op named like its array function reaches every backend without an edit.  A
    backend's kernels receive and return its own arrays, which is what these functions do."""
    table: dict[Op, Callable[..., Any]] = {}
    for op in sorted(ELEMENTWISE, key=str):
        fn = next((getattr(xp, name) for name in array_function_names(op) if hasattr(xp, name)), None)
        if fn is not None:
            table[op] = fn
    return table
