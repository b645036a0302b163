"""micrograd code runs on polygrad with only its import lines changed, and prints micrograd's numbers.

The two programs below are micrograd's own (karpathy/micrograd, MIT licence): the README example
and the moons notebook (``demo.ipynb``, plotting left out).  Each test rewrites the import lines
-- and nothing else -- and compares what the program prints with micrograd's output: against the
``micrograd`` package when it is installed (the bench extra), and always against the figures
micrograd's notebook recorded (``micrograd_moons_demo.txt``) and its README states.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

HAVE_MICROGRAD = importlib.util.find_spec("micrograd") is not None
HAVE_SKLEARN = importlib.util.find_spec("sklearn") is not None
RECORDED = Path(__file__).with_name("micrograd_moons_demo.txt")

README_EXAMPLE = """\
from micrograd.engine import Value

a = Value(-4.0)
b = Value(2.0)
c = a + b
d = a * b + b**3
c += c + 1
c += 1 + c + (-a)
d += d * 2 + (b + a).relu()
d += 3 * d + (b - a).relu()
e = c - d
f = e**2
g = f / 2.0
g += 10.0 / f
print(f'{g.data:.4f}') # prints 24.7041, the outcome of this forward pass
g.backward()
print(f'{a.grad:.4f}') # prints 138.8338, i.e. the numerical value of dg/da
print(f'{b.grad:.4f}') # prints 645.5773, i.e. the numerical value of dg/db

from micrograd import nn
n = nn.Neuron(2)
x = [Value(1.0), Value(-2.0)]
y = n(x)
print(n, len(n.parameters()))
"""

MOONS_DEMO = """\
import random
import numpy as np
from micrograd.engine import Value
from micrograd.nn import Neuron, Layer, MLP
np.random.seed(1337)
random.seed(1337)
from sklearn.datasets import make_moons, make_blobs
X, y = make_moons(n_samples=100, noise=0.1)

y = y*2 - 1 # make y be -1 or 1
model = MLP(2, [16, 16, 1]) # 2-layer neural network
print(model)
print("number of parameters", len(model.parameters()))
# loss function
def loss(batch_size=None):

    # inline DataLoader :)
    if batch_size is None:
        Xb, yb = X, y
    else:
        ri = np.random.permutation(X.shape[0])[:batch_size]
        Xb, yb = X[ri], y[ri]
    inputs = [list(map(Value, xrow)) for xrow in Xb]

    # forward the model to get scores
    scores = list(map(model, inputs))

    # svm "max-margin" loss
    losses = [(1 + -yi*scorei).relu() for yi, scorei in zip(yb, scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    # L2 regularization
    alpha = 1e-4
    reg_loss = alpha * sum((p*p for p in model.parameters()))
    total_loss = data_loss + reg_loss

    # also get accuracy
    accuracy = [(yi > 0) == (scorei.data > 0) for yi, scorei in zip(yb, scores)]
    return total_loss, sum(accuracy) / len(accuracy)

total_loss, acc = loss()
print(total_loss, acc)
# optimization
for k in range(100):

    # forward
    total_loss, acc = loss()

    # backward
    model.zero_grad()
    total_loss.backward()

    # update (sgd)
    learning_rate = 1.0 - 0.9*k/100
    for p in model.parameters():
        p.data -= learning_rate * p.grad

    if k % 1 == 0:
        print(f"step {k} loss {total_loss.data}, accuracy {acc*100}%")
"""

ON_POLYGRAD = {  # the import lines a user changes; nothing else
    "from micrograd.engine import": "from polygrad.micrograd.engine import",
    "from micrograd.nn import": "from polygrad.micrograd.nn import",
    "from micrograd import nn": "from polygrad.micrograd import nn",
}
# micrograd's notebook draws its data with scikit-learn; without it, the same draws from numpy
NO_SKLEARN = {"from sklearn.datasets import make_moons, make_blobs": "from tests.unit._sklearn_moons import make_moons"}


def run(source: str, imports: dict[str, str], steps: int | None = None) -> str:
    """Run ``source`` with its import lines rewritten by ``imports``; return what it printed."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        for old, new in imports.items():
            if line.startswith(old):
                lines[i] = line.replace(old, new)
    program = "\n".join(lines)
    if not HAVE_SKLEARN:
        for old, new in NO_SKLEARN.items():
            program = program.replace(old, new)
    if steps is not None:  # only for running micrograd itself, whose 100 steps take minutes
        program = program.replace("for k in range(100):", f"for k in range({steps}):")
    assert "micrograd" not in program.replace("polygrad.micrograd", "") or imports is not ON_POLYGRAD
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(program, "<micrograd program>", "exec"), {"__name__": "__main__"})
    return out.getvalue()


def steps_of(text: str) -> list[tuple[float, str]]:
    return [(float(m.group(1)), m.group(2)) for m in re.finditer(r"^step \d+ loss (\S+), accuracy (\S+)%$",
                                                                  text, re.MULTILINE)]


def assert_same_output(ours: str, theirs: str) -> None:
    """Same printed lines; numbers may differ in the last bits (see polygrad.engine.value: micrograd sums a
    node's gradient contributions in ``set`` order, which differs between two micrograd runs too)."""
    a, b = ours.splitlines(), theirs.splitlines()
    assert len(a) == len(b)
    for x, y in zip(a, b):
        xs, ys = re.split(r"(-?\d+\.\d+(?:e-?\d+)?)", x), re.split(r"(-?\d+\.\d+(?:e-?\d+)?)", y)
        assert xs[::2] == ys[::2], (x, y)  # the words, the ints, the accuracies' text around numbers
        for u, v in zip(xs[1::2], ys[1::2]):
            assert float(u) == pytest.approx(float(v), rel=1e-12, abs=1e-15), (x, y)


def test_readme_example_prints_micrographs_figures():
    out = run(README_EXAMPLE, ON_POLYGRAD)
    assert out.splitlines() == ["24.7041", "138.8338", "645.5773", "ReLUNeuron(2) 3"]


@pytest.mark.skipif(not HAVE_MICROGRAD, reason="micrograd not installed (pip install micrograd)")
def test_readme_example_matches_installed_micrograd():
    assert run(README_EXAMPLE, ON_POLYGRAD) == run(README_EXAMPLE, {})


def test_moons_demo_prints_the_notebooks_numbers():
    out = run(MOONS_DEMO, ON_POLYGRAD)
    head = out.splitlines()[:3]
    assert head[0].startswith("MLP of [Layer of [ReLUNeuron(2), ") and head[0].endswith("Layer of [LinearNeuron(16)]]")
    assert head[1:] == ["number of parameters 337", "Value(data=0.8958441028683222, grad=0) 0.5"]
    ours, recorded = steps_of(out), steps_of(RECORDED.read_text())
    assert len(ours) == len(recorded) == 100
    for (loss, acc), (rec_loss, rec_acc) in zip(ours, recorded):
        assert acc == rec_acc
        assert loss == pytest.approx(rec_loss, rel=1e-12)
    assert ours[-1][1] == "100.0"


@pytest.mark.skipif(not HAVE_MICROGRAD, reason="micrograd not installed (pip install micrograd)")
def test_moons_demo_matches_installed_micrograd_first_steps():
    # micrograd's own engine needs minutes for the 100 steps (its closures make every node a
    # reference cycle); the first steps already exercise init, data, forward, backward and update
    assert_same_output(run(MOONS_DEMO, ON_POLYGRAD, steps=2), run(MOONS_DEMO, {}, steps=2))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MICROGRAD, reason="micrograd not installed (pip install micrograd)")
