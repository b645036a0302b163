"""House rules of the code base, checked on its source: the core names no backend, and the core's
modules import each other one way (no import cycle, no function-local import to dodge one)."""
from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "polygrad"
BACKEND_NAMES = ("numpy", "cupy", "scalar")

# Strings equal to a backend name that mean something else where they stand.  Even here a
# comparison against the name (`x == "scalar"`) is still reported.
OTHER_MEANINGS = {
    "runtime/config.py": "the fallback policy 'scalar': scalar decomposition over Value, not the backend",
    "engine/graph.py": "'scalar' as a slot name: the node's scalar decomposition",
    "data/planetoid.py": "'numpy' as the module path in numpy's own pickles",
    "testing/cases.py": "'scalar' as the name of a 0-d operand case",
}


def _core_files() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] != "backends")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each core file parsed once for all the checks of this module."""
    return ast.parse(path.read_text(), filename=str(path))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def backend_names_in(source: str, rel: str) -> list[str]:
    """Where the core module ``rel`` names a backend outside docstrings (and comments): a string
    constant equal to a backend name, any mention of cupy, or a comparison against a backend name."""
    tree = ast.parse(source, filename=rel)
    return _backend_names_in_tree(tree, rel)


def _backend_names_in_tree(tree: ast.AST, rel: str) -> list[str]:
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            if "cupy" in text.lower() or text in BACKEND_NAMES and rel not in OTHER_MEANINGS:
                found.append(f"{rel}:{node.lineno}: {text[:50]!r}")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if isinstance(operand, ast.Constant) and operand.value in BACKEND_NAMES:
                    found.append(f"{rel}:{node.lineno}: compares against {operand.value!r}")
        elif isinstance(node, ast.Name) and "cupy" in node.id.lower():
            found.append(f"{rel}:{node.lineno}: identifier {node.id}")
        elif isinstance(node, ast.Attribute) and "cupy" in node.attr.lower():
            found.append(f"{rel}:{node.lineno}: attribute {node.attr}")
    return found


def test_the_core_names_no_backend_outside_docstrings():
    found = [hit for path in _core_files()
             for hit in _backend_names_in_tree(_tree(path), path.relative_to(CORE).as_posix())]
    assert found == [], "the core special-cases a backend; put it in the Backend contract instead:\n" + "\n".join(found)


def test_the_backend_name_check_catches_what_it_should():
    sample = ('"""Docstrings may say numpy, cupy and scalar."""\n'
              'def f(be):\n    """cupy here is fine"""\n'
              '    if be.name == "numpy":\n        return "cupy pool"\n    return cupy_pool\n')
    hits = backend_names_in(sample, "sample.py")
    assert len(hits) == 4, hits  # the string "numpy", the comparison, "cupy pool", cupy_pool
    assert backend_names_in('x = "scalar"\n', "runtime/config.py") == []  # another meaning there
    assert len(backend_names_in('ok = x == "scalar"\n', "runtime/config.py")) == 1  # but never compared


# -- one-way layering ----------------------------------------------------------------------------

# Function-local imports of core modules that remain, each with the reason.  None is left: the
# sparse package hands Tensor its routing table (tensor.register_sparse_api) instead.
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {}
# The core's layers, bottom first (design.md, "Layout"): a package imports only packages of its own
# rank or below.  errors.py is the public path of ir.errors; __init__/__main__ sit above everything.
LAYERS: list[set[str]] = [
    {"ir", "errors"}, {"runtime"}, {"engine"}, {"tensor"}, {"sparse"}, {"io", "compile"},
    {"nn", "optim", "data", "testing", "micrograd"}, {"apps"},
]
# Inside the engine, one way too: ops -> dispatch -> grad_rules -> autodiff (the gradient table is
# written with dispatch's apply, and autodiff runs the table).
ENGINE_LAYERS = ["inference", "dispatch", "grad_rules", "autodiff"]


def _core_imports() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(top-level imports between the core's modules, function-local ones as (module, line, target)).

    A subpackage (sparse, nn, optim, ...) is one node: the imports of all its files from ``..``."""
    packages = {p.name: sorted(p.rglob("*.py")) for p in CORE.iterdir()
                if p.is_dir() and (p / "__init__.py").exists() and p.name != "backends"}
    units = {p.stem: [p] for p in CORE.glob("*.py")} | packages
    modules = set(units)
    top: dict[str, set[str]] = {}
    local: list[tuple[str, int, str]] = []
    for unit, paths in sorted(units.items()):
        deps: set[str] = set()
        for path in paths:
            level = len(path.relative_to(CORE).parts)  # 1 for polygrad/x.py, 2 for polygrad/pkg/x.py

            def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.ImportFrom) and child.level == level:
                        names = [child.module] if child.module else [a.name for a in child.names]
                        for target in {n.split(".")[0] for n in names} & modules:
                            if in_function:
                                local.append((unit, child.lineno, target))
                            elif not type_only:
                                deps.add(target)
                    guard = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
                    visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                          type_only or guard)

            visit(_tree(path), False, False)
        top[unit] = deps - {unit}
    return top, local


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_core_modules_import_each_other_without_a_cycle():
    top, _ = _core_imports()
    graphlib.TopologicalSorter(top).prepare()  # raises CycleError naming the cycle


