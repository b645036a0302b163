"""What a ``pg.compile(pure=True)`` replay of an optimizer's recorded updates computes again on every
call, from the hyper-parameters and state it then finds: each update's numbers (learning rate,
bias corrections; for a concatenation's members, :class:`TogetherNumbers`, which has them updated
apart once they differ), and the checks that the capture's assumptions still hold -- the same
rule (:class:`Numbers`), the same state dtypes, and eager's grouping of the step's small
parameters (:class:`GroupingCheck`).  A failed check raises
:class:`~polygrad.compile.StaleCapture`: the replay is a fault, the call runs eagerly and the
step is captured again."""
from __future__ import annotations

from typing import Any

from polygrad.compile import StaleCapture

from .multi_tensor import Apart, rule_key

__all__ = ["GroupingCheck", "Numbers", "TogetherNumbers"]


class Numbers:
    """A replay's numbers for one parameter's recorded update: the rule again, from the
    hyper-parameters and state found now; a rule that changed shape (momentum turned on, a new
    state) is a fault, and the call runs eagerly."""

    __slots__ = ("opt", "index", "key", "rule")

    def __init__(self, opt: Any, index: int, key: int, rule: Any):
        self.opt, self.index, self.key, self.rule = opt, index, key, rule

    def __call__(self) -> tuple:
        group = self.opt.param_groups[self.index]
        return self.rule_now(group["lr"] * self.opt.lr_factor()).numbers

    def rule_now(self, lr: float, memo: dict | None = None) -> Any:
        """The parameter's rule at learning rate ``lr`` (its group's, scheduled), checked against
        the captured one; ``memo``: rules already computed in this call for parameters of the same
        group whose state the rule reads the same (``Optimizer._rule_inputs``)."""
        opt = self.opt
        try:
            state = opt.state[self.key]
            inputs = _rule_inputs(opt) if memo is not None else None
            if inputs is None or memo is None:
                rule = opt._rule(lr, opt.param_groups[self.index], state)
            else:
                at = (id(opt), self.index, inputs(state))
                rule = memo.get(at)
                if rule is None:
                    rule = opt._rule(lr, opt.param_groups[self.index], state)
                    if not _has_nan(rule.numbers):
                        # shared only without NaN: eager computes a rule per parameter, and NaN
                        # numbers (an lr set to nan) then differ between parameters (NaN != NaN),
                        # so eager updates each alone; one shared tuple would compare equal
                        memo[at] = rule
        except KeyError:
            raise StaleCapture(f"{type(opt).__name__}: a parameter's state was cleared since the step was "
                               "captured") from None
        seen = self.rule
        if rule.fn is not seen.fn or rule.attrs != seen.attrs or rule.reads != seen.reads or rule.writes != seen.writes:
            raise StaleCapture(f"{type(opt).__name__}: the update rule changed since the step was captured "
                               "(a hyper-parameter that selects it was set)")
        return rule


#: optimizer class -> whether its ``_rule_inputs`` describes its ``_rule`` (see :func:`_rule_inputs`)
_DECLARED: dict[type, bool] = {}


def _rule_inputs(opt: Any) -> Any:
    """``opt._rule_inputs`` where the class that defines ``_rule`` declares it too (a subclass that
    overrides ``_rule`` alone reads what it likes: its rules are computed for every parameter)."""
    cls = type(opt)
    declared = _DECLARED.get(cls)
    if declared is None:
        def definer(name: str) -> Any:
            return next((c for c in cls.__mro__ if name in c.__dict__), None)
        declared = _DECLARED[cls] = (getattr(cls, "_rule_inputs", None) is not None
                                     and definer("_rule") is definer("_rule_inputs"))
    return opt._rule_inputs if declared else None


def _has_nan(numbers: tuple) -> bool:
    """Whether a rule's numbers hold a NaN (or something not comparable to itself as a bool)."""
    for n in numbers:
        try:
            if n != n:
                return True
        except Exception:  # noqa: BLE001 - an array number: not shared
            return True
    return False


def _rules_now(parts: list[Numbers]) -> list:
    """Each part's rule now (:meth:`Numbers.rule_now`): every optimizer's schedule asked once, and
    one rule per group and state inputs where the optimizer declares them."""
    lrs: dict[tuple[int, int], float] = {}
    memo: dict = {}
    rules = []
    for part in parts:
        at = (id(part.opt), part.index)
        lr = lrs.get(at)
        if lr is None:
            lr = lrs[at] = part.opt.param_groups[part.index]["lr"] * part.opt.lr_factor()
        rules.append(part.rule_now(lr, memo))
    return rules


