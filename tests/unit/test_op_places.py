"""Adding a primitive op: every place it is defined, one place each, and the README says which.

``OP_PLACES`` is the list (the README's table "Adding a primitive op" must list exactly these files,
in this order); :func:`missing_places` names each one an op still lacks; and a scratch floating
unary op is added to a copy of the tree by editing exactly the files the README says, then
gradient-checked against finite differences on every built-in CPU backend.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# file -> what it holds for an op; every check of missing_places names one of these files.
OP_PLACES: dict[str, str] = {
    "polygrad/ir/ops.py": "the Op member, declared with its groups",
    "polygrad/engine/grad_rules.py": "its VJP rule _<name>_rule (unless its groups say \"no_grad\")",
    "polygrad/engine/value.py": "its scalar meaning, a Value method (added with value.unary)",
    "polygrad/tensor/tensor_class.py": "the user-facing method (or a function of polygrad.tensor)",
    "polygrad/testing/opdoc.py": "its entry in the op reference for backend authors",
    "backends/array_kernels.py": "its kernel, unless the array namespace has a function of its name",
    "polygrad/testing/cases.py": "its conformance cases, unless its group's cases cover it",
    "polygrad/engine/inference.py": "its shape/dtype rule, unless its group gives it",
    "polygrad/engine/reference.py": "its scalar reference, unless its group gives it (by the Value method)",
}


#: primitive ops whose user-facing function has another name: PyTorch's ``cross_entropy`` takes class
#: probabilities as well as classes, and polygrad keeps its one name for both
USER_FACING = {"soft_cross_entropy": "cross_entropy"}


def missing_places(op) -> list[str]:
    """Where primitive ``op`` (an Op, or the name of one being added) is not defined yet: one line
    per place, starting with the file (a key of OP_PLACES)."""
    import numpy as np

    from polygrad.backends.array_kernels import make_kernels
    from polygrad.engine import grad_rules, inference, reference
    from polygrad.engine.value import Value
    from polygrad.ir.ops import FLOAT_UNARY, NON_DIFFERENTIABLE, SPARSE, Op, kernel_key
    from polygrad.testing import opdoc
    from polygrad.testing.cases import covered

    tensor = importlib.import_module("polygrad.tensor")  # the package (pg.tensor is the function)
    name = str(op)
    if name not in {o.value for o in Op}:
        return ["polygrad/ir/ops.py: no Op member named " + repr(name)]
    op = Op(name)
    missing = []
    if op not in grad_rules.RULES and op not in NON_DIFFERENTIABLE:
        missing.append(f"polygrad/engine/grad_rules.py: no VJP rule _{name}_rule (and the op is not \"no_grad\")")
    if op in FLOAT_UNARY and not hasattr(Value, name):
        missing.append(f"polygrad/engine/value.py: no Value.{name} (add it with value.unary)")
    user = USER_FACING.get(name, name)
    if not (hasattr(tensor.Tensor, user) or hasattr(tensor.Tensor, f"__{user}__") or hasattr(tensor, user)):
        missing.append(f"polygrad/tensor/tensor_class.py: no Tensor.{name} method or polygrad.tensor.{name}")
    if op not in opdoc.SPECS:
        missing.append(f"polygrad/testing/opdoc.py: no SPECS entry for {name}")
    layouts = ("csr", "coo") if op in SPARSE else ("dense",)
    kernels = make_kernels(np)
    for layout in layouts:
        if kernel_key(op, layout) not in kernels:  # sparse kernels are keyed once, under "csr"
            missing.append(f"backends/array_kernels.py: no kernel for ({name}, {layout}) in make_kernels")
    for layout in layouts:
        if (op, layout) not in covered():
            missing.append(f"polygrad/testing/cases.py: no case for ({name}, {layout})")
    if op not in inference._RULES:
        missing.append("polygrad/engine/inference.py: no shape/dtype rule in _RULES")
    if (op not in reference._UNARY and op not in reference._BINARY
            and f"Op.{op.name}" not in inspect.getsource(reference.run)):
        missing.append("polygrad/engine/reference.py: no scalar reference in run()")
    return missing


def test_every_primitive_op_is_defined_in_every_place():
    from polygrad.ir.ops import Op

    gaps = {op.value: missing_places(op) for op in Op}
    gaps = {k: v for k, v in gaps.items() if v}
    assert gaps == {}, "a primitive op is missing some of its places (README: Adding a primitive op):\n" + "\n".join(
        f"{op}: {place}" for op, places in gaps.items() for place in places)


def test_every_place_the_checker_names_is_in_the_list():
    from polygrad.engine import grad_rules, inference, reference
    from polygrad.ir.ops import Op

    assert missing_places("sin") == ["polygrad/ir/ops.py: no Op member named 'sin'"]
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(grad_rules.RULES, Op.TANH)
        mp.delitem(inference._RULES, Op.TANH)
        mp.delitem(reference._UNARY, Op.TANH)
        places = missing_places(Op.TANH)
    files = [p.split(":")[0] for p in places]
    assert files == ["polygrad/engine/grad_rules.py", "polygrad/engine/inference.py",
                     "polygrad/engine/reference.py"], places
    assert set(files) <= set(OP_PLACES)


def _readme_places() -> list[tuple[str, str]]:
    """(file, what a floating unary op writes there) from the README's table."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Adding a primitive op"):]
    section = section[:section.index("\n\n", section.index("| --- "))]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [(re.match(r"\| `([^`]+)`", row).group(1), row.rsplit("|", 2)[1].strip()) for row in rows]


