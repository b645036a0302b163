"""Many small parameters' updates as one: the same :class:`~polygrad.optim.optimizer.Rule` run once
over their concatenated arrays.

An optimizer whose update reads only the element it writes (``elementwise_update = True``: Adam,
AdamW, SGD) gives each element the same bits whether its parameter is updated alone or as a slice
of a longer array -- the rule is ``+ - * /`` and sqrt with the same Python numbers, each correctly
rounded per element.  A model of many small parameters (GIN: 17 of at most 1,024 elements) spends
most of an update in the per-call cost of ~13 array operations per parameter; concatenated, one
group of parameters sharing a rule costs 13 operations plus the concatenations.  The new
parameters and state arrays are views of the concatenated results (nothing is written in place,
as on the one-parameter path).

Except a NaN's bits: where both operands of a ``+`` or ``*`` are NaN, numpy keeps one or the
other depending on where the element falls in the array (vector body or scalar tail), so a
``pg.compile`` capture records the concatenated update (:class:`Together`) rather than one call
per parameter, and a replay gives eager's NaN bits.

Only plain numpy arrays of one dtype, below the blocked update's size (those are updated in blocks
on polygrad's threads instead), and whose state arrays the rule reads are numpy arrays of the
parameter's shape and dtype, are put together; tests/unit/test_optim_multi_tensor.py checks the
bits against the one-parameter path.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Apart", "Together", "member_args", "rule_key", "run_together", "together"]


def rule_key(rule: Any, x: np.ndarray, g: Any, state: dict) -> tuple | None:
    """What parameters must share to be updated together under ``rule`` (None: update this one
    alone): the rule itself (function, attrs, numbers, state names) and the dtype, with the
    gradient and every state array the rule reads numpy arrays of ``x``'s shape and dtype."""
    if type(g) is not np.ndarray or g.dtype != x.dtype or g.shape != x.shape:
        return None
    for name in rule.reads:
        v = state.get(name)
        if type(v) is not np.ndarray or v.dtype != x.dtype or v.shape != x.shape:
            return None
    try:
        key = (rule.fn, tuple(sorted(rule.attrs.items())), rule.numbers, rule.reads, rule.writes, x.dtype)
        hash(key)
    except TypeError:  # an unhashable number or attribute: nothing to group by
        return None
    return key


class Together:
    """``fn`` (a :class:`~polygrad.optim.optimizer.Rule`'s function) over the concatenation of
    several parameters, as one callable of their arrays: the arguments are each member's ``x``,
    ``g`` and ``reads`` state arrays in turn (member after member), then the rule's numbers; the
    results each member's new ``x`` and ``writes`` state arrays in turn (views of the concatenated
    results, in the member's shape), or None when a result is not one array of the
    concatenation's shape.  The eager step and a ``pg.compile`` capture (which records it as one
    ``Call``, so a replay runs it again) both call it: numpy's ``+`` and ``*`` of two NaNs keep one
    operand's NaN or the other's depending on where the element falls in the array (vector body
    or tail), so only the same concatenation gives the same NaN bits.  Equal for equal rules and
    shapes (two captures of one step compare equal)."""

    def __init__(self, fn: Callable[..., tuple], shapes: tuple, reads: int, writes: int):
        self.fn, self.shapes, self.reads, self.writes = fn, shapes, reads, writes
        self.pieces = _pieces(shapes)
        # what a program listing or a backend's trace names a Call by
        self.__name__ = f"together_{getattr(fn, '__name__', 'rule')}"
        self.__qualname__ = f"together_{getattr(fn, '__qualname__', 'rule')}"

    def _key(self) -> tuple:
        return (self.fn, self.shapes, self.reads, self.writes)

    def __eq__(self, other: object) -> bool:
        return type(other) is Together and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Together({self.fn!r}, shapes={self.shapes})"

    def __call__(self, *args: Any, **attrs: Any) -> tuple | None:
        k, width = len(self.shapes), 2 + self.reads
        end = k * width
        numbers = args[end:]
        if len(numbers) == 1 and type(numbers[0]) is Apart:
            return self._apart(args[:end], numbers[0].numbers, attrs)
        # column j is every member's j-th array: a strided slice of the arguments
        columns = [args[j:end:width] for j in range(width)]
        views = _concatenated(self.fn, columns, numbers, attrs, self.writes, self.pieces)
        if views is None:
            return None
        return tuple([a for member in zip(*views) for a in member])

    def _apart(self, arrays: tuple, numbers: list, attrs: dict) -> tuple | None:
        """The members updated as eager updates them once their numbers differ: those with equal
        numbers as one concatenation (in eager's order), a member whose numbers no other shares
        alone, through ``fn`` itself (:meth:`Optimizer._apply_rule`'s call); results in the
        members' order, as the concatenated call returns them."""
        width = 2 + self.reads
        batches: dict = {}  # key -> (numbers, members)
        for m, nums in enumerate(numbers):  # NaN numbers are distinct objects: a batch each, as eager's keys
            try:
                batches.setdefault(nums, (nums, []))[1].append(m)
            except TypeError:  # an unhashable number (an array set as lr): eager's rule_key updates it alone
                batches[object()] = (nums, [m])
        results: list = [None] * len(numbers)
        for nums, members in batches.values():
            views = None
            if len(members) > 1:
                columns = [[arrays[m * width + j] for m in members] for j in range(width)]
                views = _concatenated(self.fn, columns, nums, attrs, self.writes,
                                      _pieces(tuple(self.shapes[m] for m in members)))
            if views is not None:
                for m, member in zip(members, zip(*views)):
                    results[m] = member
                continue
            for m in members:
                out = self.fn(*arrays[m * width:(m + 1) * width], *nums, **attrs)
                if len(out) != 1 + self.writes:
                    return None
                results[m] = out
        return tuple([a for member in results for a in member])


