"""The backend array contract is checked at registration, and breaking it is reported by name.

A backend whose ``dtype()``/``shape()``/``from_numpy()``/``to_numpy()`` return the wrong kind of
thing used to fail every op with an error naming none of them; now ``pg.list_backends()``,
``polygrad backends`` and ``polygrad check`` name the method and what it must return.  The CLI
tests install the broken backend as a real distribution (module + dist-info with an entry point)
in a temporary site directory, as tests/plugins/test_isolation.py does.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import polygrad as pg
from polygrad.runtime.backend import contract_problem

NOT_NUMPY_DTYPE = """
class FrameworkDType:  # what a torch/jax backend's arrays report: its own dtype object
    def __repr__(self):
        return "fake.float64"
"""


def _backend_source(name: str, override: str) -> str:
    return textwrap.dedent(f"""
        import numpy as np
        import polygrad as pg
        {textwrap.indent(textwrap.dedent(NOT_NUMPY_DTYPE), "        ").strip()}

        class Broken(pg.Backend):
            name = {name!r}

            def __init__(self):
                super().__init__()
                self.kernels = {{("neg", "dense"): np.negative}}

            def from_numpy(self, array):
                return np.array(array)

            def to_numpy(self, array):
                return np.asarray(array)

        {textwrap.indent(textwrap.dedent(override), "        ").strip()}

        @pg.hookimpl
        def polygrad_backends():
            return [Broken()]
    """)


BAD = {  # method -> (override, fragment of the expected message)
    "dtype": ("Broken.dtype = lambda self, a: FrameworkDType()",
              "dtype() returned fake.float64 (a {mod}.FrameworkDType); it must return a numpy.dtype, "
              "here numpy.dtype('float64')"),
    "shape": ("Broken.shape = lambda self, a: list(a.shape)",
              "shape() returned [2, 3] (a builtins.list); it must return the shape as a tuple of ints, here (2, 3)"),
    "from_numpy": ("Broken.from_numpy = lambda self, a: None",
                   "from_numpy(a float64 array of shape (2, 3)) returned None; it must return the backend's array"),
    "to_numpy": ("Broken.to_numpy = lambda self, a: a.tolist()",
                 "to_numpy() returned [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] (a builtins.list); it must return a "
                 "numpy.ndarray equal to the array given to from_numpy"),
}


def _load(source: str, module_name: str):
    namespace: dict = {"__name__": module_name}
    exec(compile(source, module_name, "exec"), namespace)
    return namespace


@pytest.mark.parametrize("method", sorted(BAD))
def test_broken_array_method_is_reported_by_name_in_list_backends(method):
    override, message = BAD[method]
    name = f"contract-bad-{method}"
    ns = _load(_backend_source(name, override), f"contract_{method}")
    plugin = type("Plugin", (), {"polygrad_backends": staticmethod(ns["polygrad_backends"])})()
    pg.register_plugin(plugin, name=f"contract-plugin-{method}")
    try:
        info = next(i for i in pg.list_backends() if i.name == name)
        assert not info.available and info.status == "failed"
        assert f"backend {name!r}: " + message.format(mod=f"contract_{method}") in info.reason
        with pytest.raises(pg.errors.BackendUnavailableError, match=method):
            pg.tensor([1.0], backend=name)
    finally:
        pg.unregister_plugin(plugin)


def test_the_builtin_backends_keep_the_contract():
    for info in pg.list_backends():
        if info.available:
            assert contract_problem(pg.runtime.registry.registry.get(info.name)) == ""


def test_a_method_that_raises_is_reported_with_what_it_raised():
    class Raises(pg.Backend):
        name = "contract-raises"

        def from_numpy(self, array):
            return array

        def to_numpy(self, array):
            return array

        def dtype(self, array):
            raise RuntimeError("no dtype here")

    assert contract_problem(Raises()) == ("backend 'contract-raises': dtype() raised RuntimeError: no dtype here; "
                                          "it must return a numpy.dtype, here numpy.dtype('float64')")


def test_lossy_round_trip_is_caught():
    class Lossy(pg.Backend):
        name = "contract-lossy"

        def from_numpy(self, array):
            return array.astype(np.float32)

        def to_numpy(self, array):
            return array

    assert "dtype() returned dtype('float32')" in contract_problem(Lossy())


def _install(site: Path, dist: str, source: str, ep_name: str) -> None:
    module = dist.replace("-", "_")
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[polygrad]\n{ep_name} = {module}\n")
    (info / "RECORD").write_text("")


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("POLYGRAD_BACKEND", None)
    return subprocess.run([sys.executable, "-m", "polygrad", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_polygrad_backends_and_check_name_a_bad_dtype_method(tmp_path):
    _install(tmp_path, "polygrad-torchish", _backend_source("torchish", BAD["dtype"][0]), "torchish")
    message = BAD["dtype"][1].format(mod="polygrad_torchish")
    out = _cli(tmp_path, "backends")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("torchish "))
    assert "False" in row and message in row and "polygrad-torchish" in row
    check = _cli(tmp_path, "check", "torchish")
    assert check.returncode == 2
    assert message in check.stderr
    version = _cli(tmp_path, "--version")
    assert "polygrad-torchish 0.3: torchish [failed]" in version.stdout


class Boxed:
    """A backend's native array type that numpy cannot read (like a GPU array)."""

    def __init__(self, array):
        self.array = array

    def __array__(self, *args, **kwargs):
        raise TypeError("Boxed arrays cannot be read by numpy implicitly")


class BoxBackend(pg.Backend):
    name = "contract-box"

    def __init__(self):
        super().__init__()
        self.kernels = {("neg", "dense"): lambda a: Boxed(-a.array)}

    def from_numpy(self, array):
        return Boxed(np.array(array))

    def to_numpy(self, array):
        return np.array(array.array)

    def owns(self, array):
        return isinstance(array, Boxed)

    def shape(self, array):
        return tuple(array.array.shape)

    def dtype(self, array):
        return array.array.dtype


def test_pg_tensor_of_an_array_a_backend_owns_lands_on_that_backend():
    plugin = type("Plugin", (), {"polygrad_backends": staticmethod(pg.hookimpl(lambda: [BoxBackend()]))})()
    pg.register_plugin(plugin, name="contract-box-plugin")
    try:
        t = pg.tensor(Boxed(np.array([1.0, -2.0])))
        assert t.backend == "contract-box" and (-t).tolist() == [-1.0, 2.0]
        assert pg.tensor([1.0]).backend == "numpy" and pg.tensor(np.ones(2)).backend == "numpy"
    finally:
        pg.unregister_plugin(plugin)