def test_the_readme_lists_exactly_the_places_the_checker_checks():
    assert [file for file, _ in _readme_places()] == list(OP_PLACES)


# -- a scratch primitive, added the way the README says ----------------------------------------------

# What a contributor writes for a new floating unary op, sin, in each file the README says a
# floating unary op needs: (a line of the file, the text that goes right after it, or before it).
SCRATCH_EDITS: dict[str, tuple[str, str, str]] = {
    "polygrad/ir/ops.py": ('    TANH = "tanh", "unary", "float_unary"\n', "after",
                           '    SIN = "sin", "unary", "float_unary"\n'),
    "polygrad/engine/grad_rules.py": ("RULES: dict[Op, Rule] = ", "before", textwrap.dedent('''\
        def _sin_rule(node, out, g):
            x = node.inputs[0]  # sin' = cos = sin(x + pi/2), written with the op itself
            return (_mul(g, apply(Op.SIN, (_add(x, _const(x, 1.5707963267948966)),))),)


        ''')),
    "polygrad/engine/value.py": ("def backward_many(", "before",
                                 'unary("sin", math.sin, lambda x, out: math.cos(x))\n\n\n'),
    "polygrad/tensor/tensor_class.py": ("    def tanh(self): return apply(Op.TANH, (_floating(self),))\n", "after",
                                        "    def sin(self): return apply(Op.SIN, (_floating(self),))\n"),
    "polygrad/testing/opdoc.py": ("SPECS: dict[Op, OpSpec] = {\n", "after",
                                  '    Op.SIN: OpSpec("Sine", "x (floating)", output="shape and dtype of x"),\n'),
}


def _add_scratch_op(tree: Path) -> list[str]:
    for rel, (anchor, where, text) in SCRATCH_EDITS.items():
        path = tree / rel
        source = path.read_text()
        assert source.count(anchor) == 1, (rel, anchor)
        path.write_text(source.replace(anchor, anchor + text if where == "after" else text + anchor))
    return list(SCRATCH_EDITS)


CHECK_SCRATCH_OP = textwrap.dedent('''\
    import importlib.util, sys
    import numpy as np
    import polygrad as pg
    assert pg.__file__.startswith(sys.argv[1]), pg.__file__   # the scratch copy, not the checkout
    spec = importlib.util.spec_from_file_location("op_places", sys.argv[2])
    places = importlib.util.module_from_spec(spec); spec.loader.exec_module(places)
    assert places.missing_places("sin") == [], places.missing_places("sin")
    from polygrad.testing import assert_backends_agree, check_grads
    x = np.random.default_rng(0).normal(size=(3, 4))
    for backend in ("numpy", "scalar"):
        check_grads(lambda t: (t.sin() * t).sum(), [x], backend=backend)   # against finite differences
        y = pg.tensor(x, dtype=pg.float64, requires_grad=True, backend=backend)
        (g,) = pg.grad(y.sin().sum(), [y], create_graph=True)   # second order: the rule uses sin
        (gg,) = pg.grad(g.sum(), [y])
        assert np.allclose(g.numpy(), np.cos(x)) and np.allclose(gg.numpy(), -np.sin(x))
    assert_backends_agree(lambda t: t.sin().exp().sum(), [x], backends=["numpy", "scalar"])
    print("ok")
    ''')


def test_a_scratch_floating_unary_op_needs_only_the_readme_files(tmp_path):
    """Copy the package, add ``sin`` by editing exactly the README's files for a floating unary
    op, and run its gradient checks: nothing else (kernels, cases, inference, reference, scalar
    math, the plugins' tables) needs an edit."""
    needs_edit = [file for file, what in _readme_places() if not what.startswith("nothing")]
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "polygrad", tree / "polygrad", symlinks=False,  # polygrad/backends: real files
                    ignore=shutil.ignore_patterns("__pycache__"))
    edited = _add_scratch_op(tree)
    assert sorted(edited) == sorted(f for f in needs_edit), (edited, needs_edit)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRATCH_OP, str(tree), __file__], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-4000:]
