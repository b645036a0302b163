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

# Function-local imports of core modules that remain, each with the reason.  Nothing else may
# import lazily to dodge a cycle.
LOCAL_IMPORTS_ALLOWED = {
    ("tensor", "sparse"): "Tensor's conveniences (to_sparse, sparse matmul/transpose/sum routing) call "
                          "the sparse API above it; to be turned around when sparse.py becomes a package",
}
LAYERS = ["ops", "dispatch", "grad_rules", "autodiff", "tensor"]


def _core_imports() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(top-level imports between the core's modules, function-local ones as (module, line, target))."""
    modules = {p.stem for p in CORE.glob("*.py")}
    top: dict[str, set[str]] = {}
    local: list[tuple[str, int, str]] = []
    for path in sorted(CORE.glob("*.py")):
        deps: set[str] = set()

        def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ImportFrom) and child.level == 1:
                    names = [child.module] if child.module else [a.name for a in child.names]
                    for target in {n.split(".")[0] for n in names} & modules:
                        if in_function:
                            local.append((path.stem, child.lineno, target))
                        elif not type_only:
                            deps.add(target)
                guard = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
                      type_only or guard)

        visit(ast.parse(path.read_text()), False, False)
        top[path.stem] = deps
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
    """ops -> dispatch -> grad_rules -> autodiff -> tensor: no layer reaches one above it."""
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