def _package_modules_imports(package: str) -> dict[str, set[str]]:
    """The imports between the modules of one core package (``from .x import`` / ``from . import x``)."""
    files = sorted((CORE / package).glob("*.py"))
    names = {p.stem for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        deps: set[str] = set()
        tree = _tree(path)
        type_only = {id(n) for guard in ast.walk(tree)
                     if isinstance(guard, ast.If) and "TYPE_CHECKING" in ast.unparse(guard.test)
                     for n in ast.walk(guard)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and id(node) not in type_only:
                found = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                deps |= set(found) & names
        graph[path.stem] = deps - {path.stem}
    return graph


def test_layers_depend_one_way():
    """ir -> runtime -> engine -> tensor -> sparse -> io/compile -> nn/optim/data/testing -> apps:
    no package reaches one above it, and every package is in a layer."""
    top, _ = _core_imports()
    rank = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    assert set(top) - {"__init__", "__main__"} == set(rank), "a core package is in no layer: add it to LAYERS"
    upward = sorted(f"{unit} (layer {rank[unit]}) imports {dep} (layer {rank[dep]})"
                    for unit in rank for dep in _reach(top, unit) if rank.get(dep, -1) > rank[unit])
    assert upward == [], "\n".join(upward)


def test_the_engine_depends_one_way():
    graph = _package_modules_imports("engine")
    graphlib.TopologicalSorter(graph).prepare()
    for i, module in enumerate(ENGINE_LAYERS):
        above = set(ENGINE_LAYERS[i + 1:])
        assert not _reach(graph, module) & above, f"engine/{module} imports {_reach(graph, module) & above}"


def test_the_tensor_functions_sit_below_the_tensor_class():
    """The class binds the functions of polygrad.tensor as its methods: no function module imports
    it at run time (they know a tensor as engine.graph.TensorBase), and the modules form no cycle."""
    graph = _package_modules_imports("tensor")
    graphlib.TopologicalSorter(graph).prepare()
    runtime_importers = sorted(m for m, deps in graph.items() if "tensor_class" in deps
                               and m not in ("__init__", "activations", "draw", "interop", "lazy"))
    assert runtime_importers == [], runtime_importers


MAX_MODULE_LINES = 700


def test_no_core_module_is_over_700_lines():
    """Small modules with one job each: a module past 700 lines holds more than one."""
    long = {path.relative_to(CORE).as_posix(): n for path in _core_files()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"split these by concern: {long}"


def test_old_module_paths_still_import_as_the_same_modules():
    """The flat modules' old paths (before the move into subpackages) keep working for users' code."""
    import importlib

    import polygrad

    for old, new in {"ops": "ir.ops", "registry": "runtime.registry", "array_pool": "runtime.pool",
                     "dispatch": "engine.dispatch", "pattern": "sparse.pattern", "checkpoint": "io.checkpoint",
                     "value": "engine.value", "graph_ops": "sparse.graph_ops"}.items():
        assert importlib.import_module(f"polygrad.{old}") is importlib.import_module(f"polygrad.{new}"), old
    from polygrad.errors import ShapeError
    from polygrad.ir.errors import ShapeError as defined

    assert ShapeError is defined and callable(polygrad.tensor) and callable(polygrad.monitor)
    assert polygrad.registry is polygrad.runtime.registry and polygrad.config is polygrad.runtime.config.config


def test_the_repository_uses_the_new_module_paths():
    """The old paths are for users' code only: nothing in this repository imports through them."""
    import sys

    import polygrad  # noqa: F401  (registers the old paths)

    old_paths = {name for name, module in sys.modules.items()
                 if name.startswith("polygrad.") and name.count(".") == 1 and module.__name__ != name}
    assert "polygrad.ops" in old_paths and "polygrad.errors" not in old_paths
    hits = []
    for folder in ("polygrad", "backends", "plugins", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "build" in path.parts or ".venv" in path.parts[len(ROOT.parts):][0]:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                targets = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                           else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                hits += [f"{path.relative_to(ROOT)}:{node.lineno}: {t}" for t in targets
                         if ".".join(t.split(".")[:2]) in old_paths]
    assert hits == [], "\n".join(hits)


def test_no_function_local_import_dodges_a_cycle():
    _, local = _core_imports()
    extra = [f"polygrad/{mod}.py:{line} imports .{target} inside a function"
             for mod, line, target in local if (mod, target) not in LOCAL_IMPORTS_ALLOWED]
    assert extra == [], "\n".join(extra)
    assert LOCAL_IMPORTS_ALLOWED == {}


def test_no_core_module_imports_the_core_inside_a_function():
    """Every module of polygrad/, subpackages included (sparse, nn, optim, ...): relative imports
    sit at the top (or under TYPE_CHECKING), never inside a function."""
    found = []
    for path in _core_files():
        for func in ast.walk(_tree(path)):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.relative_to(CORE)}:{node.lineno}" for node in ast.walk(func)
                          if isinstance(node, ast.ImportFrom) and node.level >= 1]
    assert found == [], found


def test_one_is_sparse_and_one_describe():
    """One definition each (the sparse package had its own copies)."""
    defs = [f"{path.relative_to(CORE)}:{node.name}" for path in _core_files()
            for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.lstrip("_") in ("is_sparse", "describe")]
    assert sorted(defs) == ["sparse/sparse_tensor.py:_describe", "tensor/sparse_routing.py:is_sparse"], defs


def test_an_op_is_declared_once_in_ops_py_and_once_in_grad_rules_py():
    """The groups derive from each member's declaration; RULES from the rules' names."""
    from polygrad.engine import grad_rules
    from polygrad.ir import ops
    from polygrad.ir.ops import Op

    assert Op.EXP in ops.UNARY and Op.EXP in ops.FLOAT_UNARY and Op.EXP not in ops.BINARY
    assert ops.NON_DIFFERENTIABLE == ops.COMPARE | {Op.SEGMENT_MAX}
    assert Op("segment_max").groups == {"sparse", "no_grad"} and str(Op.MATMUL) == "matmul"
    assert grad_rules.RULES[Op.TANH] is grad_rules._tanh_rule
    assert set(grad_rules.RULES) == set(Op) - ops.NON_DIFFERENTIABLE
    source = (CORE / "engine" / "grad_rules.py").read_text()
    assert "_tanh_rule" in source and source.count("Op.TANH") <= 1  # named once, not listed again


def test_a_new_floating_unary_op_needs_one_place_in_value_py():
    """value.unary adds the method and its backward together: the scalar meaning in one place."""
    import math

    from polygrad.engine.value import Value, unary

    name = "_architecture_test_sin"
    unary(name, math.sin, lambda x, y: math.cos(x))
    try:
        x = Value(0.3)
        y = getattr(x, name)() * 2.0
        y.backward()
        assert y.data == 2 * math.sin(0.3) and x.grad == 2 * math.cos(0.3)
        assert getattr(x, name)()._op == name
    finally:
        delattr(Value, name)


def test_gradient_rules_call_apply_not_the_tensor_api():
    """grad_rules sits below tensor.py: no Tensor method calls (its helpers wrap apply)."""
    import importlib

    tensor_api = {name for name in dir(importlib.import_module("polygrad.tensor").Tensor)
                  if not name.startswith("_") and name not in ("shape", "dtype", "ndim", "requires_grad")}
    tree = _tree(CORE / "engine" / "grad_rules.py")
    calls = sorted({f"{node.lineno}: .{node.func.attr}()" for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in tensor_api and node.func.attr != "transpose"})
    assert calls == [], calls


def test_the_public_errors_module_names_every_exception():
    """polygrad.errors lists ir.errors' names one by one (for type checkers): a new exception
    must be added there too."""
    import polygrad.errors as public
    from polygrad.ir import errors as defined

    assert set(public.__all__) == {*defined.__all__, "describe_exception"}
    assert all(getattr(public, name) is getattr(defined, name) for name in public.__all__)
