"""The backend conformance kit: every (op, layout) a backend provides, checked against the oracle.

For each kernel in the backend's table (its own and any plugin overrides) and each case of
:mod:`polygrad.testing.cases` for that op and layout, these checks run:

``forward``       the kernel's output (shape, dtype, values) vs the scalar reference, float64;
                  the kernel must not modify its inputs
``float32``       float32 inputs give the dtype inference promises, values within float32 tolerance
                  (long-row sparse cases: within a float32 sum's error bound of their row)
``integer``       floating inputs rounded to each integer dtype the backend declares
``grad-numeric``  the VJP through ``pg.grad`` on this backend vs central differences (float64)
``grad-scalar``   the same VJP vs ``Value.backward`` over the op's scalar decomposition
``errors``        bad input raises the documented polygrad error *before* the kernel runs
``fused-vjp``     a fused backward kernel (``backend.vjp_kernels``) vs the op's VJP rule

Full runs (``polygrad check NAME`` with no filter) also check the gradients at edge points
against PyTorch's conventions (:mod:`polygrad.testing.edges`) and, on a lazy backend, its
``materialize``/``submit`` contract (:mod:`polygrad.testing.lazy`).

A kernel that raises or whose output contradicts inference is a failure even though dispatch
would have served the op by fallback.  Known gaps are listed in xfail files (see
:func:`load_xfails`).  Run it::

    polygrad check numpy                 # table op x layout, exit status 1 on any failure
    python -m polygrad.testing.conformance numpy --op spmm -v
    pytest -p polygrad.testing.plugin --polygrad-backend numpy

or subclass the pytest base classes in :mod:`polygrad.testing.suite`.  Each check runs at the
dtypes the backend declares (``Backend.dtypes``, :func:`for_declared_dtypes`): a float32-only
backend skips the float64 checks and runs ``grad-scalar``/``fused-vjp`` in float32.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..engine import grad_rules
from ..engine import reference
from ..engine.autodiff import grad as pg_grad
from ..engine.autodiff import no_grad, unbroadcast
from ..runtime.backend import Backend, declared_dtypes, sum_dtype
from ..engine.dispatch import apply, kernel_dtypes
from ..ir.errors import FallbackWarning, PolygradError
from ..runtime.hookspecs import hookimpl
from ..engine.inference import infer
from ..ir.ops import Op, kernel_key
from ..runtime.registry import list_backends, registry
from ..tensor import tensor
from ..engine.value import Value, backward_many
from .edges import EDGE_CASES, check_edge_points
from .lazy import LAZY_CHECKS, check_lazy_contract, is_lazy
from .cases import BadCase, Case, bad_cases, cases
from .report import Report, Result  # noqa: F401 - public here too
from .xfails import XFAIL_FILE, XFail, find_xfail, load_xfails, parse_xfails  # noqa: F401 - public here too
from .grads import _explain, _seed_grad, compare, numerical_grad, vjp_grads

CHECKS = ("forward", "float32", "integer", "grad-numeric", "grad-scalar", "errors", "fused-vjp")


@dataclass(frozen=True)
class Tolerances:
    """Comparison tolerances (``|got - want| <= atol + rtol * |want|``) per check."""
    forward: tuple[float, float] = (1e-7, 1e-9)
    float32: tuple[float, float] = (2e-5, 1e-6)
    grad_numeric: tuple[float, float] = (1e-5, 1e-6)
    #: grad-scalar in float32, for a backend that declares no float64
    grad_float32: tuple[float, float] = (1e-4, 1e-5)
    grad_scalar: tuple[float, float] = (1e-7, 1e-9)
    fused_vjp: tuple[float, float] = (1e-7, 1e-9)
    eps: float = 1e-6


DEFAULT_TOLERANCES = Tolerances()


class CheckFailure(AssertionError):
    """One check failed; the message names op, layout, case and the largest error."""

    def __init__(self, message: str, max_error: float | None = None):
        super().__init__(message)
        self.max_error = max_error


class NotApplicable(Exception):
    """The check does not apply to this case (e.g. a gradient check of a non-differentiable case)."""


# -- backend access -----------------------------------------------------------------------------------

def resolve_backend(backend: str | Backend) -> str:
    """The registered name of ``backend`` (a name, or a registered Backend instance)."""
    if isinstance(backend, Backend):
        registry.load()
        entry = registry.entries.get(backend.name)
        if entry is None or entry.backend is not backend:
            raise PolygradError(f"backend {backend.name!r} is not registered; register it first "
                                "(an entry point, pg.register_plugin or polygrad.testing.temporary_plugin)")
        return backend.name
    registry.get(backend)  # raises BackendUnavailableError with the reason
    return backend


def provided(backend: str) -> set[tuple[Op, str]]:
    """The (op, layout) pairs ``backend``'s kernel table serves (its own kernels and overrides);
    a sparse kernel, keyed once under "csr", serves the "coo" label too."""
    registry.load()
    return _with_coo(registry.tables.get(backend, {}))


def fused(backend: str) -> set[tuple[Op, str]]:
    registry.load()
    return _with_coo(registry.vjp_tables.get(backend, {}))


def _with_coo(table: dict) -> set[tuple[Op, str]]:
    keys = set(table)
    return keys | {(op, "coo") for op, layout in keys if layout == "csr"}


def _kernel(backend: str, op: Op, layout: str):
    registry.load()
    return registry.tables.get(backend, {}).get(kernel_key(op, layout))


class _FallbackRecorder:
    """Listens to ``polygrad_fallback`` while a check runs: a provided kernel that failed is a failure."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, BaseException]] = []

    @hookimpl
    def polygrad_fallback(self, op: str, backend: str, layout: str, exception: BaseException) -> None:
        self.events.append((op, backend, layout, exception))


