"""House rules of the code base, checked on its source: the core names no backend, and the core's
modules import each other one way (no import cycle, no function-local import to dodge one)."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "polygrad"
BACKEND_NAMES = ("numpy", "cupy", "scalar")

# Strings equal to a backend name that mean something else where they stand.  Even here a
# comparison against the name (`x == "scalar"`) is still reported.
OTHER_MEANINGS = {
    "config.py": "the fallback policy 'scalar': scalar decomposition over Value, not the backend",
    "graph.py": "'scalar' as a slot name: the node's scalar decomposition",
    "data/planetoid.py": "'numpy' as the module path in numpy's own pickles",
    "testing/cases.py": "'scalar' as the name of a 0-d operand case",
}


def _core_files() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] != "backends")


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
             for hit in backend_names_in(path.read_text(), path.relative_to(CORE).as_posix())]
    assert found == [], "the core special-cases a backend; put it in the Backend contract instead:\n" + "\n".join(found)


def test_the_backend_name_check_catches_what_it_should():
    sample = ('"""Docstrings may say numpy, cupy and scalar."""\n'
              'def f(be):\n    """cupy here is fine"""\n'
              '    if be.name == "numpy":\n        return "cupy pool"\n    return cupy_pool\n')
    hits = backend_names_in(sample, "sample.py")
    assert len(hits) == 4, hits  # the string "numpy", the comparison, "cupy pool", cupy_pool
    assert backend_names_in('x = "scalar"\n', "config.py") == []  # another meaning there
    assert len(backend_names_in('ok = x == "scalar"\n', "config.py")) == 1  # but never compared


# -- one-way layering ----------------------------------------------------------------------------

# Function-local imports of core modules that remain, each with the reason.  None is left: the
# sparse package hands Tensor its routing table (tensor.register_sparse_api) instead.
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {}
LAYERS = ["ops", "dispatch", "grad_rules", "autodiff", "tensor", "sparse"]


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

            visit(ast.parse(path.read_text()), False, False)
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


def test_layers_depend_one_way():
    """ops -> dispatch -> grad_rules -> autodiff -> tensor -> sparse: no layer reaches one above it."""
    top, _ = _core_imports()
    for i, layer in enumerate(LAYERS):
        above = set(LAYERS[i + 1:])
        assert not _reach(top, layer) & above, f"{layer} imports {_reach(top, layer) & above}"
        assert set(LAYERS[:i]) <= _reach(top, layer) | {"ops"} or layer == "ops"


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
        for func in ast.walk(ast.parse(path.read_text())):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.relative_to(CORE)}:{node.lineno}" for node in ast.walk(func)
                          if isinstance(node, ast.ImportFrom) and node.level >= 1]
    assert found == [], found


def test_one_is_sparse_and_one_describe():
    """One definition each (the sparse package had its own copies)."""
    defs = [f"{path.relative_to(CORE)}:{node.name}" for path in _core_files()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.lstrip("_") in ("is_sparse", "describe")]
    assert sorted(defs) == ["sparse/sparse_tensor.py:_describe", "tensor.py:is_sparse"], defs


# -- adding a primitive op: every place it must be defined ----------------------------------------

# The places, in the order a contributor fills them (six files; a floating unary op needs no
# entry in inference.py or reference.py: both derive it from the op's group and its name).
OP_PLACES = """\
polygrad/ops.py           the Op member, declared with its groups: NAME = "name", "unary", ...
polygrad/grad_rules.py    its VJP rule, the function _<name>_rule (or the op's groups say "no_grad")
polygrad/value.py         a floating unary op: its Value method, added with value.unary(...)
                          (scalar_math.<name> when plain floats need IEEE results)
backends/array_kernels.py its kernel in make_kernels (every numpy/cupy kernel, once)
polygrad/tensor.py        the user-facing method or function of that name
polygrad/testing/cases.py its cases in the catalogue (the conformance kit runs them)
"""


def missing_places(op) -> list[str]:
    """Where primitive ``op`` (an Op, or the name of one being added) is not defined yet."""
    import importlib
    import inspect

    import numpy as np

    from polygrad import grad_rules, inference, reference, scalar_math
    from polygrad.backends.array_kernels import make_kernels
    from polygrad.ops import FLOAT_UNARY, NON_DIFFERENTIABLE, SPARSE, Op, kernel_key
    from polygrad.testing.cases import covered
    from polygrad.value import Value

    tensor = importlib.import_module("polygrad.tensor")  # the module (pg.tensor is the function)
    name = str(op)
    known = name in {o.value for o in Op}
    missing = []
    if not known:
        return ["polygrad/ops.py: no Op member named " + repr(name)]
    op = Op(name)
    if op not in inference._RULES:
        missing.append("polygrad/inference.py: no shape/dtype rule in _RULES")
    if op not in grad_rules.RULES and op not in NON_DIFFERENTIABLE:
        missing.append(f"polygrad/grad_rules.py: no VJP rule _{name}_rule (and the op is not \"no_grad\")")
    if (op not in reference._UNARY and op not in reference._BINARY
            and f"Op.{op.name}" not in inspect.getsource(reference.run)):
        missing.append("polygrad/reference.py: no scalar reference in run()")
    if op in FLOAT_UNARY and not (hasattr(Value, name) and hasattr(scalar_math, name)):
        missing.append(f"polygrad/value.py / scalar_math.py: no Value.{name} (value.unary) or scalar_math.{name}")
    layouts = ("csr", "coo") if op in SPARSE else ("dense",)
    kernels = make_kernels(np)
    for layout in layouts:
        if kernel_key(op, layout) not in kernels:  # sparse kernels are keyed once, under "csr"
            missing.append(f"backends/array_kernels.py: no kernel for ({name}, {layout}) in make_kernels")
    api = (hasattr(tensor.Tensor, name) or hasattr(tensor.Tensor, f"__{name}__") or hasattr(tensor, name))
    if not api:
        missing.append(f"polygrad/tensor.py: no Tensor.{name} method or {name}() function")
    for layout in layouts:
        if (op, layout) not in covered():
            missing.append(f"polygrad/testing/cases.py: no case for ({name}, {layout})")
    return missing


def test_every_primitive_op_is_defined_in_every_place():
    from polygrad.ops import Op

    gaps = {op.value: missing_places(op) for op in Op}
    gaps = {k: v for k, v in gaps.items() if v}
    assert gaps == {}, "a primitive op is missing some of its places:\n" + OP_PLACES + "\n" + "\n".join(
        f"{op}: {place}" for op, places in gaps.items() for place in places)


def test_the_op_checker_names_each_missing_place(monkeypatch):
    from polygrad import grad_rules, inference, reference, scalar_math
    from polygrad.ops import Op

    assert missing_places("sin") == ["polygrad/ops.py: no Op member named 'sin'"]
    monkeypatch.delitem(grad_rules.RULES, Op.TANH)
    monkeypatch.delitem(inference._RULES, Op.TANH)
    monkeypatch.delitem(reference._UNARY, Op.TANH)
    monkeypatch.delattr(scalar_math, "tanh")
    places = missing_places(Op.TANH)
    for file in ("grad_rules.py", "inference.py", "reference.py", "scalar_math.py"):
        assert any(file in p for p in places), (file, places)


def test_an_op_is_declared_once_in_ops_py_and_once_in_grad_rules_py():
    """The groups derive from each member's declaration; RULES from the rules' names."""
    from polygrad import grad_rules, ops
    from polygrad.ops import Op

    assert Op.EXP in ops.UNARY and Op.EXP in ops.FLOAT_UNARY and Op.EXP not in ops.BINARY
    assert ops.NON_DIFFERENTIABLE == ops.COMPARE | {Op.SEGMENT_MAX}
    assert Op("segment_max").groups == {"sparse", "no_grad"} and str(Op.MATMUL) == "matmul"
    assert grad_rules.RULES[Op.TANH] is grad_rules._tanh_rule
    assert set(grad_rules.RULES) == set(Op) - ops.NON_DIFFERENTIABLE
    source = (CORE / "grad_rules.py").read_text()
    assert "_tanh_rule" in source and source.count("Op.TANH") <= 1  # named once, not listed again


def test_a_new_floating_unary_op_needs_one_place_in_value_py():
    """value.unary adds the method and its backward together: the scalar meaning in one place."""
    import math

    from polygrad.value import Value, unary

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
    tree = ast.parse((CORE / "grad_rules.py").read_text())
    calls = sorted({f"{node.lineno}: .{node.func.attr}()" for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in tensor_api and node.func.attr != "transpose"})
    assert calls == [], calls