def test_moons_demo_matches_installed_micrograd_all_steps():
    assert_same_output(run(MOONS_DEMO, ON_POLYGRAD), run(MOONS_DEMO, {}))


def test_mixing_a_foreign_autograd_value_is_a_type_error_not_nesting():
    from polygrad.micrograd.engine import Value

    class Foreign:  # what micrograd's Value looks like to polygrad: an object with .data
        def __init__(self, data):
            self.data = data

        def __radd__(self, other):
            return Foreign(other)

        __rmul__ = __rsub__ = __rtruediv__ = __rpow__ = __radd__

    for combine in (lambda v, f: v + f, lambda v, f: v * f, lambda v, f: v - f, lambda v, f: v / f,
                    lambda v, f: v ** f, lambda v, f: f - v, lambda v, f: f / v, lambda v, f: v.maximum(f),
                    lambda v, f: Value.sum_of([v, f]), lambda v, f: Value(f)):
        with pytest.raises(TypeError, match="Foreign.*Values and numbers only"):
            combine(Value(1.0), Foreign(2.0))
    with pytest.raises(TypeError, match="list"):
        Value(1.0) + [1.0]
    # numbers of every kind still work, and stay numbers
    import numpy as np
    for c in (2, 2.0, True, np.float32(2.0), np.int64(2)):
        assert type((Value(1.0) + c).data) is not Value


@pytest.mark.skipif(not HAVE_MICROGRAD, reason="micrograd not installed (pip install micrograd)")
def test_mixing_with_micrographs_value_raises():
    import micrograd.engine
    from polygrad.micrograd.engine import Value
    with pytest.raises(TypeError, match=r"micrograd\.engine\.Value"):
        Value(1.0) + micrograd.engine.Value(2.0)


def test_micrograd_nn_draws_micrographs_random_stream():
    import random

    from polygrad.micrograd.nn import MLP
    random.seed(7)
    expected = [random.uniform(-1, 1) for _ in range(3 * 4)]
    random.seed(7)
    m = MLP(3, [4, 1])
    weights = [w.data for neuron in m.layers[0].neurons for w in neuron.w]
    assert weights == expected
    assert [n.b.data for n in m.layers[0].neurons] == [0, 0, 0, 0]
    assert len(m.parameters()) == 4 * 4 + 5
    out = m([1.0, -2.0, 0.5])
    assert out.__class__.__name__ == "Value"  # one output neuron: the Value itself, as micrograd
    out.backward()
    m.zero_grad()
    assert all(p.grad == 0 for p in m.parameters())