class Apart:
    """The numbers of a :class:`Together`'s members once they differ (one tuple per member): the
    call then updates them as eager does, apart (:meth:`Together._apart`)."""

    __slots__ = ("numbers",)

    def __init__(self, numbers: list):
        self.numbers = numbers


def together(rule: Any, shapes: Sequence[tuple]) -> Together:
    """The :class:`Together` of ``rule``'s function for members of ``shapes``."""
    return Together(rule.fn, tuple(tuple(s) for s in shapes), len(rule.reads), len(rule.writes))


def member_args(rule: Any, members: Sequence[tuple[np.ndarray, np.ndarray, dict]]) -> list:
    """:class:`Together`'s array arguments for ``members`` (each ``(x, g, state)``)."""
    return [a for x, g, st in members for a in (x, g, *[st[name] for name in rule.reads])]


@functools.lru_cache(maxsize=256)
def _pieces(shapes: tuple) -> tuple:
    """Each member's ``(start, stop, shape)`` in the concatenation of members of ``shapes``;
    ``shape`` None where the slice already has the member's shape (one dimension)."""
    pieces = []
    lo = 0
    for shape in shapes:
        hi = lo + math.prod(shape)
        pieces.append((lo, hi, None if len(shape) == 1 else shape))
        lo = hi
    return tuple(pieces)


def _concatenated(fn: Callable[..., tuple], columns: list, numbers: Sequence, attrs: dict, writes: int,
                  pieces: tuple) -> list | None:
    """``fn`` on each column of arrays concatenated (flattened, in C order): for each of its
    results, each member's slice of it in the member's shape (``pieces``: :func:`_pieces`), or
    None when they are not ``1 + writes`` arrays of the concatenation's shape.  The one place the
    concatenated update is computed, for the eager step (:func:`run_together`) and a replay
    (:class:`Together`)."""
    # axis=None flattens each member in C order (a Fortran-ordered one is copied), as reshape(-1)
    flat = [np.concatenate(column, axis=None) for column in columns]
    out = fn(*flat, *numbers, **attrs)
    size = flat[0].shape
    if len(out) != 1 + writes or any(type(a) is not np.ndarray or a.shape != size for a in out):
        return None
    return [[a[lo:hi] if shape is None else a[lo:hi].reshape(shape) for lo, hi, shape in pieces] for a in out]


def run_together(rule: Any, members: Sequence[tuple[np.ndarray, np.ndarray, dict]]) -> list[tuple] | None:
    """``rule`` over the concatenation of ``members`` (each ``(x, g, state)``), split back: for each
    member, its new ``x`` followed by its new state arrays named ``rule.writes`` (views of the
    concatenated results, in the member's shape).  None when a result is not one array of the
    concatenation's shape (the rule is pure: the caller updates each member alone instead)."""
    columns = [[x for x, _, _ in members], [g for _, g, _ in members],
               *[[st[name] for _, _, st in members] for name in rule.reads]]
    views = _concatenated(rule.fn, columns, rule.numbers, rule.attrs, len(rule.writes),
                          _pieces(tuple([x.shape for x, _, _ in members])))
    if views is None:
        return None
    return list(zip(*views))