class TogetherNumbers:
    """A replay's numbers for a recorded update of several parameters as one concatenation: each
    member's (:class:`Numbers`).  Eager groups only parameters whose rules have the same numbers:
    where they differ now, the numbers come as :class:`~polygrad.optim.multi_tensor.Apart`, and
    the call updates the members as eager then does (those still equal together, the others
    alone)."""

    __slots__ = ("parts", "dtypes", "reads")

    def __init__(self, parts: list[Numbers]):
        self.parts = parts
        self.reads = any(part.rule.reads for part in parts)
        self.dtypes = self._state_dtypes()  # the concatenation's dtype follows its members' states

    def _state_dtypes(self) -> list:
        if not self.reads:
            return []
        return [tuple(getattr(part.opt.state.get(part.key, {}).get(name), "dtype", None) for name in part.rule.reads)
                for part in self.parts]

    def __call__(self) -> tuple:
        rules = _rules_now(self.parts)
        first = rules[0].numbers
        if self._state_dtypes() != self.dtypes:  # a state array set to another dtype would promote them all
            raise StaleCapture(f"{type(self.parts[0].opt).__name__}: a parameter's optimizer state "
                               "changed dtype since the step was captured")
        for rule in rules[1:]:
            if rule.numbers != first:
                # eager now updates them apart (its keys differ): the call runs them so (Apart),
                # rather than faulting -- a fault after a scheduler's step in the step could not
                # run the call eagerly and stopped the training
                return (Apart([r.numbers for r in rules]),)
        return first


def partition(keys: list) -> tuple:
    """Which parameters eager updates together, from their :func:`~polygrad.optim.multi_tensor.rule_key`
    s in step order: for each, the position of the first parameter sharing its key (its own when
    its key is None: updated alone)."""
    first: dict = {}
    return tuple([i if key is None else first.setdefault(key, i) for i, key in enumerate(keys)])


class GroupingCheck:
    """A replay's check that eager would group a step's small parameters as the capture did.

    Eager puts the parameters whose rules share a key (the same function, attributes, numbers and
    dtype: :func:`~polygrad.optim.multi_tensor.rule_key`) into one concatenated update, and NaN
    bits depend on the concatenation.  Parameters captured with different numbers (two groups'
    learning rates) whose numbers become equal later (``ReduceLROnPlateau`` at ``min_lr``, a
    schedule decaying to 0, a user setting equal rates) are updated together by eager while the
    replay would run the captured separate calls: the check raises
    :class:`~polygrad.compile.StaleCapture`, so the call runs eagerly and is captured again.  (A
    captured concatenation whose members' numbers part is caught by :class:`TogetherNumbers`.)

    ``parts``: each eligible parameter's :class:`Numbers`, in step order; ``leaves``: their
    leaves (whose storage the key reads); ``grads_fit``: whether each one's gradient could be
    concatenated with it at capture (numpy, same shape and dtype: a replay's gradients are its
    own, so this cannot change); ``captured``: the :func:`partition` the capture used.  Recorded
    where the capture has two groups or more, or where another optimizer stepped before this
    one in the step (the check then runs before that step: ``_Recorder.check``).  Not recorded
    where a host call that cannot be repeated (a scheduler stepped inside the step) runs before
    the point it would check at: a fault there would stop the training, so the replay keeps the
    captured grouping (the same finite values; NaN payload and sign bits may differ from eager)."""

    __slots__ = ("parts", "leaves", "grads_fit", "captured")

    def __init__(self, parts: list, leaves: list, grads_fit: list, captured: tuple):
        self.parts, self.leaves, self.grads_fit, self.captured = parts, leaves, grads_fit, captured

    def __call__(self) -> tuple:
        keys = []
        for part, rule, leaf, fits in zip(self.parts, _rules_now(self.parts), self.leaves, self.grads_fit):
            x = leaf._data
            keys.append(rule_key(rule, x, x if fits else None, part.opt.state[part.key]))
        if partition(keys) != self.captured:
            raise StaleCapture(f"{type(self.parts[0].opt).__name__}: the parameters eager updates together "
                               "changed since the step was captured (update numbers became equal or different)")
        return ()