@contextmanager
def watching_fallbacks() -> Iterator[_FallbackRecorder]:
    """Record fallback events (and silence their warnings) for the duration of the block."""
    rec = _FallbackRecorder()
    registry.load()
    registry.register_plugin(rec, f"polygrad-conformance-recorder-{id(rec)}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FallbackWarning)
            yield rec
    finally:
        registry.unregister_plugin(rec)


def _raise_on_fallbacks(rec: _FallbackRecorder, backend: str, what: str) -> None:
    own = [(op, layout, exc) for op, be, layout, exc in rec.events
           if be == backend and (Op(op), layout) in provided(backend)]
    if own:
        op, layout, exc = own[0]
        raise CheckFailure(f"{what}: the backend's kernel (forward or fused backward) for op '{op}' ({layout}) "
                           f"failed and polygrad fell back: {type(exc).__name__}: {exc}")


# -- the checks ---------------------------------------------------------------------------------------

def _label(case: Case | BadCase, check: str) -> str:
    return f"op '{case.op.value}' ({case.layout}), case {case.name}, check {check}"


def reference_forward(case: Case) -> np.ndarray:
    """The scalar reference's output for ``case`` (float64 math; dtype as inference says)."""
    shapes = tuple(a.shape for a in case.inputs)
    _, dtype = infer(case.op, shapes, tuple(a.dtype for a in case.inputs), case.attrs)
    items, shape = reference.run(case.op, [(a.ravel().tolist(), a.shape) for a in case.inputs], case.attrs)
    data = reference.data_of(items)
    return np.asarray(data, dtype=np.float64 if dtype.kind == "f" else dtype).reshape(shape)


def _run_kernel(backend: str, case: Case, check: str) -> tuple[np.ndarray, np.dtype]:
    """Call the backend's kernel directly: (output as numpy, dtype inference expects)."""
    be = registry.get(backend)
    kernel = _kernel(backend, case.op, case.layout)
    if kernel is None:
        raise NotApplicable(f"backend {backend!r} provides no kernel for op '{case.op.value}' ({case.layout})")
    shape, dtype = infer(case.op, tuple(a.shape for a in case.inputs), tuple(a.dtype for a in case.inputs),
                         case.attrs)
    if case.op == Op.SUM and dtype.kind in "iu":  # as dispatch: an integer sum in a declared dtype
        dtype = sum_dtype(be, dtype)
    # operands as dispatch hands them to kernels: mixed dtypes already brought to one
    operands = [a.astype(d, copy=False) for a, d in
                zip(case.inputs, kernel_dtypes(case.op, tuple(a.dtype for a in case.inputs)))]
    arrays = [be.from_numpy(a.copy()) for a in operands]
    try:
        out = kernel(*arrays, **case.attrs)
    except Exception as exc:  # noqa: BLE001 - any kernel exception is the finding
        raise CheckFailure(f"{_label(case, check)}: kernel raised {type(exc).__name__}: {exc}") from exc
    got_shape, got_dtype = tuple(be.shape(out)), np.dtype(be.dtype(out))
    if got_shape != tuple(shape) or got_dtype != dtype:
        raise CheckFailure(f"{_label(case, check)}: kernel returned shape {got_shape} dtype {got_dtype}, "
                           f"inference expects shape {tuple(shape)} dtype {dtype}")
    for i, (arr, orig) in enumerate(zip(arrays, operands)):
        if not np.array_equal(be.to_numpy(arr), orig, equal_nan=orig.dtype.kind == "f"):
            raise CheckFailure(f"{_label(case, check)}: kernel modified its input {i} in place")
    return np.asarray(be.to_numpy(out)), dtype


def check_forward(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """Kernel output vs the scalar reference; returns the largest error."""
    got, _ = _run_kernel(backend, case, "forward")
    want = reference_forward(case)
    rtol, atol = tol.forward
    ok, err, where = compare(got, want, rtol, atol)
    if not ok:
        raise CheckFailure(_explain(f"{_label(case, 'forward')}: output disagrees with the scalar reference",
                                    got, want, err, where, rtol, atol, "backend", "reference"), err)
    return err


def check_float32(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """float32 inputs: output dtype as inference says (float32 stays float32), values close."""
    if not case.float32 or not any(a.dtype.kind == "f" for a in case.inputs):
        raise NotApplicable("no floating inputs")
    c32 = case.with_dtype(np.float32)
    got, _ = _run_kernel(backend, c32, "float32")  # checks the dtype inference promises
    want = reference_forward(c32)
    if case.accumulate:
        return _check_accumulation(c32, got, want)
    rtol, atol = tol.float32
    ok, err, where = compare(got, want, rtol, atol * max(1.0, float(np.max(np.abs(want), initial=0.0))
                                                          if want.dtype.kind == "f" else 1.0))
    if not ok:
        raise CheckFailure(_explain(f"{_label(case, 'float32')}: float32 output disagrees with the reference",
                                    got, want, err, where, rtol, atol, "backend", "reference"), err)
    return err


def _check_accumulation(case: Case, got: np.ndarray, want: np.ndarray) -> float:
    """Each output of a long-row case within what a float32 sum of its row may be off by:
    ``(n + 2) * eps32 * sum |terms|`` (n: the row's nonzeros; ``sum |terms|``: the op on the
    absolute inputs, float64).  Any summation order -- sequential, pairwise, blocked -- keeps it; a
    sum that mixes rows or loses precision across them does not."""
    pattern = case.attrs["pattern"]
    mag = reference_forward(Case(case.op, case.name, tuple(np.abs(a) for a in case.inputs), case.attrs,
                                 case.layout, case.grad, case.float32))
    n = np.diff(pattern.indptr).astype(np.float64).reshape((-1,) + (1,) * (want.ndim - 1))
    bound = (n + 2) * float(np.finfo(np.float32).eps) * mag
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= bound)
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise CheckFailure(
            f"{_label(case, 'float32')}: output {i} (row {i[0]}, {int(n.ravel()[i[0]])} nonzeros) is off by "
            f"{err[i]:.3g} from the float64 reference {want[i]:.9g}; a float32 sum of that row may be off by "
            f"at most {bound[i]:.3g} ((n+2)*eps32*sum|terms|): the kernel accumulates across rows or "
            "loses precision", float(err[i]))
    return float(np.max(err, initial=0.0))


def check_integer(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """The case at each integer dtype the backend declares (``Backend.dtypes``): floating inputs
    rounded to small integers of that dtype; exact where the output is an integer, else within
    float32 tolerance.  Ops whose inference refuses integers are not applicable."""
    if case.accumulate or not any(a.dtype.kind == "f" for a in case.inputs):
        raise NotApplicable("no floating inputs to cast (or a long-row case)")
    ints = [d for d in declared_dtypes(registry.get(backend)) if np.dtype(d).kind in "iu"]
    worst, ran = 0.0, False
    if not all(np.isfinite(a).all() for a in case.inputs if a.dtype.kind == "f"):
        raise NotApplicable("non-finite inputs have no integer form")
    for dtype in ints:
        inputs = tuple(np.rint(a * 2).astype(dtype) if a.dtype.kind == "f" else a for a in case.inputs)
        ci = Case(case.op, f"{case.name}-{dtype}", inputs, case.attrs, case.layout, case.grad, case.float32)
        try:
            shapes = tuple(a.shape for a in inputs)
            _, out_dtype = infer(case.op, shapes, tuple(a.dtype for a in inputs), case.attrs)
            want = reference_forward(ci)
        except (PolygradError, ArithmeticError, ValueError, TypeError):
            continue  # integers not accepted by the op (or undefined for these values)
        got, _ = _run_kernel(backend, ci, "integer")
        ran = True
        rtol, atol = (0.0, 0.0) if out_dtype.kind != "f" else tol.float32
        ok, err, where = compare(got, want, rtol, atol)
        if not ok:
            raise CheckFailure(_explain(f"{_label(ci, 'integer')}: {dtype} output disagrees with the reference",
                                        got, want, err, where, rtol, atol, "backend", "reference"), err)
        worst = max(worst, err)
    if not ran:
        raise NotApplicable("the op takes no integer inputs, or the backend declares no integer dtype")
    return worst


def _primitive(case: Case):
    def fn(*ts):
        return apply(case.op, tuple(ts), case.attrs, case.layout)
    fn.__name__ = case.op.value
    return fn


def _wrt(case: Case) -> list[int]:
    return [i for i, g in enumerate(case.grad) if g]


def _analytic(backend: str, case: Case, check: str) -> list:
    if _kernel(backend, case.op, case.layout) is None:
        raise NotApplicable("not provided")
    if not case.differentiable:
        raise NotApplicable("nothing to differentiate")
    with watching_fallbacks() as rec:
        if any(a.dtype == np.float32 for a in case.inputs):
            grads = _vjp_as_given(case, backend)
        else:
            _, grads = vjp_grads(_primitive(case), case.inputs, wrt=_wrt(case), backend=backend)
    _raise_on_fallbacks(rec, backend, _label(case, check))
    return grads


def _vjp_as_given(case: Case, backend: str) -> list:
    """``vjp_grads`` at the inputs' own dtypes (float32 on a backend that declares no float64),
    with the same cotangent; gradients as float64 numpy."""
    ts = case.tensors(backend, requires_grad=True)
    out = _primitive(case)(*ts)
    wanted = [t for t, g in zip(ts, case.grad) if g]
    if not out.requires_grad:
        got = [np.zeros(t.shape) for t in wanted]
    else:
        g = _seed_grad(out.shape, None, 0).astype(out.dtype)
        res = pg_grad(out, wanted, grad_outputs=tensor(g, backend=backend), allow_unused=True)
        got = [np.zeros(t.shape) if r is None else np.asarray(r.numpy(), dtype=np.float64)
               for r, t in zip(res, wanted)]
    it = iter(got)
    return [next(it) if need else None for need in case.grad]


def check_grad_numeric(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """VJP (pg.grad on this backend, fused kernels included) vs central differences."""
    analytic = _analytic(backend, case, "grad-numeric")
    with watching_fallbacks() as rec:
        numeric = numerical_grad(_primitive(case), case.inputs, tol.eps, wrt=_wrt(case), backend=backend)
    _raise_on_fallbacks(rec, backend, _label(case, "grad-numeric"))
    return _compare_grads(case, "grad-numeric", analytic, numeric, tol.grad_numeric, "analytic",
                          "central differences")


def scalar_grads(case: Case, seed: int = 0) -> list:
    """Gradients from ``Value.backward`` over the op's scalar decomposition (same cotangent as vjp_grads)."""
    inputs = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in case.inputs]
    leaves = [reference.leaves_of(a, bool(g)) for a, g in zip(inputs, case.grad)]
    items, shape = reference.run(case.op, [(lv, a.shape) for lv, a in zip(leaves, inputs)], case.attrs)
    g = _seed_grad(tuple(shape), None, seed).ravel().tolist()
    pairs = [(o, s) for o, s in zip(items, g) if isinstance(o, Value)]
    if pairs:
        backward_many([o for o, _ in pairs], [s for _, s in pairs])
    out = []
    for lv, a, need in zip(leaves, inputs, case.grad):
        out.append(np.asarray([v.grad for v in lv], dtype=np.float64).reshape(a.shape) if need else None)
    return out


def check_grad_scalar(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """VJP on this backend vs the scalar decomposition's ``Value.backward``."""
    analytic = _analytic(backend, case, "grad-scalar")
    return _compare_grads(case, "grad-scalar", analytic, scalar_grads(case), tol.grad_scalar,
                          "backend", "scalar decomposition")


def _compare_grads(case: Case, check: str, got: list, want: list, tols: tuple[float, float],
                   got_name: str, want_name: str) -> float:
    rtol, atol = tols
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        if a is None or b is None:
            continue
        ok, err, where = compare(a, b, rtol, atol)
        if not ok:
            raise CheckFailure(_explain(f"{_label(case, check)}: gradient of input {i} {tuple(b.shape)} disagrees "
                                        f"with the {want_name}", a, b, err, where, rtol, atol, got_name,
                                        want_name), err)
        worst = max(worst, err)
    return worst


def check_fused_vjp(backend: str, case: Case, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """The backend's fused backward kernel for (op, layout) vs the op's VJP rule on the same backend."""
    registry.load()
    kernel = registry.vjp_tables.get(backend, {}).get(kernel_key(case.op, case.layout))
    if kernel is None:
        raise NotApplicable("no fused backward kernel")
    if not case.differentiable:
        raise NotApplicable("nothing to differentiate")
    be = registry.get(backend)
    label = _label(case, "fused-vjp")
    with watching_fallbacks() as rec:
        ts = case.tensors(backend, requires_grad=True)
        out = _primitive(case)(*ts)                  # records the node the rule needs
        g = _seed_grad(out.shape, None, 0).astype(out.dtype)
        with no_grad():
            rule = grad_rules.vjp(out._node, out, tensor(g, backend=backend))
            want = [None if r is None or not t.requires_grad else np.asarray(unbroadcast(r, t.shape).numpy())
                    for r, t in zip(rule, ts)]
        try:
            got_arrays = kernel(be.from_numpy(g), *[be.from_numpy(a.copy()) for a in case.inputs],
                                needs=tuple(case.grad), **case.attrs)
        except Exception as exc:  # noqa: BLE001 - any exception of the fused kernel is the finding
            raise CheckFailure(f"{label}: fused backward kernel raised {type(exc).__name__}: {exc}") from exc
    _raise_on_fallbacks(rec, backend, label)
    if len(got_arrays) != len(case.inputs):
        raise CheckFailure(f"{label}: fused backward kernel returned {len(got_arrays)} gradients for "
                           f"{len(case.inputs)} inputs")
    got: list[np.ndarray | None] = []
    for i, (arr, need, t) in enumerate(zip(got_arrays, case.grad, ts)):
        if not need:
            got.append(None)
            continue
        if arr is None:
            raise CheckFailure(f"{label}: fused backward kernel returned no gradient for input {i}, which needs one")
        if tuple(be.shape(arr)) != t.shape or np.dtype(be.dtype(arr)) != t.dtype:
            raise CheckFailure(f"{label}: fused backward kernel returned shape {tuple(be.shape(arr))} dtype "
                               f"{be.dtype(arr)} for input {i} of shape {t.shape} dtype {t.dtype}")
        got.append(np.asarray(be.to_numpy(arr)))
    return _compare_grads(case, "fused-vjp", got, want, tol.fused_vjp, "fused kernel", "VJP rule")


def check_errors(backend: str, case: BadCase, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """Bad input raises ``case.error`` from inference; the kernel is never called, nothing falls back."""
    registry.load()
    table = registry.tables.get(backend, {})
    key = kernel_key(case.op, case.layout)
    original = table.get(key)
    if original is None:
        raise NotApplicable("not provided")
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    label = _label(case, "errors")
    ts = tuple(tensor(a, backend=backend) for a in case.inputs)
    table[key] = spy
    try:
        with watching_fallbacks() as rec:
            try:
                apply(case.op, ts, case.attrs, case.layout)
            except case.error:
                pass
            except Exception as exc:  # noqa: BLE001
                raise CheckFailure(f"{label}: expected {case.error.__name__}, got {type(exc).__name__}: {exc}") from exc
            else:
                raise CheckFailure(f"{label}: bad input {[a.shape for a in case.inputs]} raised no error "
                                   f"(expected {case.error.__name__})")
    finally:
        if table.get(key) is spy:
            table[key] = original
    if calls or rec.events:
        raise CheckFailure(f"{label}: the kernel ran on invalid input (errors must come from inference first)")
    return 0.0


CHECK_FUNCTIONS: dict[str, Callable[..., float]] = {
    "forward": check_forward, "float32": check_float32, "grad-numeric": check_grad_numeric,
    "grad-scalar": check_grad_scalar, "fused-vjp": check_fused_vjp, "errors": check_errors,
    "integer": check_integer,
}


#: checks computed in float64 (a backend without float64 runs grad-scalar / fused-vjp in float32)
_FLOAT64_CHECKS = ("forward", "grad-numeric", "grad-scalar", "fused-vjp")


def for_declared_dtypes(backend: str, check: str, case: Case | BadCase,
                        tol: Tolerances) -> tuple[Case | BadCase, Tolerances]:
    """``case`` as the backend's declared dtypes (``Backend.dtypes``) allow, with the tolerances to
    use; raises NotApplicable when a check needs a dtype the backend does not declare.

    Integer inputs of an undeclared width go to the widest declared one (int64 -> int32); a
    float64 check on a float32-only backend is not applicable (``forward``: the ``float32`` check
    covers it; ``grad-numeric``: central differences need float64) or runs in float32 with float32
    tolerances (``grad-scalar``, ``fused-vjp``)."""
    declared = declared_dtypes(registry.get(backend))
    inputs = list(case.inputs)
    for i, a in enumerate(inputs):
        if a.dtype.kind == "f" and a.dtype.name not in declared and isinstance(case, BadCase):
            floats = [d for d in declared if np.dtype(d).kind == "f"]
            inputs[i] = a.astype(max(floats, key=lambda d: np.dtype(d).itemsize))
        elif a.dtype.kind in "iu" and a.dtype.name not in declared:
            ints = [d for d in declared if np.dtype(d).kind in "iu"]
            if not ints:
                raise NotApplicable(f"the backend declares no integer dtype (input {i} is {a.dtype})")
            inputs[i] = a.astype(max(ints, key=lambda d: np.dtype(d).itemsize))
        elif a.dtype.kind == "b" and "bool" not in declared:
            raise NotApplicable("the backend declares no bool dtype")
    target = case.attrs.get("dtype") if case.op == Op.CAST else None
    if target is not None and np.dtype(target).name not in declared:
        raise NotApplicable(f"the backend declares no {np.dtype(target).name} (the cast's target)")
    if isinstance(case, BadCase):
        return BadCase(case.op, case.name, tuple(inputs), case.attrs, case.layout, case.error), tol
    if any(x is not y for x, y in zip(inputs, case.inputs)):
        case = Case(case.op, case.name, tuple(inputs), case.attrs, case.layout, case.grad, case.float32,
                    case.accumulate)
    floating = any(a.dtype.kind == "f" for a in case.inputs)
    if check == "float32" and "float32" not in declared:
        raise NotApplicable("the backend declares no float32")
    if check in _FLOAT64_CHECKS and floating and "float64" not in declared:
        if check in ("forward", "grad-numeric") or "float32" not in declared:
            raise NotApplicable(f"the backend declares no float64 ({check} is a float64 check)")
        f32 = tol.float32 if check == "fused-vjp" else tol.grad_float32
        return case.with_dtype(np.float32), replace(tol, grad_scalar=tol.grad_float32, fused_vjp=f32)
    return case, tol


def run_check(backend: str, check: str, case: Case | BadCase, tol: Tolerances = DEFAULT_TOLERANCES) -> float:
    """Run one check; returns the largest error, raises CheckFailure or NotApplicable."""
    try:
        case, tol = for_declared_dtypes(backend, check, case, tol)
        return CHECK_FUNCTIONS[check](backend, case, tol)
    except (CheckFailure, NotApplicable):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else the backend threw is a finding too
        raise CheckFailure(f"{_label(case, check)}: raised {type(exc).__name__}: {exc}") from exc


# -- the whole suite ------------------------------------------------------------------------------------

def iter_checks(ops: Iterable[Op | str] | None = None, layouts: Iterable[str] | None = None,
                checks: Iterable[str] | None = None) -> Iterator[tuple[str, Case | BadCase]]:
    """Every (check, case) pair of the catalogue, filtered."""
    wanted_ops = None if ops is None else {Op(o) for o in ops}
    wanted_layouts = None if layouts is None else set(layouts)
    wanted_checks = list(CHECKS if checks is None else checks)
    for name in wanted_checks:
        if name not in CHECK_FUNCTIONS:
            raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECKS)}")
    for check in wanted_checks:
        for case in (bad_cases() if check == "errors" else cases()):
            if ((wanted_ops is None or case.op in wanted_ops)
                    and (wanted_layouts is None or case.layout in wanted_layouts)):
                yield check, case


def run_conformance(backend: str | Backend, ops: Iterable[Op | str] | None = None,
                    layouts: Iterable[str] | None = None, checks: Iterable[str] | None = None,
                    xfails: Sequence[XFail] | None = None, tol: Tolerances = DEFAULT_TOLERANCES) -> Report:
    """Run the conformance suite on a registered backend; returns a :class:`Report`."""
    name = resolve_backend(backend)
    xfails = load_xfails() if xfails is None else list(xfails)
    report = Report(name, provided=provided(name))
    for check, case in iter_checks(ops, layouts, checks):
        if (case.op, case.layout) not in report.provided:
            continue
        xf = find_xfail(xfails, name, case.op, case.layout, check, case.name)
        try:
            err = run_check(name, check, case, tol)
        except NotApplicable:
            continue
        except CheckFailure as exc:
            status = "xfail" if xf else "fail"
            report.results.append(Result(name, case.op, case.layout, check, case.name, status, str(exc),
                                         exc.max_error, xf.reason if xf else ""))
            continue
        report.results.append(Result(name, case.op, case.layout, check, case.name, "xpass" if xf else "pass",
                                     max_error=err, reason=xf.reason if xf else ""))
    return report


# -- command line ---------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="polygrad check", description=(
        "Run polygrad's conformance kit on an installed backend: every (op, layout) kernel it provides vs "
        "the scalar reference, gradients vs numerical differentiation and the scalar decomposition, float32 "
        "dtypes, errors on bad input, fused backward kernels vs the VJP rules. Exit status 1 on any failure."))
    p.add_argument("backend", help="backend name (see `polygrad backends`)")
    p.add_argument("--op", action="append", dest="ops", metavar="OP", help="only this op (repeatable)")
    p.add_argument("--layout", action="append", dest="layouts", metavar="LAYOUT", help="only this layout (repeatable)")
    p.add_argument("--check", action="append", dest="checks", choices=CHECKS, help="only this check (repeatable)")
    p.add_argument("--xfail", action="append", default=[], metavar="FILE",
                   help="extra xfail file: lines 'backend op layout check [case]  # reason'")
    p.add_argument("-v", "--verbose", action="store_true", help="also list xfailed and xpassed checks")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``polygrad check NAME``: print the op x layout table; 0 when all checks pass, 1 on a failure,
    2 when the backend cannot be used or the arguments are wrong."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        ops = [Op(o) for o in args.ops] if args.ops else None
    except ValueError as exc:
        print(f"polygrad check: {exc}; ops: {', '.join(o.value for o in Op)}", file=sys.stderr)
        return 2
    try:
        xfails = load_xfails(args.xfail)
        report = run_conformance(args.backend, ops, args.layouts, args.checks, xfails)
    except (PolygradError, OSError, ValueError) as exc:
        print(f"polygrad check: {exc}", file=sys.stderr)
        return 2
    origin = next((b.origin for b in _infos() if b.name == report.backend), "?")
    print(f"polygrad conformance kit: backend {report.backend!r} (from {origin})")
    print(report.table())
    print()
    for r in report.results:
        if r.status == "fail" or args.verbose and r.status in ("xfail", "xpass"):
            tag = {"fail": "FAIL", "xfail": "XFAIL", "xpass": "XPASS"}[r.status]
            extra = f"  [xfail: {r.reason}]" if r.reason else ""
            print(f"{tag} {r.message or f'{r.op.value} ({r.layout}) {r.check} {r.case}'}{extra}")
    # the edge-point set (gradients at kinks, vs PyTorch) and a lazy backend's materialize/submit
    # contract: on full runs, not on filtered ones
    full = not (args.ops or args.layouts or args.checks)
    lazy = full and is_lazy(report.backend)
    edge_failures: list[str] = check_edge_points(report.backend) if full else []
    lazy_failures: list[str] = check_lazy_contract(report.backend) if lazy else []
    for message in edge_failures + lazy_failures:
        print(f"FAIL {message}")
    if report.failures or edge_failures or lazy_failures or args.verbose:
        print()
    print(report.summary())
    if full:
        print(f"edge points (PyTorch's gradient conventions): {len(EDGE_CASES) - len(edge_failures)} of "
              f"{len(EDGE_CASES)} agree")
    if lazy:
        print(f"lazy backend contract (materialize, submit): {len(LAZY_CHECKS) - len(lazy_failures)} of "
              f"{len(LAZY_CHECKS)} hold")
    return 0 if report.ok and not edge_failures and not lazy_failures else 1


def _infos():
    return list_backends()


if __name__ == "__main__":
    raise SystemExit(main())
