"""polygrad's built-in backends, installed as ``polygrad.backends``.

They register through the entry-point group ``polygrad`` exactly like a third-party
backend, and import only what the core offers every backend: ``pg.Backend`` and ``pg.hookimpl``,
the op enum (``polygrad.ir.ops``), the errors, the runtime's helpers (``runtime.backend``'s
``elementwise_kernels`` and DLPack devices, the host array pool, the thread pool), and for the
scalar backend the scalar reference it runs (``engine.reference``, ``engine.inference``), and for
numpy's fused matmul backward the rule's own structure (``grad_rules.matmul_grads``,
``autodiff.unbroadcast``); never the tensor layer above them.

This folder is the package ``polygrad.backends`` (through the symlink ``polygrad/backends``).
Importing it under a second name, ``backends`` from the repository root, would load every backend
module twice (two ``NumpyBackend`` classes, two kernel tables): that is refused here by name.
"""
if __name__ != "polygrad.backends":
    raise ImportError(
        f"polygrad's backends folder was imported as {__name__!r}; it is the package "
        "'polygrad.backends' (import polygrad.backends.numpy, not backends.numpy), so that each "
        "backend module is loaded once")
